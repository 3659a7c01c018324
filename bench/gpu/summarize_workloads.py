"""The tables of autotune_workloads.sh's runs.

Per job and start config: the step the push landed at (and the step the
first decision was made at), the trigger, trigger -> ACK, what the decision
predicted (for a run started on its learned config: what the daemon handed it
to expect, the job's peak under that config in the run it was learned in),
the review's best reachable on the events after the push, what the
job realised after it (also against the prediction standing when it
peaked: the last decision's before that step; and against the push's
prediction at the job's need: scaled by how much more the job requested
after the push than in the decision's window, predicted_peak_at_need, and what
that was scaled from: the push's own prediction, "replay" or a later decision),
staying (the start config run natively, same steps)
and the best config run natively from step 0 on the same steps (the lowest of
the native runs under max_split_size_mb:64, defaults and
expandable_segments:True). Then the issue's targets, run by run.

    python summarize_workloads.py OUT_DIR [OUT_DIR...] [--workloads W,W...]

Several OUT_DIRs (one per GPU call, each with its own daemon and history)
are read together; a workload's runs are all in one of them.
"""
import json
import os
import re
import sys

GIB = 2 ** 30
WORKLOADS = ["seq2seq", "generate", "vit_compile", "llama_lora", "resnet50", "mlm_accum", "unet",
             "moe"]
STARTS = ("max_split_size_mb_64", "defaults")
NATIVES = ("max_split_size_mb_64", "defaults", "expandable_segments_True")
MODES = ("advise", "transparent", "run", "learned", "tlearned", "runlearned")
# Second runs (whole_job.sh: tlearned) under their first run's label.
JOB_MODE = {"learned": "advise", "tlearned": "transparent", "runlearned": "run"}
SHORT = {"max_split_size_mb_64": "mss:64", "defaults": "defaults",
         "expandable_segments_True": "expandable"}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def peak_from(run, step, until=None):
    """GiB: the run's peak over its steps [step, until)."""
    peaks = run["step_peak_reserved"][step:until]
    return max(peaks) / GIB if peaks else None


START_CONF = {"max_split_size_mb_64": "max_split_size_mb:64", "defaults": ""}


def learned_expectation(run):
    """GiB: what the daemon handed a run started on its learned config to
    expect (the job's peak under it in the run it was learned in), or None."""
    reason = (run.get("allocd") or {}).get("config_reason") or ""
    m = re.search(r"peaked at ([\d.]+) (GiB|MiB) reserved under it then", reason)
    if not m:
        return None
    return float(m.group(1)) / (1024 if m.group(2) == "MiB" else 1)


def push_step(run, start, learned):
    """The first step that ended on another config than the step before it
    (or than the run's start config, for step 0), and that config; None when
    the run never changed config. A second run (learned) that ran another
    config from step 0 on started on its learned config."""
    known = [(i, c) for i, c in enumerate((run or {}).get("step_config", [])) if c is not None]
    if not known:
        return None, None
    prev = START_CONF[start]
    if known[0][0] > 0 and not learned:
        prev = known[0][1]  # an unchanged script: allocd not yet started at step 0
    for i, c in known:
        if c != prev:
            return i, c
        prev = c
    return None, None


def window(run):
    """The run's time span (unix seconds): from its first step's start, a
    little before, to a little after its last step."""
    ends = (run or {}).get("step_end_unix") or []
    if not ends:
        return None
    first = (run.get("step_seconds") or [10.0])[0]
    return ends[0] - first - 3, ends[-1] + 5


def steps_before(run, micros):
    """How many of the run's steps had ended when the daemon decided."""
    ends = (run or {}).get("step_end_unix")
    if not ends or not micros:
        return None
    t = int(micros) / 1e6
    return sum(1 for e in ends if e <= t)


def standing_prediction(run, decisions, after):
    """The prediction standing when the job realised its peak after the push:
    of the run's last decision made before the step of that peak ended, what
    it predicted for the config the job ran from then on (a push: the pushed
    config; kept: staying). A job whose later steps grow is decided on again
    (growth, larger_request), each decision predicting from what it saw.
    None where no decision stood or the run has no step times."""
    peaks = (run or {}).get("step_peak_reserved") or []
    ends = (run or {}).get("step_end_unix") or []
    if after is None or after >= len(peaks) or len(ends) != len(peaks):
        return None
    peak_step = max(range(after, len(peaks)), key=lambda i: peaks[i])
    standing = None
    for d in decisions:
        if int(d["unix_micros"]) / 1e6 > ends[peak_step]:
            break
        key = {"pushed": "predicted_peak_switched", "kept": "predicted_peak_current"}.get(
            d["result"])
        if key and d.get(key):
            standing = int(d[key]) / GIB
    return standing


def fmt(v, unit=""):
    return "-" if v is None else f"{v:.2f}{unit}"


def pct(a, b):
    return None if a is None or b is None or b == 0 else 100.0 * (a - b) / b


def find(dirs, name):
    for d in dirs:
        v = load(os.path.join(d, name))
        if v is not None:
            return v, d
    return None, None


def rows(dirs, workloads):
    histories = {d: (load(os.path.join(d, "autotune_history.json")) or {}).get("decisions", [])
                 for d in dirs}
    for w in workloads:
        natives = {n: find(dirs, f"{w}_native_{n}.json")[0] for n in NATIVES}
        for start in STARTS:
            staying = natives[start]
            for mode in MODES:
                run, d_ = find(dirs, f"{w}_{mode}_{start}.json")
                if run is None:
                    continue
                job = f"{w}-{JOB_MODE.get(mode, mode)}-{start}"
                history = histories[d_]
                session = str((run.get("allocd") or {}).get("session_id", ""))
                span = window(run)
                # This run's decisions: on its session where the history
                # names one, made while it ran.
                mine = sorted((d for d in history if d.get("job") == job and
                               (not session or session in d.get("sessions", [session])) and
                               (span is None or
                                span[0] <= int(d["unix_micros"]) / 1e6 <= span[1])),
                              key=lambda d: int(d["id"]))
                decided = [d for d in mine if d.get("result") != "skipped"]
                pushed = [d for d in decided if d["result"] == "pushed"]
                d = pushed[0] if pushed else (decided[0] if decided else None)
                # Started at registration on another config than its own: a
                # second run's learned config, or (issue 40) the node's prior
                # or a harmful start's replacement.
                start_source = (run.get("allocd") or {}).get("start_config_source")
                learned = mode in JOB_MODE or start_source not in (None, "own")
                step, config = push_step(run, start, learned)
                learned_at_start = learned and step == 0
                after = None if step is None else (0 if learned_at_start else step + 1)
                from_ = after if after is not None else 0
                # Natives over the same steps as the run, when they ran more.
                steps = len(run["step_peak_reserved"])
                realised = peak_from(run, from_) if after is not None else None
                stay = peak_from(staying, from_, steps) if staying else None
                # A native run shorter than this one has no peak past its end.
                best = min(((v, n) for n, r in natives.items() if r
                            for v in [peak_from(r, from_, steps)] if v is not None),
                           key=lambda x: x[0], default=(None, None))
                g = lambda k: int(d[k]) / GIB if d and d.get(k) else None
                yield {
                    "workload": w, "start": start, "mode": mode, "job": job, "run": run,
                    "decisions": decided, "d": d, "push_step": step, "config": config,
                    "from": from_, "decided_at": steps_before(run, d["unix_micros"]) if d
                    else None,
                    "first_decided_at": steps_before(run, decided[0]["unix_micros"])
                    if decided else None,
                    "trigger": f"{d['trigger']} ({d['result']})" if d else "-",
                    "ack": float(d["trigger_to_ack_seconds"]) if d and d.get(
                        "trigger_to_ack_seconds") else None,
                    "predicted": (learned_expectation(run) if learned_at_start else None)
                    or g("predicted_peak_switched"),
                    "standing": standing_prediction(run, decided, after),
                    "at_need": None if learned_at_start else g("predicted_peak_at_need"),
                    "at_need_basis": basis_label(d.get("at_need_basis", "") if d else ""),
                    "need_growth": (int(d["realized_peak_requested"]) /
                                    int(d["predicted_peak_requested"]))
                    if d and d.get("realized_peak_requested") and
                    int(d.get("predicted_peak_requested") or 0) > 0 else None,
                    "review": g("best_reachable_peak"),
                    "daemon_realised": g("realized_peak"),
                    "realised": realised, "whole": peak_from(run, 0),
                    "staying": stay,
                    "staying_whole": peak_from(staying, 0, steps) if staying else None,
                    "best": best[0], "best_name": best[1],
                    "configs": (run.get("allocd") or {}).get("config"),
                    "learned_at_start": learned_at_start,
                    "best_whole": min((v for r in natives.values() if r
                                       for v in [peak_from(r, 0, steps)] if v is not None),
                                      default=None),
                    "start_source": start_source,
                }


def main():
    args = sys.argv[1:]
    workloads = WORKLOADS
    if "--workloads" in args:
        i = args.index("--workloads")
        workloads = args[i + 1].split(",")
        del args[i:i + 2]
    dirs = args
    all_rows = list(rows(dirs, workloads))
    print("| job | start | mode | pushed at step (decided at) | trigger | trigger -> ACK | "
          "predicted | review (best reachable) | realised after | staying, same steps | "
          "best native from step 0, same steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in all_rows:
        if r["learned_at_start"]:
            at = "0 (learned)"
        elif r["push_step"] is not None:
            at = f"{r['push_step']} ({fmt_int(r['decided_at'])})"
        else:
            at = f"- ({fmt_int(r['first_decided_at'])})" if r["decisions"] else "-"
        more = len(r["decisions"]) - 1
        trig = r["trigger"] + (f" +{more}" if more > 0 else "")
        best = f"{fmt(r['best'])} ({SHORT[r['best_name']]})" if r["best_name"] else "-"
        print(f"| {r['workload']} | {SHORT[r['start']]} | {r['mode']} | {at} | {trig} | "
              f"{fmt(r['ack'], ' s')} | {fmt(r['predicted'])} | {fmt(r['review'])} | "
              f"{fmt(r['realised'])} | {fmt(r['staying'])} | {best} |")
    print()
    print("Targets, run by run (realised: the steps after the push, else the whole run):")
    print()
    print("| job | start | mode | decided at step | realised vs predicted | "
          "realised vs prediction standing at its peak | "
          "realised vs predicted at its need (need growth) | "
          "realised vs best native | realised vs staying | whole run vs staying | ACK <= 5 s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in all_rows:
        real = r["realised"] if r["realised"] is not None else r["whole"]
        stay = r["staying"] if r["realised"] is not None else r["staying_whole"]
        p = lambda v: "-" if v is None else f"{v:+.1f}%"
        dec = ("registration" if r["learned_at_start"] else fmt_int(r["first_decided_at"]))
        ack = "-" if r["ack"] is None else ("yes" if r["ack"] <= 5 else "no")
        growth = "" if r["need_growth"] is None else f" ({r['need_growth']:.2f}x{r['at_need_basis']})"
        print(f"| {r['workload']} | {SHORT[r['start']]} | {r['mode']} | {dec} | "
              f"{p(pct(r['realised'], r['predicted']))} | "
              f"{p(pct(r['realised'], r['standing']))} | "
              f"{p(pct(r['realised'], r['at_need']))}{growth} | "
              f"{p(pct(real, r['best']))} | "
              f"{p(pct(real, stay))} | {p(pct(r['whole'], r['staying_whole']))} | {ack} |")
    print()
    whole_job_table(all_rows)
    print()
    print("Decisions (daemon history), per run:")
    print()
    for r in all_rows:
        for d in r["decisions"]:
            marks = re.search(r"the job marked (\d+) steps", d.get("why", ""))
            print(f"- {r['workload']} {SHORT[r['start']]} {r['mode']}: #{d['id']} "
                  f"{d['trigger']} {d['result']} -> {d.get('to_config', '-')}, at step "
                  f"{fmt_int(steps_before(r['run'], d['unix_micros']))}"
                  f" ({marks.group(1) if marks else '?'} marks in window), predicted "
                  f"{fmt(int(d['predicted_peak_switched']) / GIB if d.get('predicted_peak_switched') else None)}"
                  f", at the need after it "
                  f"{fmt(int(d['predicted_peak_at_need']) / GIB if d.get('predicted_peak_at_need') else None)}"
                  f", realised (daemon) "
                  f"{fmt(int(d['realized_peak']) / GIB if d.get('realized_peak') else None)}"
                  f", ack {fmt(d.get('trigger_to_ack_seconds'), ' s')}")


def whole_job_table(all_rows):
    """Issue 40's targets: a job fits only if its whole-run peak does, so the
    whole run (from step 0, the steps before any push included) against the
    best config run natively from step 0; the steps after the decision
    against the best; the whole run against staying."""
    print("The whole job (whole run from step 0; first runs: within 1.05x of the best native "
          "from step 0; after the decision: within 5%; never above staying):")
    print()
    print("| job | start | mode | started on | first step on the pushed config | whole run | "
          "best native from step 0 | whole vs best | after decision vs best | "
          "whole vs staying | targets |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    p = lambda v: "-" if v is None else f"{v:+.1f}%"
    for r in all_rows:
        whole_vs_best = pct(r["whole"], r["best_whole"])
        after = pct(r["realised"], r["best"]) if r["realised"] is not None else None
        vs_staying = pct(r["whole"], r["staying_whole"])
        first_run = r["mode"] not in JOB_MODE
        met = (whole_vs_best is not None and whole_vs_best <= 5.0 and
               (after is None or after <= 5.0) and (vs_staying is None or vs_staying <= 0.05))
        first = "-" if r["push_step"] is None else str(r["push_step"])
        print(f"| {r['workload']} | {SHORT[r['start']]} | {r['mode']} | "
              f"{r['start_source'] or '-'} | {first} | {fmt(r['whole'])} | "
              f"{fmt(r['best_whole'])} | {p(whole_vs_best)} | {p(after)} | {p(vs_staying)} | "
              f"{('met' if met else 'MISSED') + ('' if first_run else ' (second run)')} |")


def basis_label(basis):
    """What a push's prediction at need was scaled from, in a word: the
    push's own (nothing), a replay of the canary's events after the push,
    or a later decision that kept the pushed config."""
    if not basis:
        return ""
    if "replayed on the" in basis:
        return "; replay"
    return "; " + basis.split(",")[0]


def fmt_int(v):
    return "-" if v is None else str(v)


if __name__ == "__main__":
    main()
