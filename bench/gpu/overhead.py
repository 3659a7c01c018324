"""What allocd costs a job's step (issue 42): each workload in each mode,
interleaved rounds in one call, warm-up excluded, CUDA events.

    python bench/gpu/overhead.py --allocd BIN --socket SOCK --out DIR
        [--rounds 8] [--workloads seq2seq,resnet50,generate]
        [--modes native,native-b,transparent,run,advise]   (also: preload)

For each workload it starts one warm worker per mode (overhead_job.py; the
`run` mode is the unchanged script under `allocd run`; `preload`, transparent
mode with the interposer preloaded as `allocd run` preloads it), all pinned to the
same cores (--cpus; the daemon runs on others): only one worker steps at a
time, so each mode's steps run on the very cores native's ran on (cores of
a worker's own, --separate-cores, put a core's speed into its mode's
ratio).
Then for each round it asks every worker in turn, in an order rotated each
round, for a short turn of timed steps: no two workers step at once, and
the drift of the host (these steps wait on the CPU's launches, and a
machine's CPU speed moves by tens of percent within seconds) falls on every
mode alike within a round. A mode's ratio in a round is its median step
over the native worker's median step in that round; the summary is the
median of the rounds' ratios and their spread (min, max, interquartile
range), and the ratio of the medians of all timed steps, on the host's
clock (what the job waits) and on the GPU's (CUDA events). Each turn is
bracketed by a fixed CPU probe on the job's thread (--job-core: all on one
core): the speed-matched ratio is the
same median over the rounds in which the mode's turn and native's ran on a
core of the same speed (both probes of each turn, and the two turns, within
--match of each other). Where the CPU has counters, the instructions per
step of the job's thread and of the whole process, against native's: the
work allocd adds, which no change of the host's speed moves. With it, the
CPU time per step of each worker's threads: the job's own, allocd's (by
thread) and the rest. Then each worker's steps under PyTorch's profiler,
the top operators by self CPU time. Writes DIR/overhead.json and prints the
tables.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Timed steps in one turn: short turns interleave the modes finely.
STEPS = {"seq2seq": 4, "resnet50": 10, "generate": 2}
BOOTSTRAP_RESAMPLES = 2000


def cpu_sets(cpus, n):
    """`cpus` split into `n` disjoint sets of equal size (the rest unused)."""
    per = len(cpus) // n
    if per == 0:
        sys.exit(f"--cpus: {len(cpus)} cores cannot give each of {n} workers one of its own")
    return [cpus[i * per:(i + 1) * per] for i in range(n)]


def parse_cpus(text):
    """A CPU list as taskset takes it: 0-3,8,10-11."""
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def start(a, workload, mode, cpus):
    job_mode = {"run": "native", "native-b": "native", "preload": "transparent"}.get(mode, mode)
    cmd = [sys.executable, os.path.join(HERE, "overhead_job.py"), "--workload", workload,
           "--mode", job_mode, "--socket", a.socket,
           ] + (["--job-core", str(a.job_core)] if a.job_core is not None else [])
    if mode == "run":
        cmd = [a.allocd, "run", "--socket", a.socket, "--job", f"overhead-{workload}-run", "--"] + cmd
    # PyTorch's intra-op threads, one per core, which sleep when idle rather
    # than spin on the cores the next worker steps on (the same in every mode).
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(len(cpus)),
               OMP_WAIT_POLICY="PASSIVE")
    if mode == "preload":
        # transparent's enable(), with the interposer loaded at the process's
        # start as `allocd run` loads it rather than dlopen()ed by enable():
        # what the way it is loaded costs, apart from all else.
        from allocd._bindings import INTERPOSE_LIBRARY, library_path
        env["LD_PRELOAD"] = ":".join(filter(None, [library_path(INTERPOSE_LIBRARY),
                                                   env.get("LD_PRELOAD")]))
    worker = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return worker


def read_json(worker, what):
    for line in worker.stdout:
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what}: the worker ended (exit {worker.wait()})")


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def probe_speed(turn, tolerance):
    """The turn's probe (its two probes' mean), or None where the core's speed
    moved by more than `tolerance` within the turn."""
    before, after = turn["probe_ms"]
    if max(before, after) > min(before, after) * (1 + tolerance):
        return None
    return (before + after) / 2


def speed_matched(rounds, mode, clock, tolerance):
    """The mode's ratios to native in the rounds where both turns ran at one
    speed (probe_speed within `tolerance` of each other)."""
    ratios = []
    for row in rounds:
        ours, theirs = probe_speed(row[mode], tolerance), probe_speed(row["native"], tolerance)
        if ours is None or theirs is None or \
                max(ours, theirs) > min(ours, theirs) * (1 + tolerance):
            continue
        ratios.append(row[mode][f"{clock}_ms_median"] / row["native"][f"{clock}_ms_median"])
    return ratios


def spread(ratios):
    """Median, quartiles and range of `ratios` (None where there are none)."""
    if not ratios:
        return None
    q1, q3 = quartiles(ratios)
    # A 95% interval of the median: the rounds resampled (a fixed seed, so
    # that one run's file always says the same).
    resample = random.Random(0)
    medians = sorted(statistics.median(resample.choices(ratios, k=len(ratios)))
                     for _ in range(BOOTSTRAP_RESAMPLES))
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "q1": q1, "q3": q3, "ratios": ratios,
            "ci95": (medians[int(0.025 * len(medians))], medians[int(0.975 * len(medians)) - 1])}


def print_table(title, columns, rows):
    """A markdown table after `title`; `columns`: (heading, right-aligned)."""
    print(f"\n{title}\n")
    print("| " + " | ".join(heading for heading, _ in columns) + " |")
    print("|" + "|".join("---:" if right else "---" for _, right in columns) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocd", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--cpus", default=None,
                   help="cores for the workers (taskset's list syntax; default: every core "
                        "this process may use)")
    p.add_argument("--separate-cores", action="store_true",
                   help="split --cpus evenly among the workers instead of sharing them")
    p.add_argument("--job-core", type=int, default=None,
                   help="the core every worker's own thread runs on (default: any of its cores)")
    p.add_argument("--match", type=float, default=0.03,
                   help="speed-matched rounds: probes within this fraction of each other")
    p.add_argument("--workloads", default="seq2seq,resnet50,generate")
    p.add_argument("--modes", default="native,native-b,transparent,run,advise",
                   help="native first (the ratios' base); native-b is a second native worker, "
                        "the method's own noise: its ratio should hold 1 within its interval")
    p.add_argument("--profile-steps", type=int, default=5,
                   help="after the rounds, this many steps of each worker under PyTorch's "
                        "profiler (DIR/profile-WORKLOAD-MODE.txt; 0: none)")
    a = p.parse_args()
    modes = a.modes.split(",")
    if modes[0] != "native":
        sys.exit("--modes: native must come first (the ratios' base)")
    os.makedirs(a.out, exist_ok=True)
    cpus = parse_cpus(a.cpus) if a.cpus else sorted(os.sched_getaffinity(0))
    pinned = dict(zip(modes, cpu_sets(cpus, len(modes)) if a.separate_cores
                      else [cpus] * len(modes)))
    print("workers' cores: " + ", ".join(f"{m} {c[0]}-{c[-1]}" for m, c in pinned.items()),
          flush=True)
    results = {}
    for workload in a.workloads.split(","):
        workers = {m: start(a, workload, m, pinned[m]) for m in modes}
        # One at a time would also do; warming them together saves the call's time.
        for m, w in workers.items():
            ready = read_json(w, f"{workload} {m}")
            if m == "run" and not ready.get("under_allocd_run"):
                sys.exit(f"{workload}: the run-mode worker is not under `allocd run`")
        rounds = []
        for r in range(a.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            row = {}
            for m in order:
                workers[m].stdin.write(f"{STEPS[workload]}\n")
                workers[m].stdin.flush()
                row[m] = read_json(workers[m], f"{workload} {m} round {r}")
            rounds.append(row)
            print(f"{workload} round {r}: " + ", ".join(
                f"{m} {row[m]['host_ms_median']:.2f} ms" for m in modes), flush=True)
        if a.profile_steps:
            for m in modes:
                path = os.path.join(a.out, f"profile-{workload}-{m}.txt")
                workers[m].stdin.write(f"profile {a.profile_steps} {path}\n")
                workers[m].stdin.flush()
                read_json(workers[m], f"{workload} {m} profile")
        for w in workers.values():
            w.stdin.close()
            w.wait(timeout=60)
        def pooled(m, clock):
            return statistics.median([t for row in rounds for t in row[m][f"{clock}_ms"]])

        summary = {}
        for m in modes[1:]:
            entry = {}
            for clock in ("host", "gpu"):
                ratios = [row[m][f"{clock}_ms_median"] / row["native"][f"{clock}_ms_median"]
                          for row in rounds]
                entry[clock] = {**spread(ratios),
                                "pooled": pooled(m, clock) / pooled("native", clock),
                                "matched": spread(speed_matched(rounds, m, clock, a.match))}
            summary[m] = entry
        cpu, advisor, instructions = {}, {}, {}
        for m in modes:
            steps = sum(row[m]["steps"] for row in rounds)
            total = {}
            for row in rounds:
                for group, ms in row[m]["cpu_ms_by_thread"].items():
                    total[group] = total.get(group, 0.0) + ms
            cpu[m] = {group: ms / steps for group, ms in sorted(total.items())}
            work = [(row[m]["instructions"], row["native"]["instructions"], row[m]["steps"],
                     row["native"]["steps"]) for row in rounds
                    if row[m].get("instructions") and row["native"].get("instructions")]
            if work and m != "native":
                instructions[m] = {
                    "job": spread([ours["job"] / n / (theirs["job"] / k)
                                   for ours, theirs, n, k in work]),
                    "process": spread([sum(ours.values()) / n / (sum(theirs.values()) / k)
                                       for ours, theirs, n, k in work]),
                    "allocd_per_step": statistics.median(
                        [sum(v for g, v in ours.items() if g.startswith("allocd")) / n
                         for ours, _, n, _ in work]),
                    "scope": rounds[0][m].get("instructions_scope")}
            turns = [row[m] for row in rounds if row[m].get("advisor")]
            if turns:
                parts = {k: sum(t["advisor"][k] for t in turns) for k in turns[0]["advisor"]}
                # Over the turn's untimed first step too (advisor_steps), where
                # the allocator-state read falls.
                host_s = sum(sum(t["host_ms"]) + t.get("warm_host_ms", 0.0) for t in turns) / 1e3
                counted = sum(t.get("advisor_steps", t["steps"]) for t in turns)
                advisor[m] = {"rounds_per_s": parts.pop("rounds") / host_s,
                              "ms_per_step": {k: v * 1e3 / counted for k, v in parts.items()}}
        turns = [t for row in rounds for t in row.values() if t.get("steal_ticks") is not None]
        steal = (sum(t["steal_ticks"] for t in turns)
                 / (os.sysconf("SC_CLK_TCK") * sum(sum(t["host_ms"]) for t in turns) / 1e3)
                 if turns else None)
        results[workload] = {"rounds": rounds, "summary": summary, "steal_cpus": steal,
                             "native_host_ms_median": pooled("native", "host"),
                             "cpu_ms_per_step": cpu, "advisor": advisor, "instructions": instructions,
                             "cores": pinned}
        with open(os.path.join(a.out, "overhead.json"), "w") as f:  # what a cut run keeps
            json.dump(results, f, indent=1)
    def cell(s):
        return (f"{s['median']:.4f}x, 95% {s['ci95'][0]:.4f}-{s['ci95'][1]:.4f} "
                f"[IQR {s['q1']:.4f}-{s['q3']:.4f}] ({s['min']:.4f}-{s['max']:.4f})")

    rows = []
    for workload, r in results.items():
        for m, entry in r["summary"].items():
            h, g = entry["host"], entry["gpu"]
            matched = h["matched"]
            rows.append([workload, f"{r['native_host_ms_median']:.2f}", m,
                         f"{cell(matched)}, {len(matched['ratios'])} of {a.rounds}" if matched
                         else f"none of {a.rounds}",
                         cell(h), f"{h['pooled']:.4f}x", cell(g), f"{g['pooled']:.4f}x"])
    print_table(f"{a.rounds} rounds. Ratio to native: the median of the rounds' ratios, its 95% "
                f"interval (bootstrap over the rounds) [IQR] (min-max), and the ratio of all "
                f"timed steps' medians (pooled). native-b, a second native worker, is the "
                f"method's own noise.",
                [("workload", False), ("native step (host, ms)", True), ("mode", False),
                 ("speed-matched rounds (host clock), of all", False),
                 ("all rounds (host clock)", False), ("pooled", True),
                 ("all rounds (CUDA events)", False), ("pooled", True)], rows)

    print()
    for workload, r in results.items():
        if r["steal_cpus"] is not None:
            print(f"{workload}: the hypervisor took {r['steal_cpus']:.2f} CPUs of this guest, on "
                  f"average, during the timed steps (steal time)")

    rows = []
    for workload, r in results.items():
        native = r["cpu_ms_per_step"]["native"]
        for m, groups in r["cpu_ms_per_step"].items():
            ours = {g: ms for g, ms in groups.items() if g.startswith("allocd")}
            others = {g[len("other:"):]: ms for g, ms in groups.items()
                      if g.startswith("other")}
            above = sorted(((ms - native.get("other:" + g, 0.0), g) for g, ms in others.items()),
                           reverse=True)[:3]
            rows.append([workload, m, f"{groups.get('job', 0.0):.2f}",
                         ", ".join(f"{g} {ms:.3f}" for g, ms in ours.items()) or "-",
                         f"{sum(others.values()):.2f}",
                         "-" if m == "native" else
                         ", ".join(f"{g} {delta:+.3f}" for delta, g in above)])
    print_table("CPU time per step by thread (ms): the job's own thread, allocd's threads, the rest "
                "(PyTorch's, CUDA's, gRPC's), and the other threads whose CPU time per step is "
                "most above native's.",
                [("workload", False), ("mode", False), ("job", True),
                 ("allocd (by thread)", False), ("other", True),
                 ("other threads, most above native's", False)], rows)

    if any(r["instructions"] for r in results.values()):
        print_table("Instructions per step against native's (the CPU's counters): the job's "
                    "thread, the whole process, median [IQR] of the rounds; and allocd's "
                    "threads' per step.",
                    [("workload", False), ("mode", False), ("job thread", False),
                     ("process", False), ("allocd's threads (per step)", True),
                     ("counted", False)],
                    [[workload, m, cell(e["job"]), cell(e["process"]),
                      f"{e['allocd_per_step'] / 1e6:.2f} M", e["scope"]]
                     for workload, r in results.items() for m, e in r["instructions"].items()])
    else:
        print("\nNo instruction counts: this CPU has no counters this process may read.")

    parts = ("events", "poll", "stats", "session", "step_hook", "state")
    print_table("The advisor's rounds in the timed turns: rounds per second of steps, and its "
                "time per step by part (ms; 'stats' is within 'poll'); on the job's own "
                "thread, allocd's hook after each optimizer step ('state', within it: "
                "reading the allocator's state, every ALLOCD_STATE_PERIOD_S).",
                [("workload", False), ("mode", False), ("rounds/s", True)]
                + [(part, True) for part in parts],
                [[workload, m, f"{e['rounds_per_s']:.1f}"]
                 + [f"{e['ms_per_step'].get(part, 0.0):.3f}" for part in parts]
                 for workload, r in results.items() for m, e in r["advisor"].items()])

if __name__ == "__main__":
    main()
