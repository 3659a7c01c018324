"""Summarises transparent_validation.sh's OUT folder: OUT/summary.json and a
Markdown table on stdout.

    python summarize_transparent.py OUT
"""
import json
import math
import os
import statistics
import sys


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def compat(out):
    rows = []
    for suffix in ("", "_expandable"):
        native = load(out, f"compat_native{suffix}.json")
        ours = load(out, f"compat_transparent{suffix}.json")
        if not native or not ours:
            continue
        for name, n in native["checks"].items():
            t = ours["checks"].get(name, {"ok": False, "error": "not run"})
            note = ""
            if name == "training_step" and n["ok"] and t["ok"]:
                same = n["value"]["losses"] == t["value"]["losses"]
                note = (f"losses {'identical' if same else 'DIFFER'}, peak reserved "
                        f"{n['value']['peak_reserved']} vs {t['value']['peak_reserved']}")
            elif not t["ok"]:
                note = t["error"][:120]
            rows.append({"check": name + suffix, "native": n["ok"], "transparent": t["ok"],
                         "note": note})
    return rows


def steady_median(run, warmup=10):
    return statistics.median(run["step_seconds"][warmup:])


def pool_counter(status, key):
    return int(status.get(key, 0))


def trim_cost(out):
    """A job on a warm pool against the same job after `allocctl pool trim`:
    model to GPU and first step, and the chunks the trimmed pool created."""
    pairs = []
    for i in range(1, 4):
        warm, cold = load(out, f"trim_warm_{i}.json"), load(out, f"trim_cold_{i}.json")
        before, after = load(out, f"trim_cold_{i}_before.json"), load(out, f"trim_cold_{i}_pool.json")
        if not (warm and cold and before and after):
            continue
        pairs.append({
            "model_to_gpu_s": [warm["model_to_gpu_seconds"], cold["model_to_gpu_seconds"]],
            "first_step_s": [warm["step_seconds"][0], cold["step_seconds"][0]],
            "chunks_created_by_cold_job": pool_counter(after, "chunks_created_total")
            - pool_counter(before, "chunks_created_total"),
            "cached_bytes_after_trim": pool_counter(before, "free_bytes"),
            "losses_identical": warm["losses"] == cold["losses"],
        })
    if not pairs:
        return None
    slowdown = [(p["model_to_gpu_s"][1] + p["first_step_s"][1])
                - (p["model_to_gpu_s"][0] + p["first_step_s"][0]) for p in pairs]
    idle = load(out, "trim_idle_pool.json") or {}
    return {"pairs": pairs, "cold_minus_warm_s": slowdown,
            "cold_minus_warm_median_s": statistics.median(slowdown),
            "idle_after_trim_after": {"in_use_bytes": pool_counter(idle, "in_use_bytes"),
                                      "cached_bytes": pool_counter(idle, "free_bytes"),
                                      "trimmed_bytes_total": pool_counter(idle, "trimmed_bytes_total")}}


def handover(out):
    """llama_lora natively and transparent: handed its last working set
    from the daemon's cache ("again") and not ("off"), each after a run
    whose chunks the daemon made; losses, peaks, time to the first step,
    and what each run took from the pool."""
    native = load(out, "handover_native.json")
    if not native:
        return None
    result = {}
    previous = load(out, "handover_native_pool.json")
    for run in ("first", "again", "refill", "off"):
        r, pool = load(out, f"handover_{run}.json"), load(out, f"handover_{run}_pool.json")
        if not (r and pool and previous):
            continue
        result[run] = {
            "losses_identical": r["losses"] == native["losses"],
            "peak_reserved": [native["peak_reserved"], r["peak_reserved"]],
            "model_to_gpu_s": r["model_to_gpu_seconds"],
            "first_step_s": r["step_seconds"][0],
            "chunks_created": pool_counter(pool, "chunks_created_total")
            - pool_counter(previous, "chunks_created_total"),
            "chunks_client_made": pool_counter(pool, "chunks_client_made_total")
            - pool_counter(previous, "chunks_client_made_total"),
        }
        previous = pool
    result["native"] = {"model_to_gpu_s": native["model_to_gpu_seconds"],
                        "first_step_s": native["step_seconds"][0]}
    return result


def main():
    out = sys.argv[1]
    summary = {"compat": compat(out)}
    print("| check | native | transparent | note |\n|---|---|---|---|")
    for r in summary["compat"]:
        print(f"| {r['check']} | {'ok' if r['native'] else 'FAIL'} | "
              f"{'ok' if r['transparent'] else 'FAIL'} | {r['note']} |")
    engine = load(out, "compat_engine.json")
    if engine:
        summary["engine_compat"] = {"checks": engine["summary"],
                                    "all_expected_passed": engine["all_expected_passed"]}
        print("\nengine mode (reduce_overhead is expected to fail):",
              json.dumps(summary["engine_compat"]))
    for workload in ("llama_lora", "resnet"):
        runs = {run: load(out, f"train_{workload}_{run}.json")
                for run in ("native", "native_control", "transparent", "transparent_again")}
        if runs["transparent_again"] is None:  # runs before the handover had none
            del runs["transparent_again"]
        if not all(runs.values()):
            continue
        native = runs["native"]
        summary.setdefault("train", {})[workload] = {
            "steps": native["steps"],
            "native_losses_repeat": runs["native_control"]["losses"] == native["losses"],
            "losses_identical": runs["transparent"]["losses"] == native["losses"],
            "losses_identical_handed_over": (runs["transparent_again"]["losses"] == native["losses"]
                                             if "transparent_again" in runs else None),
            "peak_reserved": {run: r["peak_reserved"] for run, r in runs.items()},
            "gpu_used_mib_peak": {run: r.get("gpu_used_mib_peak") for run, r in runs.items()},
            "transparent_config": runs["transparent"].get("allocd", {}).get("config"),
        }
        print(f"\ntrain {workload}:", json.dumps(summary["train"][workload]))
    ratios = []
    for i in range(1, 6):
        n, t = load(out, f"step_native_{i}.json"), load(out, f"step_transparent_{i}.json")
        if n and t:
            ratios.append(steady_median(t) / steady_median(n))
    if ratios:
        summary["step_time_ratio"] = {"median": statistics.median(ratios), "min": min(ratios),
                                      "max": max(ratios), "pairs": ratios}
        print("\nstep time transparent/native:", json.dumps(summary["step_time_ratio"]))
    # The working set's interleaved triples: each kind's first round against
    # native's first round of the same triple.
    kinds = ("cold", "cold_read_ahead", "cold_daemon_creates", "warm", "warm_read_ahead",
             "warm_handover")
    triples = []
    for i in range(1, 13):
        native = load(out, f"workset_native_{i}.json")
        if not native:
            continue
        row = {"native_ms": [round(r * 1000, 2) for r in native["rounds"]]}
        for k in kinds:
            run = load(out, f"workset_{k}_{i}.json")
            if run:
                row[f"{k}_ms"] = [round(r * 1000, 2) for r in run["rounds"]]
                row[f"{k}_ratio"] = run["rounds"][0] / native["rounds"][0]
        before, after = load(out, f"workset_cold_{i}_before.json"), load(out, f"workset_cold_{i}_pool.json")
        if before and after:
            # A cold run that made nothing (daemon or client) was not cold.
            row["cold_chunks_created"] = (pool_counter(after, "chunks_created_total")
                                          - pool_counter(before, "chunks_created_total"))
            row["cold_chunks_client_made"] = (pool_counter(after, "chunks_client_made_total")
                                              - pool_counter(before, "chunks_client_made_total"))
            row["cached_bytes_before_cold"] = pool_counter(before, "free_bytes")
        triples.append(row)
    if triples:
        summary["working_set"] = {"triples": triples}
        for k in kinds:
            ratios = [t[f"{k}_ratio"] for t in triples if f"{k}_ratio" in t]
            if ratios:
                summary["working_set"][f"{k}_ratio_median"] = statistics.median(ratios)
        print("\n40 GiB working set:", json.dumps(summary["working_set"]))
    peaks = [load(out, f"peaks_transparent_{i}.json") for i in (0, 1)]
    if all(peaks):
        summary["peaks"] = peaks
    kb, ka = load(out, "kill_before.json"), load(out, "kill_after.json")
    if kb and ka:
        summary["kill"] = {"in_use_before": kb.get("in_use_bytes"), "in_use_after": ka.get("in_use_bytes", "0")}  # JSON leaves out a 0
        print("\nkill -9 of a holder:", json.dumps(summary["kill"]))
    dk = load(out, "train_transparent_daemon_killed.json")
    if dk:
        # Not deterministic (the daemon is killed mid-run): every step done,
        # every loss a number, is what it shows.
        summary["daemon_killed"] = {"steps": dk["steps"], "steps_done": len(dk["losses"]),
                                    "losses_finite": all(math.isfinite(x) for x in dk["losses"])}
        print("daemon killed mid-training:", json.dumps(summary["daemon_killed"]))
    handed = handover(out)
    if handed:
        summary["handover"] = handed
        print("\nhandover:", json.dumps(handed))
    trim = trim_cost(out)
    if trim:
        summary["trim"] = trim
        print("\ntrim:", json.dumps(trim))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
