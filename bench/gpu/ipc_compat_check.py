"""A producer that shares CUDA tensors with a consumer that cannot
pidfd_getfd it, before and after allocd's autotuner decides: the consumer
must open every tensor (issue 40, deliver 2; docs/compatibility.md).

    python ipc_compat_check.py produce --address ADDR --json OUT [--socket S --job J]
                                       [--expandable-at STEP] [--steps N]
    python ipc_compat_check.py consume --address ADDR

produce listens on the Unix socket ADDR, waits for one consumer, then trains
a small model for --steps optimizer steps (sizes that vary by step, so that
a daemon in apply mode started on max_split_size_mb:64 wants to push) and,
from step 2 on, sends each step a fresh CUDA tensor the way
torch.multiprocessing does (its ForkingPickler reductions: _share_cuda_).
With --socket it runs under allocd.advise() (the daemon's autotuner sees
the share and must never push expandable segments); --expandable-at STEP
turns expandable segments on natively at that step (what the autotuner must
not do: the control that shows the consumer breaking). The consumer checks
each tensor's sum and answers; the JSON says, per step, whether the
consumer opened it, the allocator config the producer ran, and what
allocd's session said. Start the consumer as another uid or in another PID
namespace (ipc_compat_check.sh does).
"""
import argparse
import io
import json
import os
import pickle
import sys
import time
from multiprocessing.connection import Client, Listener

import torch
import torch.multiprocessing  # noqa: F401  (registers the CUDA reductions)
from multiprocessing.reduction import ForkingPickler  # torch.multiprocessing registers its reductions on it


def produce(args):
    if args.socket:
        import allocd
        if not allocd.advise(socket=args.socket, job=args.job, period=0.1,
                             autotune_mode="apply"):
            sys.exit("allocd.advise() found no daemon")
    listener = Listener(args.address, family="AF_UNIX")
    os.chmod(args.address, 0o777)
    conn = listener.accept()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows, kept = [], []
    for step in range(args.steps):
        if args.expandable_at is not None and step == args.expandable_at:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
            torch.cuda.empty_cache()
        batch = 256 * (1 + (step * 7) % 5)
        x = torch.randn(batch, 2048, device="cuda")
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        row = {"step": step, "batch": batch}
        if step >= 2:
            shared = torch.full((batch, 1024), float(step), device="cuda")
            torch.cuda.synchronize()
            buf = io.BytesIO()
            ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(
                (step, shared, float(step) * shared.numel()))
            conn.send_bytes(buf.getvalue())
            answer = conn.recv()
            row.update(answer)
            kept.append(shared)  # alive until the consumer is done with it
        if args.socket:
            import allocd
            s = allocd.stats()
            row["allocd_config"] = s.get("config")
            row["configs_applied"] = s.get("configs_applied")
        rows.append(row)
        time.sleep(args.step_sleep)
    conn.send_bytes(b"")
    conn.close()
    opened = [r for r in rows if "opened" in r]
    result = {"steps": rows,
              "shared": len(opened),
              "opened": sum(1 for r in opened if r["opened"]),
              "errors": sorted({r["error"] for r in opened if r.get("error")})}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}))


def consume(args):
    conn = Client(args.address, family="AF_UNIX")
    while True:
        data = conn.recv_bytes()
        if not data:
            break
        try:
            step, tensor, expected = pickle.loads(data)
            got = tensor.double().sum().item()
            answer = {"opened": abs(got - expected) <= 1e-6 * abs(expected),
                      "consumer_sum": got, "consumer_uid": os.getuid()}
            del tensor
        except Exception as e:  # the failure is what is measured
            answer = {"opened": False, "error": f"{type(e).__name__}: {e}".splitlines()[0],
                      "consumer_uid": os.getuid()}
        conn.send(answer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["produce", "consume"])
    p.add_argument("--address", required=True)
    p.add_argument("--json")
    p.add_argument("--socket")
    p.add_argument("--job", default="ipc-producer")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--expandable-at", type=int)
    args = p.parse_args()
    produce(args) if args.role == "produce" else consume(args)


if __name__ == "__main__":
    main()
