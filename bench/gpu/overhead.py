"""What allocd costs a job's step (issue 42): each workload in each mode,
interleaved rounds in one call, warm-up excluded, CUDA events.

    python bench/gpu/overhead.py --allocd BIN --socket SOCK --out DIR
        [--rounds 8] [--workloads seq2seq,resnet50,generate]
        [--modes native,transparent,run,advise]

For each workload it starts one warm worker per mode (overhead_job.py; the
`run` mode is the unchanged script under `allocd run`), then for each round
asks every worker in turn, in an order rotated each round, for --steps
timed steps: no two workers step at once, and clock or thermal drift falls
on every mode alike. A mode's ratio in a round is its median step over the
native worker's median step in that round; the summary is the median of
the rounds' ratios and their spread (min, max, interquartile range), on the
host's clock (what the job waits) and on the GPU's (CUDA events).
Then each worker's steps under PyTorch's profiler, the top operators by
self CPU time. Writes DIR/overhead.json and prints the table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = {"seq2seq": 20, "resnet50": 20, "generate": 6}


def start(a, workload, mode):
    cmd = [sys.executable, os.path.join(HERE, "overhead_job.py"), "--workload", workload,
           "--mode", "native" if mode == "run" else mode, "--socket", a.socket]
    if mode == "run":
        cmd = [a.allocd, "run", "--socket", a.socket, "--job", f"overhead-{workload}-run", "--"] + cmd
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    worker = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)
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


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocd", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--workloads", default="seq2seq,resnet50,generate")
    p.add_argument("--modes", default="native,transparent,run,advise")
    p.add_argument("--profile-steps", type=int, default=5,
                   help="after the rounds, this many steps of each worker under PyTorch's "
                        "profiler (DIR/profile-WORKLOAD-MODE.txt; 0: none)")
    a = p.parse_args()
    modes = a.modes.split(",")
    if modes[0] != "native":
        sys.exit("--modes: native must come first (the ratios' base)")
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for workload in a.workloads.split(","):
        workers = {m: start(a, workload, m) for m in modes}
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
        summary = {}
        for m in modes[1:]:
            entry = {}
            for clock in ("host", "gpu"):
                ratios = [row[m][f"{clock}_ms_median"] / row["native"][f"{clock}_ms_median"]
                          for row in rounds]
                q1, q3 = quartiles(ratios)
                entry[clock] = {"median": statistics.median(ratios), "min": min(ratios),
                                "max": max(ratios), "q1": q1, "q3": q3, "ratios": ratios}
            summary[m] = entry
        native = [row["native"]["host_ms_median"] for row in rounds]
        results[workload] = {"rounds": rounds, "summary": summary,
                             "native_host_ms_median": statistics.median(native)}
        with open(os.path.join(a.out, "overhead.json"), "w") as f:  # what a cut run keeps
            json.dump(results, f, indent=1)
    print(f"\n| workload | native step (host, ms) | mode | ratio, host clock: median "
          f"[IQR] (min-max) | ratio, CUDA events: median [IQR] (min-max) |")
    print("|---|---:|---|---|---|")
    for workload, r in results.items():
        for m, entry in r["summary"].items():
            h, g = entry["host"], entry["gpu"]
            print(f"| {workload} | {r['native_host_ms_median']:.2f} | {m} | "
                  f"{h['median']:.4f}x [{h['q1']:.4f}-{h['q3']:.4f}] ({h['min']:.4f}-{h['max']:.4f}) | "
                  f"{g['median']:.4f}x [{g['q1']:.4f}-{g['q3']:.4f}] ({g['min']:.4f}-{g['max']:.4f}) |")


if __name__ == "__main__":
    main()
