#!/usr/bin/env python3
"""Pools overhead.py's process sets over several calls: what a mode costs
when each process's memory layout moves a launch-bound step by a few
percent for its life (overhead.sh with SAME_LAYOUT=0 and OVERHEAD_ARGS
"--processes K").

  pool_process_sets.py --workload resnet50 OUT1/overhead.json OUT2/overhead.json ...
      [--pairs transparent-paused:preload-paused,...] [--modes native-b,paused,...]

A set is K processes' worth of one call: every mode's process k, each step
of it compared with native's process k either side. Its ratio is the median
of those steps' ratios (overhead.py's "each process set's median"). Here:

- each mode over every set that ran it: the mean of the sets' ratios with a
  95% t-interval, their spread and median. native-b (a second native
  process, identical code) is the method's null: its interval is what the
  sets can resolve.
- with --pairs A:B, A's ratio minus B's in each set that ran both, pooled
  the same way: two modes measured in the same set share its native
  process and its minutes of the host, so their difference resolves more
  than either against native does.

The sets are the unit: steps within one process are not independent of
its layout, so intervals over steps overstate what a call shows.
"""

import argparse
import gzip
import json
import math
import statistics
import sys

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom;
# past the table, the normal's.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    return T975[df - 1] if df <= len(T975) else 1.96


def interval(values):
    """{"n", "mean", "ci95", "sd", "median"} of `values` (two or more)."""
    n = len(values)
    mean, sd = statistics.mean(values), statistics.stdev(values)
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "ci95": (mean - half, mean + half), "sd": sd,
            "median": statistics.median(values)}


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def sets_of(result, workload):
    """A call's sets for `workload`: one {mode: ratio} a process set. Empty
    where the call ran one process a mode (no by_process)."""
    summary = result.get(workload, {}).get("summary", {})
    count = max((len(e.get("by_process", [])) for e in summary.values()), default=0)
    return [{m: e["by_process"][k] for m, e in summary.items() if "by_process" in e}
            for k in range(count)]


def only(sets, modes):
    """`sets` keeping only `modes` (every mode when empty): a mode whose
    code changed between records pools only over the records that ran the
    same code."""
    if not modes:
        return sets
    kept = [{m: r for m, r in s.items() if m in modes} for s in sets]
    return [s for s in kept if s]


def pool(sets, pairs=()):
    """Each mode's interval over `sets`, and each pair's (A - B) over the
    sets that ran both; a mode or pair in fewer than two sets is left out."""
    modes = {}
    for s in sets:
        for m, ratio in s.items():
            modes.setdefault(m, []).append(ratio)
    differences = {}
    for a, b in pairs:
        d = [s[a] - s[b] for s in sets if a in s and b in s]
        if len(d) >= 2:
            differences[(a, b)] = {**interval(d), "above": sum(x > 0 for x in d)}
    return ({m: interval(v) for m, v in modes.items() if len(v) >= 2}, differences)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True)
    p.add_argument("--pairs", default="",
                   help="A:B,...: each set's A ratio minus its B ratio, pooled")
    p.add_argument("--modes", default="",
                   help="M,...: pool only these modes (default: every mode the runs ran)")
    p.add_argument("results", nargs="+", help="overhead.json (or .json.gz) of each run")
    a = p.parse_args(argv)
    try:
        pairs = [tuple(pair.split(":")) for pair in a.pairs.split(",") if pair]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError
    except ValueError:
        sys.exit("--pairs: A:B[,C:D...]")
    by_call = [sets_of(read(path), a.workload) for path in a.results]
    modes_kept = [m for m in a.modes.split(",") if m]
    by_call = [only(call, modes_kept) for call in by_call]
    sets = [s for call in by_call for s in call]
    if not sets:
        sys.exit(f"no process sets of {a.workload} in these results: were they run with "
                 "--processes K (K > 1)?")
    modes, differences = pool(sets, pairs)
    print(f"{a.workload}: {len(sets)} process sets from {sum(1 for c in by_call if c)} runs. "
          "Each set's "
          "ratio to native (the median of its steps'), pooled: mean [95% t-interval], sd, median.\n")
    print("| mode | sets | mean [95%] | sd | median |")
    print("|---|---:|---|---:|---:|")
    for m, s in modes.items():
        print(f"| {m} | {s['n']} | {s['mean']:.4f}x [{s['ci95'][0]:.4f}-{s['ci95'][1]:.4f}] "
              f"| {s['sd']:.4f} | {s['median']:.4f}x |")
    if differences:
        print("\n| A - B, in each set that ran both | sets | mean [95%] | sets with A above B |")
        print("|---|---:|---|---:|")
        for (x, y), s in differences.items():
            print(f"| {x} - {y} | {s['n']} | {s['mean']:+.4f} [{s['ci95'][0]:+.4f} to "
                  f"{s['ci95'][1]:+.4f}] | {s['above']} of {s['n']} |")


if __name__ == "__main__":
    main()
