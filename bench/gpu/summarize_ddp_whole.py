"""The DDP job of ddp_validation.sh's `whole` part, rank by rank (issue 40):
each run's whole-run peak against the best config run natively from step 0
(the lowest of the three natives over the same steps) and against staying
(its start config run natively), the config it ended on, the first step each
rank ran on another config than it started with, and how many steps each
rank ran behind the first rank to switch (the target: at most 3).

    python summarize_ddp_whole.py OUT NPROC
"""
import sys

from summarize_workloads import load

GIB = 2 ** 30
RUNS = [("whole_advise_defaults", "defaults", "advise"),
        ("whole_transparent_defaults", "defaults", "transparent"),
        ("whole_run_defaults", "defaults", "run"),
        ("whole_run_mss64", "mss64", "run"),
        ("whole_runlearned_mss64", "mss64", "run again (learned)")]
START = {"defaults": "", "mss64": "max_split_size_mb:64"}


def first_switch(run, start):
    """The first step that ended on another config than the job's start
    config (0: it ran another from its first step), or None."""
    for i, c in enumerate(run.get("step_config") or []):
        if c is not None and c != start:
            return i
    return None


def main():
    out, nproc = sys.argv[1], int(sys.argv[2])
    print("| run | start | rank | started on | first step on another config | steps behind the "
          "first rank | ended on | whole run GiB | best native from step 0 | whole vs best | "
          "whole vs staying |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, start, mode in RUNS:
        ranks = [load(f"{out}/{name}_rank{r}.json") for r in range(nproc)]
        switches = [first_switch(r, START[start]) if r else None for r in ranks]
        first = min((s for s in switches if s is not None), default=None)
        for rank, run in enumerate(ranks):
            if run is None:
                print(f"| {mode} | {start} | {rank} | (no result) |||||||")
                continue
            steps = len(run["step_peak_reserved"])
            natives = {n: load(f"{out}/whole_native_{n}_rank{rank}.json")
                       for n in ("mss64", "defaults", "expandable")}
            peak = lambda r: max(r["step_peak_reserved"][:steps]) / GIB
            best = min((peak(r), n) for n, r in natives.items() if r)
            staying = natives[start]
            whole = peak(run)
            s = switches[rank]
            behind = "-" if s is None or first is None else str(s - first)
            pct = lambda a, b: f"{100 * (a - b) / b:+.1f}%"
            print(f"| {mode} | {start} | {rank} | "
                  f"{(run.get('allocd') or {}).get('start_config_source', '-')} | "
                  f"{'-' if s is None else s} | {behind} | "
                  f"{(run.get('allocd') or {}).get('config', '-')!s} | {whole:.2f} | "
                  f"{best[0]:.2f} ({best[1]}) | {pct(whole, best[0])} | "
                  f"{pct(whole, peak(staying)) if staying else '-'} |")


if __name__ == "__main__":
    main()
