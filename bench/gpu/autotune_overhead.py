"""What advisor mode's recording costs a training step (issue 12: at most 1%).

Runs the same fixed-shape training step natively and under
allocd.advise() (which reads PyTorch's allocator history every --period
seconds and streams it to the daemon's autotuner), each run in a fresh
process, native and advised runs interleaved (N, A, N, A, ...) so that
clock and thermal drift fall on both alike. Each run times --steps steps
after --warmup with CUDA events (one pair per step, read after a final
synchronize), and reports its median step time. The summary pairs run i of
each mode: the ratio advised/native per pair, its median, and the spread
(min, max, and the interquartile range).

    python bench/gpu/autotune_overhead.py --allocd build/release/tools/allocd \\
        [--pairs 8] [--steps 200] [--warmup 30] [--period 1.0] [--json OUT]

It starts its own daemon (`allocd serve --backend sim --autotune recommend`:
advisor mode takes no memory from it, and recommend runs the replays a real
node would) on a temporary socket. PYTHONPATH must reach the allocd package
(build/release/python).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run_one(a):
    """One run in this process: prints {"median_ms": ..., "steps_ms": [...]}."""
    import torch
    if a.mode == "advised":
        import allocd
        allocd.advise(socket=a.socket, job="overhead", period=a.period, required=True)
    torch.manual_seed(0)
    device = torch.device("cuda")
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, 4 * a.width), torch.nn.GELU(),
                   torch.nn.Linear(4 * a.width, a.width), torch.nn.LayerNorm(a.width)]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, a.seq, a.width, device=device, dtype=torch.bfloat16)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(a.steps)]
    for begin, end in events:
        begin.record()
        step()
        end.record()
    torch.cuda.synchronize()
    steps_ms = [begin.elapsed_time(end) for begin, end in events]
    out = {"mode": a.mode, "median_ms": statistics.median(steps_ms), "steps_ms": steps_ms}
    if a.mode == "advised":
        import allocd
        stats = allocd.stats()
        out["events_sent"] = stats["events_sent"]
        out["events_dropped"] = stats["events_dropped"]
        allocd.shutdown()
    print(json.dumps(out))


def quartiles(values):
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocd", help="the allocd binary (the parent starts the daemon)")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--period", type=float, default=1.0, help="advisor round, seconds")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--json")
    p.add_argument("--mode", choices=["native", "advised"], help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mode:
        run_one(a)
        return
    if not a.allocd:
        p.error("--allocd is required")

    workdir = tempfile.mkdtemp(prefix="allocd_overhead_")
    socket = os.path.join(workdir, "allocd.sock")
    daemon = subprocess.Popen([a.allocd, "serve", "--backend", "sim", "--socket", socket,
                               "--metrics-addr", "", "--capacity", "1GiB",
                               "--autotune", "recommend"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if os.path.exists(socket):
                break
            time.sleep(0.01)
        child = [sys.executable, os.path.abspath(__file__), "--socket", socket,
                 "--steps", str(a.steps), "--warmup", str(a.warmup), "--period", str(a.period),
                 "--layers", str(a.layers), "--width", str(a.width), "--batch", str(a.batch),
                 "--seq", str(a.seq)]
        runs = {"native": [], "advised": []}
        for i in range(a.pairs):
            for mode in ("native", "advised"):
                out = subprocess.run(child + ["--mode", mode], check=True, capture_output=True,
                                     text=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                runs[mode].append(result)
                print(f"pair {i} {mode:8s} median step {result['median_ms']:.3f} ms", flush=True)
    finally:
        daemon.terminate()
        daemon.wait()

    ratios = [adv["median_ms"] / nat["median_ms"]
              for nat, adv in zip(runs["native"], runs["advised"])]
    median = statistics.median(ratios)
    q1, q3 = quartiles(ratios) if len(ratios) >= 2 else (ratios[0], ratios[0])
    import torch
    summary = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "pairs": a.pairs, "steps": a.steps, "period_s": a.period,
        "native_median_ms": statistics.median(r["median_ms"] for r in runs["native"]),
        "advised_median_ms": statistics.median(r["median_ms"] for r in runs["advised"]),
        "ratio_median": median, "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ratio_q1": q1, "ratio_q3": q3,
        "overhead_percent": (median - 1) * 100,
        "events_sent": [r.get("events_sent") for r in runs["advised"]],
        "events_dropped": [r.get("events_dropped") for r in runs["advised"]],
    }
    print(f"advised/native step time: median {median:.4f} "
          f"(overhead {summary['overhead_percent']:+.2f}%), "
          f"IQR {q1:.4f}..{q3:.4f}, range {min(ratios):.4f}..{max(ratios):.4f} over {a.pairs} pairs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
