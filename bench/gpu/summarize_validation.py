"""Folds the files run_validation.sh wrote into one JSON document of results.

    python summarize_validation.py WORKDIR OUT.json
"""
import json
import os
import statistics
import sys


def load(work, name):
    path = os.path.join(work, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def read(work, name):
    path = os.path.join(work, name)
    return open(path).read().strip() if os.path.exists(path) else None


def steady_step(run, skip=5):
    times = run["step_seconds"][skip:]
    return statistics.median(times) if times else None


def loss_diff(a, b):
    if not a or not b:
        return None
    return max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))


def main():
    work, out = sys.argv[1:]
    r = {"gpu": read(work, "gpu.csv")}
    tests = load(work, "cuda_chunks_test.json")
    if tests:
        r["cuda_chunks_test"] = {"tests": tests.get("tests"), "failures": tests.get("failures"),
                                 "disabled": tests.get("disabled")}
    r["cuda_chunk_bench"] = load(work, "cuda_chunk_bench.json")

    runs = {name: load(work, f"train_{name}.json")
            for name in ("native", "native_expandable", "allocd", "allocd_expandable",
                         "allocd_daemon_killed")}
    native, expandable, managed = runs["native"], runs["native_expandable"], runs["allocd"]
    managed_expandable = runs["allocd_expandable"]
    train = {}
    for name, run in runs.items():
        if run is None:
            train[name] = None
            continue
        train[name] = {
            "steps": len(run["losses"]),
            "peak_reserved": run["peak_reserved"],
            "peak_allocated": run["peak_allocated"],
            "gpu_used_mib_delta": run["gpu_used_mib_peak"] - run["gpu_used_mib_before"],
            "median_step_s_after_5": steady_step(run),
            "losses_first_last": [run["losses"][0], run["losses"][-1]] if run["losses"] else None,
            "allocd": run.get("allocd"),
        }
    r["train"] = train
    if native and managed:
        r["train_compare"] = {
            "max_loss_diff_allocd_vs_native": loss_diff(managed, native),
            "max_loss_diff_expandable_vs_native": loss_diff(expandable, native),
            "max_loss_diff_daemon_killed_vs_allocd": loss_diff(runs["allocd_daemon_killed"], managed),
            "step_time_allocd_over_native": steady_step(managed) / steady_step(native),
            "peak_reserved_allocd_over_native": managed["peak_reserved"] / native["peak_reserved"],
            "peak_reserved_allocd_over_its_peak_allocated":
                managed["peak_reserved"] / managed["peak_allocated"],
            "torch": managed["torch"], "device": managed["device"],
        }
    if expandable and managed_expandable:
        r["train_compare_expandable"] = {
            "max_loss_diff_allocd_vs_native": loss_diff(managed_expandable, expandable),
            "step_time_allocd_over_native":
                steady_step(managed_expandable) / steady_step(expandable),
            "peak_reserved_allocd_over_native":
                managed_expandable["peak_reserved"] / expandable["peak_reserved"],
            "peak_reserved_allocd_over_its_peak_allocated":
                managed_expandable["peak_reserved"] / managed_expandable["peak_allocated"],
        }
    step_runs = {mode: [r for r in (load(work, f"step_{mode}_{i}.json") for i in (1, 2, 3)) if r]
                 for mode in ("native", "allocd")}
    if step_runs["native"] and step_runs["allocd"]:
        medians = {mode: [steady_step(r, skip=10) for r in runs] for mode, runs in step_runs.items()}
        r["step_time_fixed_shape"] = {
            "shape": "4x512", "steps": step_runs["native"][0]["steps"],
            "median_step_s_after_10": medians,
            "allocd_over_native": statistics.median(medians["allocd"]) /
                                  statistics.median(medians["native"]),
        }
    mn, ma = load(work, "malloc_native.json"), load(work, "malloc_allocd.json")
    if mn and ma:
        r["malloc_free"] = {
            "native_us": mn, "allocd_us": ma,
            "ratio_pair": {k: ma["us_per_pair"][k] / mn["us_per_pair"][k] for k in mn["us_per_pair"]},
            "ratio_tensor": {k: ma["us_per_tensor"][k] / mn["us_per_tensor"][k]
                             for k in mn["us_per_tensor"]},
        }
    r["alternating_peaks"] = {mode: [load(work, f"peaks_{mode}_{i}.json") for i in (0, 1)]
                              for mode in ("native", "allocd")}
    before, after = load(work, "kill_before.json"), load(work, "kill_after.json")
    r["kill_job"] = {
        "status_before": before, "status_after": after,
        "gpu_used_mib_before_kill": read(work, "kill_used_before"),
        "gpu_used_mib_after_kill": read(work, "kill_used_after"),
        "gpu_used_mib_daemon_stopped": read(work, "used_daemon_stopped"),
    }
    text = json.dumps(r, indent=1)
    with open(out, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
