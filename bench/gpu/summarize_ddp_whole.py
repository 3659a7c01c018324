"""The DDP job of ddp_validation.sh's `whole` part, rank by rank (issue 40):
each run's whole-run peak against the best config run natively from step 0
(the lowest of the three natives over the same steps) and against staying
(its start config run natively), the config it ended on, and, for every
config a rank ran after its first step, the first step each rank ran it and
how many steps it ran behind the first rank to (the target: at most 3;
"never": the run ended first).

    python summarize_ddp_whole.py OUT NPROC
"""
import sys

from summarize_workloads import load

GIB = 2 ** 30
STARTS = {"defaults": "", "mss64": "max_split_size_mb:64"}
MODES = [("advise", "advise"), ("transparent", "transparent"), ("run", "run")]


def runs():
    """(file prefix, start, mode) of every allocd run: first runs, then second."""
    for again in ("", "again"):
        for start in STARTS:
            for prefix, mode in MODES:
                yield (f"whole_{prefix}{again}_{start}", start,
                       f"{mode} again" if again else mode)


def first_steps(ranks):
    """{config: [first step each rank ran it, or None]} for every config
    some rank switched to after its first step."""
    configs = []
    for run in ranks:
        steps = (run or {}).get("step_config") or []
        for c in steps[1:]:
            if c is not None and c != steps[0] and c not in configs:
                configs.append(c)
    firsts = {}
    for c in configs:
        firsts[c] = [next((i for i, s in enumerate((run or {}).get("step_config") or [])
                           if s == c), None) for run in ranks]
    return firsts


def lags(firsts, rank):
    """What `rank` ran of each config: "config @step (+behind)"."""
    parts = []
    for c, steps in firsts.items():
        first = min(s for s in steps if s is not None)
        mine = steps[rank]
        parts.append(f"`{c or '(defaults)'}` @{'never' if mine is None else mine} "
                     f"({'never' if mine is None else f'+{mine - first}'})")
    return "; ".join(parts) or "-"


def main():
    out, nproc = sys.argv[1], int(sys.argv[2])
    print("| run | start | rank | started on | step 0 config | later configs @ first step "
          "(steps behind the first rank) | ended on | whole run GiB | best native from step 0 "
          "| whole vs best | whole vs staying |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0
    for name, start, mode in runs():
        ranks = [load(f"{out}/{name}_rank{r}.json") for r in range(nproc)]
        if not any(ranks):
            continue
        firsts = first_steps(ranks)
        for steps in firsts.values():
            known = [s for s in steps if s is not None]
            worst = max(worst, float("inf") if len(known) < len(steps) else
                        max(known) - min(known))
        for rank, run in enumerate(ranks):
            if run is None:
                print(f"| {mode} | {start} | {rank} | (no result) ||||||||")
                continue
            steps = len(run["step_peak_reserved"])
            natives = {n: load(f"{out}/whole_native_{n}_rank{rank}.json")
                       for n in ("mss64", "defaults", "expandable")}
            peak = lambda r: max(r["step_peak_reserved"][:steps]) / GIB
            best = min((peak(r), n) for n, r in natives.items() if r)
            staying = natives[start]
            whole = peak(run)
            pct = lambda a, b: f"{100 * (a - b) / b:+.1f}%"
            session = run.get("allocd") or {}
            print(f"| {mode} | {start} | {rank} | {session.get('start_config_source', '-')} | "
                  f"`{(run.get('step_config') or ['-'])[0] or '(defaults)'}` | "
                  f"{lags(firsts, rank)} | `{session.get('config', '-') or '(defaults)'}` | {whole:.2f} | "
                  f"{best[0]:.2f} ({best[1]}) | {pct(whole, best[0])} | "
                  f"{pct(whole, peak(staying)) if staying else '-'} |")
    print(f"\nThe most steps a rank ran a config behind the first rank to: {worst} (target: 3)")


if __name__ == "__main__":
    main()
