"""A job that is not llama-like: ResNet-50 trained on multi-scale images
(the batch's resolution changes every step, as with multi-scale augmentation),
with each step's peak reserved memory and the allocator config it ended on.

    python resnet_train.py --mode native|advise|transparent [--steps N]
        [--socket PATH] [--job NAME] [--snapshot OUT.pickle] [--json OUT]
        [--autotune-mode off|recommend|apply] [--deterministic]

--mode advise keeps PyTorch's allocator and calls allocd.advise(); --mode
transparent calls allocd.enable() before importing torch (PyTorch's allocator
on the daemon's memory). Both let the daemon's autotuner push configs.
--snapshot records the allocator history of the whole run (for `allocd tune`
offline).
"""
import argparse
import json
import os
import random
import time

import deterministic
import tuned_job


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["native", "advise", "transparent"], required=True)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--job", default="resnet50")
    p.add_argument("--snapshot")
    p.add_argument("--json")
    p.add_argument("--autotune-mode", choices=["off", "recommend", "apply"],
                   help="the job's autotune mode (default: the daemon's); recommend decides "
                        "without pushing, so every step runs on the config it started with")
    deterministic.add_argument(p)
    a = p.parse_args()
    deterministic.before_torch(a)
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job=a.job, required=True, autotune_mode=a.autotune_mode)
    import torch
    import torchvision
    deterministic.after_torch(a, torch)
    if a.mode == "advise":
        import allocd
        allocd.advise(socket=a.socket, job=a.job, required=True, period=0.5,
                      autotune_mode=a.autotune_mode)
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(0)
    losses, peaks, allocated, configs, ends = [], [], [], [], []
    for _ in range(a.steps):
        size = rng.choice([160, 192, 224, 256, 288, 320])
        x = torch.randn(64, 3, size, size, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        ends.append(time.time())
        peaks.append(torch.cuda.max_memory_reserved())
        allocated.append(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        if a.mode != "native":
            configs.append(allocd.stats().get("config", ""))
        elif tuned_job.autostarted():
            # An unchanged script under `allocd run`: read only.
            configs.append(tuned_job.config_now(tuned_job.autostarted()))
    if a.snapshot:
        torch.cuda.memory._dump_snapshot(a.snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    result = {"mode": a.mode, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "steps": a.steps, "losses": losses, "step_peak_reserved": peaks,
              "step_peak_allocated": allocated,
              "step_config": configs, "step_end_unix": ends, "peak_reserved": max(peaks)}
    if a.mode != "native" or tuned_job.autostarted():
        try:
            s = (allocd if a.mode != "native" else tuned_job.autostarted()).stats()
            result["allocd"] = {k: s[k] for k in tuned_job.STATS_KEYS if k in s}
        except Exception as error:  # noqa: BLE001
            result["allocd"] = {"error": str(error)}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
