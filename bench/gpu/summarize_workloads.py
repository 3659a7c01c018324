"""The table of autotune_workloads.sh's runs: per job and start config, the
step a push landed at, the trigger -> ACK time, what the decision predicted,
the review's best reachable on the events after the push, what the job
realised after it, staying (the start config run natively, same steps) and
expandable_segments:True natively from step 0 (same steps).

    python summarize_workloads.py OUT_DIR [WORKLOAD...]
"""
import glob
import json
import os
import sys

GIB = 2 ** 30


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def after(run, step):
    peaks = run["step_peak_reserved"][step:]
    return max(peaks) / GIB if peaks else float("nan")


def main():
    out = sys.argv[1]
    workloads = sys.argv[2:] or ["seq2seq", "generate"]
    history = (load(os.path.join(out, "autotune_history.json")) or {}).get("decisions", [])
    print("| job | start | mode | pushed at step | trigger | trigger -> ACK | predicted | "
          "review (best reachable) | realised after | staying, same steps | "
          "expandable from step 0, same steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        best = load(os.path.join(out, f"{w}_native_expandable_segments_True.json"))
        for start in ("max_split_size_mb_64", "defaults"):
            staying = load(os.path.join(out, f"{w}_native_{start}.json"))
            for mode in ("advise", "transparent", "run", "learned"):
                job = f"{w}-{'advise' if mode == 'learned' else mode}-{start}"
                run = load(os.path.join(out, f"{w}_{mode}_{start}.json"))
                # A job run twice (advise, then learned): the decisions on
                # this run's session.
                session = str((run or {}).get("allocd", {}).get("session_id", ""))
                mine = sorted((d for d in history if d["job"] == job and
                               (not session or session in d.get("sessions", [session]))),
                              key=lambda d: int(d["id"]))
                pushed = [d for d in mine if d["result"] == "pushed"]
                d = pushed[0] if pushed else (mine[0] if mine else None)
                changes = []
                if run and run.get("step_config"):
                    configs = run["step_config"]
                    changes = [i for i in range(1, len(configs)) if configs[i] != configs[i - 1]]
                step = changes[0] if changes else None
                cell = lambda v: "-" if v is None else v
                gib = lambda k: f"{int(d[k]) / GIB:.2f}" if d and d.get(k) else "-"
                realised = (f"{after(run, step):.2f}" if run and step is not None
                            else gib("realized_peak"))
                stay = f"{after(staying, step or 0):.2f}" if staying else "-"
                exp = f"{after(best, step or 0):.2f}" if best else "-"
                ack = f"{float(d['trigger_to_ack_seconds']):.2f} s" if d and d.get(
                    "trigger_to_ack_seconds") else "-"
                print(f"| {w} | {start} | {mode} | {cell(step)} | "
                      f"{d['trigger'] + ' (' + d['result'] + ')' if d else '-'} | {ack} | "
                      f"{gib('predicted_peak_switched')} | {gib('best_reachable_peak')} | "
                      f"{realised} | {stay} | {exp} |")


if __name__ == "__main__":
    main()
