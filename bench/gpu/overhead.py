"""What allocd costs a job's step (issue 42): each workload in each mode,
interleaved rounds in one call, warm-up excluded, CUDA events.

    python bench/gpu/overhead.py --allocd BIN --socket SOCK --out DIR
        [--rounds 8 | --alternate 150] [--workloads seq2seq,resnet50,generate]
        (also: churn, resnet50-graph)
        [--modes native,native-b,transparent,run,advise]
        (also: learned, transparent-learned, run-learned, paused, transparent-paused,
        run-paused, preload-paused, history, history-python, tracker, preload, loaded, loaded-first,
        tracked, attached; any of them with a variant's suffix: VARIANTS)

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
the top operators by self CPU time, and with --cpu-profile-steps, under
gperftools' sampling profiler: where every thread's CPU time goes, native
frames included (cpu_profile_top.py reads them). Writes DIR/overhead.json
and prints the tables.

--alternate N times single steps instead of rounds: native, a, native, b,
native, ... (run_alternating), each step of another mode against the mean
of the native steps either side, N of each mode, all within a few hundred
ms of their native neighbours: on a host whose cores flip speed within a
second, rounds of several steps a mode hardly ever run at one speed, and
these comparisons mostly do. The allocator-state read, due by the clock,
is stretched by the alternation's dilution (state_period), so that it
falls as often per step as in a job running alone.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Modes on a run of a job the daemon learned a config for, which leaves its
# allocation stream off while it stays within what the job reached under it
# (overhead.sh teaches the daemon the config native runs, PyTorch's
# defaults, for overhead-WORKLOAD-learned), and the worker's mode for each.
LEARNED_MODES = {"learned": "advise", "transparent-learned": "transparent",
                 "run-learned": "native"}
# Modes on a first run whose stream pauses once the daemon settles the
# config it runs (its first pass keeps it: a StreamDemand): read from
# PyTorch's history first, which can stop (the tracker cannot be detached),
# each worker steps until its stream is off before it reports ready.
PAUSED_MODES = {"paused": "advise", "transparent-paused": "transparent",
                "run-paused": "native", "preload-paused": "transparent"}
# Modes whose worker runs transparent mode with the interposer preloaded, as
# `allocd run` preloads it, rather than dlopen()ed by enable(): what the way
# it is loaded costs, apart from all else.
PRELOADED = ("preload", "preload-paused")
# Modes on a first run whose stream stays on whatever the daemon decides
# ($ALLOCD_DEFER_STREAM=0), each on one reader (the environment it runs
# with): the stream's cost until the daemon stops it, by reader.
STREAM_MODES = {
    # PyTorch's history read by the tracker's library, all run long.
    "history": {"ALLOCD_HISTORY_FIRST_S": "1000000"},
    # PyTorch's history read through _snapshot(), a dict per event.
    "history-python": {"ALLOCD_EVENT_SOURCE": "history"},
    # The C++ tracker from the start.
    "tracker": {"ALLOCD_HISTORY_FIRST_S": "0"},
}
# How long a paused mode's worker steps for its stream to pause.
PAUSE_WAIT_S = 180
# Modes whose worker runs under `allocd run`.
UNDER_RUN = ("run", "run-learned", "run-paused")
# Timed steps in one turn: short turns interleave the modes finely.
STEPS = {"seq2seq": 4, "resnet50": 10, "generate": 2, "churn": 4, "resnet50-graph": 10}
BOOTSTRAP_RESAMPLES = 2000
ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h: what `setarch -R` sets
PAD_MIB = 53
# Variants of any mode, by suffix (native-padded, transparent-paused-nolookup,
# ...): the worker's extra arguments (overhead_job.py). Checked in this order,
# the longer of two suffixes that end alike first.
VARIANTS = {
    # PAD_MIB of address space reserved after allocd loads (enable()) and
    # before torch: torch's libraries move, allocd's stay.
    "-padded-after": ["--pad-mib", str(PAD_MIB), "--pad-after-allocd"],
    # ... or before both: each library loaded after lands that much lower, as
    # if a mode had loaded libraries of that size first. A step that moves
    # with it moves with where its libraries lie, not with what runs.
    "-padded": ["--pad-mib", str(PAD_MIB)],
    # enable() without asking the daemon for the job's learned config ...
    "-nolookup": ["--learned-lookup", "skip"],
    # ... or with that question asked in the job's process before torch
    # loads, in any mode (gRPC started there first), where enable() asks it
    # from a process of its own.
    "-lookup-here": ["--learned-lookup", "here"],
    # Advisor mode with a part of it switched off once the stream pauses:
    # what each part costs the job's threads (--advisor-off).
    "-nohook": ["--advisor-off", "hook"],
    "-norounds": ["--advisor-off", "rounds"],
    "-quiet": ["--advisor-off", "hook,rounds"],
}


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


def split_variant(mode):
    """A mode as (its base mode, its variant's worker arguments): VARIANTS."""
    for suffix, args in VARIANTS.items():
        if mode.endswith(suffix):
            return mode[:-len(suffix)], args
    return mode, []


def base_mode(mode):
    """A mode with its variant's suffix (VARIANTS) taken off."""
    return split_variant(mode)[0]


def start(a, workload, mode, cpus, state_period_s=None):
    # A label a mode: the daemon decides on one session's stream a job, and
    # leaves the others' off. The learned modes share the label it learned.
    job = f"overhead-{workload}-learned" if base_mode(mode) in LEARNED_MODES \
        else f"overhead-{workload}-{mode}"
    mode, variant = split_variant(mode)
    job_mode = {"run": "native", "native-b": "native", "preload": "transparent",
                **LEARNED_MODES, **PAUSED_MODES,
                **{m: "advise" for m in STREAM_MODES}}.get(mode, mode)
    cmd = [sys.executable, os.path.join(HERE, "overhead_job.py"), "--workload", workload,
           "--mode", job_mode, "--socket", a.socket, "--job", job,
           ] + (["--job-core", str(a.job_core)] if a.job_core is not None else []) \
        + (["--autograd-core", str(a.autograd_core)] if a.autograd_core is not None else []) \
        + (["--until-paused", str(PAUSE_WAIT_S)] if mode in PAUSED_MODES else []) \
        + variant
    if mode in UNDER_RUN:
        cmd = [a.allocd, "run", "--socket", a.socket, "--job", job, "--"] + cmd
    # PyTorch's intra-op threads, one per core, which sleep when idle rather
    # than spin on the cores the next worker steps on (the same in every mode).
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(len(cpus)),
               OMP_WAIT_POLICY="PASSIVE")
    if mode in PRELOADED:
        from allocd._bindings import INTERPOSE_LIBRARY, library_path
        env["LD_PRELOAD"] = ":".join(filter(None, [library_path(INTERPOSE_LIBRARY),
                                                   env.get("LD_PRELOAD")]))
    if mode in STREAM_MODES:
        env.update(STREAM_MODES[mode], ALLOCD_DEFER_STREAM="0")
    if a.same_layout:
        env["PYTHONHASHSEED"] = "0"
    if a.cpu_profile_steps:
        env.setdefault("CPUPROFILE_FREQUENCY", "1000")  # samples a CPU-second (default 100)
    if state_period_s is not None:
        env["ALLOCD_STATE_PERIOD_S"] = str(state_period_s)

    def place():
        os.sched_setaffinity(0, cpus)
        if a.same_layout:
            import ctypes
            ctypes.CDLL(None).personality(ADDR_NO_RANDOMIZE)

    worker = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env, preexec_fn=place)
    return worker


def profile_each(a, workload, workers, command, steps, suffix):
    """Has each worker run `steps` steps under its profiler `command`
    ("profile": PyTorch's, "cpuprofile": gperftools', "syscalls": strace's count), written to
    DIR/COMMAND-WORKLOAD-MODE.SUFFIX; none when `steps` is 0."""
    if not steps:
        return
    for m, processes in workers.items():
        for k, worker in enumerate(processes):
            name = m if len(processes) == 1 else f"{m}-{k}"
            path = os.path.join(a.out, f"{command}-{workload}-{name}.{suffix}")
            worker.stdin.write(f"{command} {steps} {path}\n")
            worker.stdin.flush()
            read_json(worker, f"{workload} {name} {command}")


def state_period(a, modes):
    """The allocator-state read's period for the workers (None: the client's).
    It is due by the clock, and in --alternate a worker takes one step in
    every 2 x (modes - 1): stretched as much, it falls as often per step as
    in a job running alone, not 2 x (modes - 1) times as often."""
    if not a.alternate:
        return None
    alone_s = float(os.environ.get("ALLOCD_STATE_PERIOD_S", "2"))
    return alone_s * 2 * (len(modes) - 1)


def not_as_asked(mode, ready):
    """Why a worker, ready, does not run `mode` as the mode means ("": it does)."""
    mode = base_mode(mode)
    if mode in UNDER_RUN and not ready.get("under_allocd_run"):
        return f"the {mode} worker is not under `allocd run`"
    if mode in LEARNED_MODES and ready.get("event_source") != "deferred":
        return (f"the {mode} worker's stream is {ready.get('event_source')}, not deferred: does "
                "the daemon know the job's learned config (overhead.sh teaches it)?")
    if mode in PAUSED_MODES and ready.get("event_source") != "deferred":
        return (f"the {mode} worker's stream is {ready.get('event_source')}, not paused after "
                f"{ready.get('steps_until_paused')} steps: did the daemon decide on it?")
    if mode in STREAM_MODES:
        wanted = ("tracker", None) if mode == "tracker" else \
            ("history", "Python" if mode == "history-python" else "C++")
        got = (ready.get("event_source"), ready.get("history_read_in"))
        if got != wanted:
            return f"the {mode} worker's stream is read by {got}, not {wanted}"
    return ""


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


def ask(worker, request, what):
    """One turn of a worker: `request` is "N [U]" (overhead_job.py)."""
    worker.stdin.write(f"{request}\n")
    worker.stdin.flush()
    return read_json(worker, what)


def run_rounds(workload, workers, modes, rounds):
    """Every mode a turn of STEPS timed steps a round, in an order rotated
    each round. Returns the rounds (mode -> turn), every mode's turns, and
    each other mode's comparisons with native: (its turn, native's turn of
    the round)."""
    rows = []
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        row = {m: ask(workers[m][0], STEPS[workload], f"{workload} {m} round {r}")
               for m in order}
        rows.append(row)
        print(f"{workload} round {r}: " + ", ".join(
            f"{m} {row[m]['host_ms_median']:.2f} ms" for m in modes), flush=True)
    return (rows, {m: [row[m] for row in rows] for m in modes},
            {m: [(row[m], row["native"]) for row in rows] for m in modes[1:]})


def between(before, after):
    """Native's two turns either side of another mode's step, as one turn:
    their mean step, every probe, their work summed."""
    merged = {"steps": before["steps"] + after["steps"],
              "probe_ms": before["probe_ms"] + after["probe_ms"],
              "instructions": None}
    for clock in ("host", "gpu"):
        merged[f"{clock}_ms_median"] = (before[f"{clock}_ms_median"]
                                        + after[f"{clock}_ms_median"]) / 2
    if before.get("instructions") and after.get("instructions"):
        merged["instructions"] = {g: before["instructions"].get(g, 0) + n
                                  for g, n in after["instructions"].items()}
    return merged


def run_alternating(workload, workers, modes, count):
    """`count` single steps of each other mode, each between two of native's:
    native, a, native, b, native, ..., the other modes in turn (rotated each
    time round). A step is compared with the mean of the native steps either
    side, which cancels a steady drift, and the three run within a few
    hundred ms: less than the time in which a cloud core's speed flips.
    Every native step follows another mode's, as every other mode's follows
    native's. With several processes a mode (workers[m] a list), round i
    runs every mode's process i mod K, its native steps included, so that
    each comparison is within one set of processes. Returns the sequence of
    turns, every mode's turns, and the comparisons (its turn, native's
    either side); each turn says its process."""
    sequence = []
    turns = {m: [] for m in modes}
    comparisons = {m: [] for m in modes[1:]}
    others = modes[1:]
    processes = len(workers["native"])

    def step(m, k, what):
        turn = ask(workers[m][k], "1 0", f"{workload} {m} #{k} {what}")
        turn["process"] = k
        sequence.append({"mode": m, "turn": turn})
        turns[m].append(turn)
        return turn

    native = None
    for i in range(count):
        k = i % processes
        if native is None or native["process"] != k:
            native = step("native", k, f"first of round {i}")
        for m in others[i % len(others):] + others[: i % len(others)]:
            ours = step(m, k, f"step {i}")
            after = step("native", k, f"after {m} step {i}")
            comparisons[m].append((ours, between(native, after)))
            native = after
        if i % 10 == 9 or i == count - 1:
            print(f"{workload} {i + 1} of {count}: " + ", ".join(
                f"{m} {statistics.median(o['host_ms_median'] / n['host_ms_median'] for o, n in c):.4f}x"
                for m, c in comparisons.items()), flush=True)
    return sequence, turns, comparisons


def probe_speed(turn, tolerance):
    """The turn's probe (its probes' mean), or None where the core's speed
    moved by more than `tolerance` within the turn."""
    probes = turn["probe_ms"]
    if max(probes) > min(probes) * (1 + tolerance):
        return None
    return statistics.mean(probes)


def speed_matched(comparisons, clock, tolerance):
    """The ratios to native of the comparisons whose two turns ran at one
    speed (probe_speed within `tolerance` of each other)."""
    ratios = []
    for ours, native in comparisons:
        speed, native_speed = probe_speed(ours, tolerance), probe_speed(native, tolerance)
        if speed is None or native_speed is None or \
                max(speed, native_speed) > min(speed, native_speed) * (1 + tolerance):
            continue
        ratios.append(ours[f"{clock}_ms_median"] / native[f"{clock}_ms_median"])
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


def per_step(turns, key, steps):
    """The sums over `turns` of each count in turn[key], per step."""
    total = {}
    for turn in turns:
        for name, count in (turn.get(key) or {}).items():
            total[name] = total.get(name, 0.0) + count
    return {name: count / steps for name, count in sorted(total.items())}


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
    p.add_argument("--alternate", type=int, default=0,
                   help="instead of rounds: this many single steps of each other mode, each "
                        "between two of native's (see run_alternating)")
    p.add_argument("--cpus", default=None,
                   help="cores for the workers (taskset's list syntax; default: every core "
                        "this process may use)")
    p.add_argument("--separate-cores", action="store_true",
                   help="split --cpus evenly among the workers instead of sharing them")
    p.add_argument("--job-core", type=int, default=None,
                   help="the core every worker's own thread runs on (default: any of its cores)")
    p.add_argument("--autograd-core", type=int, default=None,
                   help="the core every worker's autograd threads run on (default: any of its "
                        "cores)")
    p.add_argument("--same-layout", action="store_true",
                   help="start every worker without address-space randomisation and with one "
                        "Python hash seed, so that two workers of a mode lay out their memory "
                        "alike (a process's layout can move a CPU-bound step by a few percent)")
    p.add_argument("--match", type=float, default=0.03,
                   help="speed-matched rounds: probes within this fraction of each other")
    p.add_argument("--workloads", default="seq2seq,resnet50,generate")
    p.add_argument("--modes", default="native,native-b,transparent,run,advise",
                   help="native first (the ratios' base); native-b is a second native worker, "
                        "the method's own noise: its ratio should hold 1 within its interval")
    p.add_argument("--profile-steps", type=int, default=5,
                   help="after the rounds, this many steps of each worker under PyTorch's "
                        "profiler (DIR/profile-WORKLOAD-MODE.txt; 0: none)")
    p.add_argument("--processes", type=int, default=1,
                   help="with --alternate: this many worker processes of each mode, round i "
                        "comparing every mode's process i mod N. A process's memory layout moves "
                        "a launch-bound step by a few percent for its life, and modes that load "
                        "different libraries cannot share one: run several processes a mode, "
                        "without --same-layout, and the ratios pool layouts instead of "
                        "carrying one (the table gives each process set's median)")
    p.add_argument("--syscall-steps", type=int, default=0,
                   help="after them, this many steps of each worker with its job thread's "
                        "system calls counted by strace -c, $ALLOCD_STRACE or the strace on PATH "
                        "(DIR/syscalls-WORKLOAD-MODE.txt, compared with syscall_counts.py; "
                        "0: none)")
    p.add_argument("--cpu-profile-steps", type=int, default=0,
                   help="after them, this many steps of each worker under gperftools' sampling "
                        "profiler, $ALLOCD_LIBPROFILER (DIR/cpuprofile-WORKLOAD-MODE.prof, read "
                        "with cpu_profile_top.py; 0: none)")
    a = p.parse_args()
    if a.processes < 1 or (a.processes > 1 and not a.alternate):
        sys.exit("--processes: 1, or more with --alternate")
    if a.cpu_profile_steps and not os.path.exists(os.environ.get("ALLOCD_LIBPROFILER", "")):
        sys.exit("--cpu-profile-steps: set ALLOCD_LIBPROFILER to gperftools' libprofiler.so")
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
    failed = []
    period = state_period(a, modes)
    for workload in a.workloads.split(","):
        workers = {m: [start(a, workload, m, pinned[m], period) for _ in range(a.processes)]
                   for m in modes}
        # One at a time would also do; warming them together saves the call's time.
        readies = {m: [read_json(w, f"{workload} {m}") for w in processes]
                   for m, processes in workers.items()}
        wrong = [why for m, ready in readies.items() for r in ready
                 for why in [not_as_asked(m, r)] if why]
        for m in PAUSED_MODES.keys() & readies.keys():
            for r in readies[m]:
                print(f"{workload} {m}: stream paused after {r.get('steps_until_paused')} steps "
                      f"({r.get('mean_step_s_until_paused', 0) * 1e3:.1f} ms a step meanwhile): "
                      f"{r.get('stream_paused')}", flush=True)
        if wrong:
            # The other workloads are still measured, and what was is kept.
            failed.append(f"{workload}: {wrong[0]}")
            print(failed[-1], flush=True)
            for w in (w for processes in workers.values() for w in processes):
                w.kill()
                w.wait()
            continue
        if a.alternate:
            records, turns, comparisons = run_alternating(workload, workers, modes, a.alternate)
        else:
            records, turns, comparisons = run_rounds(workload, workers, modes, a.rounds)
        profile_each(a, workload, workers, "profile", a.profile_steps, "txt")
        profile_each(a, workload, workers, "cpuprofile", a.cpu_profile_steps, "prof")
        profile_each(a, workload, workers, "syscalls", a.syscall_steps, "txt")
        for w in (w for processes in workers.values() for w in processes):
            w.stdin.close()
            w.wait(timeout=60)
        def pooled(m, clock):
            return statistics.median([t for turn in turns[m] for t in turn[f"{clock}_ms"]])

        summary = {}
        for m, compared in comparisons.items():
            entry = {}
            for clock in ("host", "gpu"):
                ratios = [ours[f"{clock}_ms_median"] / native[f"{clock}_ms_median"]
                          for ours, native in compared]
                entry[clock] = {**spread(ratios),
                                "pooled": pooled(m, clock) / pooled("native", clock),
                                "matched": spread(speed_matched(compared, clock, a.match))}
            if a.processes > 1:
                # Each set of processes' own median: how far one process's
                # layout moves the ratio.
                entry["by_process"] = [statistics.median(
                    ours["host_ms_median"] / native["host_ms_median"]
                    for ours, native in compared if ours.get("process") == k)
                    for k in range(a.processes)]
            summary[m] = entry
        cpu, kernel, advisor, instructions = {}, {}, {}, {}
        for m in modes:
            steps = sum(turn["steps"] for turn in turns[m])
            cpu[m] = per_step(turns[m], "cpu_ms_by_thread", steps)
            kernel[m] = per_step(turns[m], "job_kernel_counts", steps)
            work = [(ours["instructions"], native["instructions"], ours["steps"], native["steps"])
                    for ours, native in comparisons.get(m, [])
                    if ours.get("instructions") and native.get("instructions")]
            if work:
                instructions[m] = {
                    "job": spread([ours["job"] / n / (theirs["job"] / k)
                                   for ours, theirs, n, k in work]),
                    "process": spread([sum(ours.values()) / n / (sum(theirs.values()) / k)
                                       for ours, theirs, n, k in work]),
                    "allocd_per_step": statistics.median(
                        [sum(v for g, v in ours.items() if g.startswith("allocd")) / n
                         for ours, _, n, _ in work]),
                    "scope": turns[m][0].get("instructions_scope")}
            advised = [turn for turn in turns[m] if turn.get("advisor")]
            if advised:
                parts = {k: sum(t["advisor"][k] for t in advised) for k in advised[0]["advisor"]}
                # Over the turn's untimed first step too (advisor_steps), where
                # the allocator-state read falls.
                host_s = sum(sum(t["host_ms"]) + t.get("warm_host_ms", 0.0) for t in advised) / 1e3
                counted = sum(t.get("advisor_steps", t["steps"]) for t in advised)
                advisor[m] = {"rounds_per_s": parts.pop("rounds") / host_s,
                              "ms_per_step": {k: v * 1e3 / counted for k, v in parts.items()}}
        stolen = [t for m in modes for t in turns[m] if t.get("steal_ticks") is not None]
        steal = (sum(t["steal_ticks"] for t in stolen)
                 / (os.sysconf("SC_CLK_TCK") * sum(sum(t["host_ms"]) for t in stolen) / 1e3)
                 if stolen else None)
        results[workload] = {"sequence" if a.alternate else "rounds": records, "summary": summary,
                             "steal_cpus": steal,
                             "native_host_ms_median": pooled("native", "host"),
                             "cpu_ms_per_step": cpu, "job_kernel_per_step": kernel,
                             "advisor": advisor, "instructions": instructions,
                             "cores": pinned, "ready": readies}
        with open(os.path.join(a.out, "overhead.json"), "w") as f:  # what a cut run keeps
            json.dump(results, f, indent=1)
    def cell(s):
        return (f"{s['median']:.4f}x, 95% {s['ci95'][0]:.4f}-{s['ci95'][1]:.4f} "
                f"[IQR {s['q1']:.4f}-{s['q3']:.4f}] ({s['min']:.4f}-{s['max']:.4f})")

    compared, unit = (a.alternate, "step") if a.alternate else (a.rounds, "round")
    rows = []
    for workload, r in results.items():
        for m, entry in r["summary"].items():
            h, g = entry["host"], entry["gpu"]
            matched = h["matched"]
            rows.append([workload, f"{r['native_host_ms_median']:.2f}", m,
                         f"{cell(matched)}, {len(matched['ratios'])} of {compared}" if matched
                         else f"none of {compared}",
                         cell(h), f"{h['pooled']:.4f}x", cell(g), f"{g['pooled']:.4f}x"])
    against = (" single steps of each mode, each against the mean of native's steps either side"
               if a.alternate else " rounds of each mode with native")
    print_table(f"{compared}{against}. Ratio to native: the median of "
                f"the {unit}s' ratios, its 95% interval (bootstrap over the {unit}s) [IQR] "
                f"(min-max), and the ratio of all timed steps' medians (pooled). native-b, a "
                f"second native worker, is the method's own noise.",
                [("workload", False), ("native step (host, ms)", True), ("mode", False),
                 (f"speed-matched {unit}s (host clock), of all", False),
                 (f"all {unit}s (host clock)", False), ("pooled", True),
                 (f"all {unit}s (CUDA events)", False), ("pooled", True)], rows)

    print()
    for workload, r in results.items():
        for m, entry in r["summary"].items():
            if "by_process" in entry:
                print(f"{workload} {m}: each process set's median (host clock): " + ", ".join(
                    f"{x:.4f}x" for x in entry["by_process"]))
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

    if any(counts for r in results.values() for counts in r["job_kernel_per_step"].values()):
        keys = sorted({k for r in results.values() for counts in r["job_kernel_per_step"].values()
                       for k in counts})
        print_table("What the kernel counted of the job's thread, per step (ticks: user and "
                    "system CPU in clock ticks; irq: the job's and autograd's cores' interrupts "
                    "by kind).",
                    [("workload", False), ("mode", False)] + [(k, True) for k in keys],
                    [[workload, m] + [f"{counts.get(k, 0.0):.3g}" for k in keys]
                     for workload, r in results.items()
                     for m, counts in r["job_kernel_per_step"].items()])

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
    if failed:
        sys.exit("not measured: " + "; ".join(failed))


if __name__ == "__main__":
    main()
