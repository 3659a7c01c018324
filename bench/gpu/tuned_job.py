"""What the autotuner validation's workloads share (seq2seq_train.py,
generate_job.py): the modes (native, advise, transparent), each step's peak
reserved memory and the config it ended on, CUDA-event step times, and one
JSON result.

A workload gives build(torch, a) -> state and step(torch, state, rng) ->
float (its loss, or 0); run() does the rest.
"""
import argparse
import json
import os
import random
import sys
import time


def parser(doc, job):
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["native", "advise", "transparent"], required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--job", default=job)
    p.add_argument("--json", help="write the result here too")
    p.add_argument("--autotune-mode", choices=["off", "recommend", "apply"],
                   help="the job's autotune mode (default: the daemon's)")
    return p


def autostarted():
    """The allocd package when `allocd run` started it in this process (the
    script itself never imports allocd; ALLOCD_AUTOSTART=1 and allocd in
    sys.modules), else None: read only, to record the config each step of an
    unchanged script ended on."""
    if os.environ.get("ALLOCD_AUTOSTART") != "1":
        return None
    return sys.modules.get("allocd")


def config_now(allocd):
    """The config the job runs now (None: allocd not started yet)."""
    try:
        return allocd.stats().get("config", "")
    except Exception:  # noqa: BLE001 (the autostart thread may not have enabled it yet)
        return None


STATS_KEYS = ("session_id", "config", "config_version", "config_reason", "configs_applied",
              "events_sent", "events_dropped", "steps_marked", "states_sent", "event_source",
              "start_config_source")


def run(a, build, step):
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job=a.job, required=True, autotune_mode=a.autotune_mode)
    import torch
    if a.mode == "advise":
        import allocd
        allocd.advise(socket=a.socket, job=a.job, required=True, autotune_mode=a.autotune_mode)
    torch.manual_seed(a.seed)
    state = build(torch, a)
    rng = random.Random(a.seed)
    losses, times, peaks, allocated, configs, ends = [], [], [], [], [], []
    for _ in range(a.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        losses.append(step(torch, state, rng))
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
        ends.append(time.time())
        peaks.append(torch.cuda.max_memory_reserved())
        allocated.append(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        if a.mode != "native":
            configs.append(allocd.stats().get("config", ""))
        elif autostarted():
            configs.append(config_now(autostarted()))
    result = {"mode": a.mode, "job": a.job,
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "steps": a.steps, "losses": losses, "step_seconds": times,
              "step_peak_reserved": peaks, "step_peak_allocated": allocated,
              "step_config": configs,
              "step_end_unix": ends,
              "peak_reserved": max(peaks), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0)}
    if a.mode != "native" or autostarted():
        try:
            s = (allocd if a.mode != "native" else autostarted()).stats()
            result["allocd"] = {k: s[k] for k in STATS_KEYS if k in s}
        except Exception as error:  # noqa: BLE001
            result["allocd"] = {"error": str(error)}
    result["initial_alloc_conf"] = os.environ.get("ALLOCD_INITIAL_ALLOC_CONF")
    print(json.dumps(result)[:400])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
