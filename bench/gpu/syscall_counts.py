#!/usr/bin/env python3
"""Compares the job thread's system calls between modes: the strace -c
tables that overhead.py --syscall-steps N writes, one a worker
(DIR/syscalls-WORKLOAD-MODE[-K].txt), per step.

    syscall_counts.py DIR --workload resnet50 --steps N [--top 15]

Each mode pools its processes' tables. For each system call: calls and
system time (us) a step in each mode, the calls whose time a step is most
above native's first, and the totals. strace stops the thread twice at
every call it sees, so the steps ran slower than untraced ones: the calls'
number and the kernel's time in them are the measure, not the step's.
"""

import argparse
import glob
import os
import sys


def parse_table(text):
    """strace -c's table as {syscall: (calls, seconds)}, its total row left out."""
    counts = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[-1] == "total":
            continue
        try:
            seconds, calls = float(fields[1]), int(fields[3])
        except ValueError:
            continue  # the header and the rules
        counts[fields[-1]] = (calls, seconds)
    return counts


def mode_of(path, workload):
    """The mode a table's file name names (its process number taken off)."""
    name = os.path.basename(path)[len(f"syscalls-{workload}-"):-len(".txt")]
    head, _, tail = name.rpartition("-")
    return head if head and tail.isdigit() else name


def per_step(paths, workload, steps):
    """{mode: {syscall: (calls a step, us a step)}}, each mode's processes pooled."""
    pooled, processes = {}, {}
    for path in sorted(paths):
        mode = mode_of(path, workload)
        with open(path) as f:
            table = parse_table(f.read())
        processes[mode] = processes.get(mode, 0) + 1
        into = pooled.setdefault(mode, {})
        for call, (calls, seconds) in table.items():
            had_calls, had_seconds = into.get(call, (0, 0.0))
            into[call] = (had_calls + calls, had_seconds + seconds)
    out = {}
    for mode, table in pooled.items():
        counted = steps * processes[mode]
        out[mode] = {call: (calls / counted, seconds * 1e6 / counted)
                     for call, (calls, seconds) in table.items()}
    return out


def report(modes, top):
    """The markdown table: native first, the calls most above it first."""
    if "native" not in modes:
        sys.exit("syscall_counts: no native tables to compare with")
    order = ["native"] + sorted(m for m in modes if m != "native")
    calls = {call for table in modes.values() for call in table}

    def above(call):
        base = modes["native"].get(call, (0, 0.0))[1]
        return max(modes[m].get(call, (0, 0.0))[1] - base for m in order)

    lines = ["| syscall | " + " | ".join(f"{m}: calls, us a step" for m in order) + " |",
             "|---|" + "---:|" * len(order)]
    for call in sorted(calls, key=above, reverse=True)[:top]:
        cells = [f"{modes[m].get(call, (0, 0.0))[0]:.2f}, {modes[m].get(call, (0, 0.0))[1]:.1f}"
                 for m in order]
        lines.append(f"| {call} | " + " | ".join(cells) + " |")
    totals = [f"{sum(c for c, _ in modes[m].values()):.2f}, "
              f"{sum(us for _, us in modes[m].values()):.1f}" for m in order]
    lines.append("| total | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="overhead.py's --out")
    p.add_argument("--workload", required=True)
    p.add_argument("--steps", type=int, required=True, help="overhead.py's --syscall-steps")
    p.add_argument("--top", type=int, default=15, help="how many calls to list")
    a = p.parse_args(argv)
    if a.steps < 1:
        sys.exit("--steps: at least 1")
    paths = glob.glob(os.path.join(a.dir, f"syscalls-{a.workload}-*.txt"))
    if not paths:
        sys.exit(f"syscall_counts: no syscalls-{a.workload}-*.txt in {a.dir}")
    print(report(per_step(paths, a.workload, a.steps), a.top))


if __name__ == "__main__":
    main()
