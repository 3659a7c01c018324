"""What advisor mode costs a step, paired within one process (issue 42).

    python overhead_toggle.py --socket SOCK --workload seq2seq [--cycles 40] [--steps N]
        [--job-core C] [--autograd-core C] [--json OUT]
    python overhead_toggle.py --pool OUT.json[.gz]...    several runs' cycles together

overhead.py compares processes: one worker a mode. Each process's memory
layout moves a launch-bound step by a few percent for its whole life (3-5%
sd between processes of the same code, bench/gpu/results/packing/
run_1130c_learned_stream), so resolving 1% that way takes about 60
processes a mode. Here one process runs both: allocd.advise() and
allocd.shutdown() in turn, so every phase has the same layout and the same
libraries loaded.

First the job is decided: a first advise() of the label, stepped until the
daemon has stopped its allocation stream (a first pass that keeps the
config, or a config learned), then shutdown(). Then --cycles cycles of
three phases, in an order rotated each cycle: `native` (allocd shut
down), `advise` (advise() again: a new session of the decided job, whose
stream stays off below what the job settled at) and `native-b` (shut
down again: the method's own noise, an A/A pair). Each phase runs 2
untimed steps, then --steps timed ones (CUDA-synchronised, host clock).
A cycle's ratio is the phase's median step over native's; the summary is
the median of the cycles' ratios with a bootstrap 95% interval.

What this measures is allocd's steady state in advisor mode: its threads,
its rounds, the step hook, the session; not the start. Each advise()
after the first runs without the start's quick rounds (10 a second for up
to 30 s, Advisor.QUICK_START_S set to 0 here), which a cycle a few seconds
long would otherwise run throughout. The start's cost is reported apart:
the first advise()'s steps until its stream stopped, against the native
steps of the cycles. Transparent mode's interposer cannot be unloaded, so
it is not toggled; at steady state it adds no call to the allocation path
(its segments are cached), and its step hook is advise()'s.
"""
import argparse
import gzip
import json
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import overhead_job  # noqa: E402

PHASES = ("native", "advise", "native-b")
UNTIMED_STEPS = 2
# About a quarter of a second of each workload's steps on an H200: the
# host's cores change speed within seconds, and short phases share it.
STEPS_A_PHASE = {"seq2seq": 2, "resnet50": 10, "generate": 1, "churn": 2}
BOOTSTRAP_RESAMPLES = 2000


def timed(torch, step, n):
    """Host-clock seconds of `n` steps, each synchronised."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def spread(ratios, seed=0):
    """Median, bootstrap 95% interval of the median, and the range."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(BOOTSTRAP_RESAMPLES))
    return {"median": statistics.median(ratios),
            "ci95": [medians[int(0.025 * len(medians))], medians[int(0.975 * len(medians)) - 1]],
            "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def wait_until_stream_off(allocd, torch, step, seconds):
    """Steps until the daemon has stopped this run's stream: their times (s),
    and the last stats with where the history was read meanwhile."""
    deadline, times, read_in = time.monotonic() + seconds, [], None
    while allocd.stats().get("event_source") != "deferred" and time.monotonic() < deadline:
        times += timed(torch, step, 1)
        read_in = read_in or allocd.stats().get("history_read_in")
    return times, dict(allocd.stats(), history_read_in=read_in)


def cycle_ratios(phases):
    """Each cycle's median step of a phase over native's: `advise`,
    `native-b` (the A/A pair), and `advise/both` (over the mean of both
    natives, which halves the native side's noise)."""
    medians = {m: [statistics.median(t) for t in phases[m]] for m in PHASES}
    return {"advise": [a / n for a, n in zip(medians["advise"], medians["native"])],
            "native-b": [b / n for b, n in zip(medians["native-b"], medians["native"])],
            "advise/both": [a / ((n + b) / 2) for a, n, b in
                            zip(medians["advise"], medians["native"], medians["native-b"])]}


def pool(paths):
    """--pool: the cycles of several runs' --json results (.json or
    .json.gz) of one workload together, each ratio's median with its
    bootstrap 95% interval, and each phase's median step over every run."""
    runs = []
    for path in paths:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            runs.append(json.load(f))
    if len({r["workload"] for r in runs}) != 1:
        sys.exit("--pool: the results are of more than one workload")
    phases = {m: [times for r in runs for times in r["phases_s"][m]] for m in PHASES}
    for name, ratios in cycle_ratios(phases).items():
        s = spread(ratios)
        print(f"{runs[0]['workload']} {name} over {s['n']} cycles of {len(runs)} runs: "
              f"{s['median']:.4f}x, 95% {s['ci95'][0]:.4f}-{s['ci95'][1]:.4f}")
    steps = {m: statistics.median(t for times in phases[m] for t in times) * 1e3 for m in PHASES}
    print("median step: " + ", ".join(f"{m} {ms:.2f} ms" for m, ms in steps.items()))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--pool":
        return pool(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", required=True)
    p.add_argument("--workload", choices=["seq2seq", "resnet50", "generate", "churn"],
                   required=True)
    p.add_argument("--job", default=None, help="default: overhead-toggle-WORKLOAD")
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps a phase (default: about a quarter of a second's)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--decide-s", type=float, default=180,
                   help="how long the first advise() may step until its stream stops")
    p.add_argument("--job-core", type=int, default=None)
    p.add_argument("--autograd-core", type=int, default=None)
    p.add_argument("--json", default=None, help="write every phase's steps here")
    a = p.parse_args()
    a.steps = a.steps or STEPS_A_PHASE[a.workload]
    if a.cycles < 2 or a.steps < 1:
        sys.exit("--cycles: 2 or more; --steps: 1 or more")
    job = a.job or f"overhead-toggle-{a.workload}"
    import torch
    import allocd
    from allocd import _advisor
    torch.manual_seed(0)
    step = overhead_job.build(torch, a.workload)
    timed(torch, step, a.warmup)
    if a.job_core is not None:
        os.sched_setaffinity(threading.get_native_id(), {a.job_core})

    def pin_autograd():
        if a.autograd_core is None:
            return
        for tid, name in overhead_job.thread_names().items():
            if name.startswith("pt_autograd"):
                os.sched_setaffinity(tid, {a.autograd_core})

    pin_autograd()
    # The start, as a first run pays it: quick rounds, the stream until the
    # daemon has decided.
    allocd.advise(socket=a.socket, job=job, required=True)
    start_steps, start_stats = wait_until_stream_off(allocd, torch, step, a.decide_s)
    allocd.shutdown()
    if start_stats.get("event_source") != "deferred":
        sys.exit(f"{a.workload}: the daemon did not stop the first run's stream within "
                 f"{a.decide_s:g} s ({len(start_steps)} steps): {start_stats.get('stream_paused')}")
    print(f"{a.workload}: decided, stream off after {len(start_steps)} steps "
          f"({statistics.mean(start_steps) * 1e3:.1f} ms a step meanwhile): "
          f"{start_stats.get('stream_paused')}", flush=True)
    _advisor.Advisor.QUICK_START_S = 0.0  # the steady state from here on
    phases = {m: [] for m in PHASES}
    sources = []
    for cycle in range(a.cycles):
        order = PHASES[cycle % 3:] + PHASES[:cycle % 3]
        medians = {}
        for phase in order:
            if phase == "advise":
                allocd.advise(socket=a.socket, job=job, required=True)
            timed(torch, step, UNTIMED_STEPS)
            pin_autograd()
            times = timed(torch, step, a.steps)
            if phase == "advise":
                sources.append(allocd.stats().get("event_source"))
                allocd.shutdown()
            phases[phase].append(times)
            medians[phase] = statistics.median(times)
        if (cycle + 1) % 10 == 0:
            print(f"{a.workload} cycle {cycle + 1} of {a.cycles}: advise "
                  f"{medians['advise'] / medians['native']:.4f}x, native-b "
                  f"{medians['native-b'] / medians['native']:.4f}x", flush=True)
    if any(s != "deferred" for s in sources):
        sys.exit(f"{a.workload}: an advise phase ran its stream: {sources}")
    summary = {m: spread(ratios) for m, ratios in cycle_ratios(phases).items()
               if m != "advise/both"}
    native_steps = [t for times in phases["native"] for t in times]
    result = {"workload": a.workload, "cycles": a.cycles, "steps": a.steps,
              "native_step_ms": statistics.median(native_steps) * 1e3,
              "ratios": summary,
              "start": {"steps_until_stream_off": len(start_steps),
                        "mean_step_ms": statistics.mean(start_steps) * 1e3,
                        "ratio_to_native_median": statistics.mean(start_steps) /
                        statistics.median(native_steps),
                        "stream_paused": start_stats.get("stream_paused"),
                        "history_read_in": start_stats.get("history_read_in")},
              "phases_s": phases}
    for m, s in summary.items():
        print(f"{a.workload} {m}/native over {s['n']} cycles: {s['median']:.4f}x, "
              f"95% {s['ci95'][0]:.4f}-{s['ci95'][1]:.4f} (range {s['min']:.4f}-{s['max']:.4f}); "
              f"native step {result['native_step_ms']:.2f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
