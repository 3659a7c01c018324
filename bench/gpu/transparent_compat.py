"""What PyTorch offers that must keep working under allocd's transparent
managed mode: each check runs in this process and reports ok or the error.
Run it natively and under the interposer and compare:

    python transparent_compat.py --json native.json
    LD_PRELOAD=.../liballocd_interpose.so ALLOCD_SOCKET=... \\
        python transparent_compat.py --json allocd.json

--only NAME[,NAME] runs some checks; the OOM check asks for twice what
cudaMemGetInfo says the device has: under allocd, the daemon's capacity, so
give the daemon less than the GPU has to see that the refusal comes from it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def train_losses(steps=5, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        x = torch.randn(64 * (1 + step % 3), 1024, device="cuda")
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@check
def training_step():
    losses = train_losses()
    return {"losses": [float.hex(l) for l in losses],
            "peak_reserved": torch.cuda.max_memory_reserved()}


@check
def memory_stats_family():
    x = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    stats = torch.cuda.memory_stats()
    out = {
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "stats_keys": len(stats),
        "summary_lines": len(torch.cuda.memory_summary().splitlines()),
    }
    torch.cuda.reset_peak_memory_stats()
    out["max_allocated_after_reset"] = torch.cuda.max_memory_allocated()
    del x
    assert out["allocated"] >= 100 << 20
    return out


@check
def record_history_and_snapshot():
    torch.cuda.memory._record_memory_history(max_entries=10000)
    x = [torch.empty(1 << k, device="cuda") for k in range(10, 24)]
    del x
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = sum(len(t) for t in snap["device_traces"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.pickle")
        torch.cuda.memory._dump_snapshot(path)
        html = os.path.join(d, "s.html")
        subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", path,
                        "-o", html], check=True, capture_output=True, timeout=120)
        html_bytes = os.path.getsize(html)
    assert events > 0
    return {"events": events, "segments": len(snap["segments"]), "html_bytes": html_bytes}


@check
def out_of_memory_error(oom_bytes=None):
    oom_bytes = oom_bytes or ARGS.oom_bytes or 2 * torch.cuda.mem_get_info()[1]
    try:
        torch.empty(oom_bytes, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        y = torch.ones(1 << 20, device="cuda").sum().item()  # the process goes on
        return {"raised": "torch.OutOfMemoryError", "then": y, "message": str(e)[:160]}
    raise AssertionError(f"allocating {oom_bytes} bytes did not raise")


@check
def record_stream():
    s = torch.cuda.Stream()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(s):
        x.fill_(3)
    x.record_stream(s)
    del x
    torch.cuda.synchronize()
    return {"ok": True}


@check
def cuda_graph_capture():
    static_in = torch.randn(256, 256, device="cuda")
    w = torch.randn(256, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            static_out = static_in @ w
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = (static_in @ w).relu()
    static_in.copy_(torch.ones_like(static_in))
    g.replay()
    torch.cuda.synchronize()
    expected = (torch.ones_like(static_in) @ w).relu()
    assert torch.equal(static_out, expected)
    return {"ok": True}


def _compiled(mode):
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum(dim=1)
    cf = torch.compile(f, mode=mode)
    x = torch.randn(512, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    for _ in range(3):
        out = cf(x, w)
    torch.cuda.synchronize()
    assert torch.allclose(out, f(x, w), rtol=1e-3, atol=1e-2)
    return {"ok": True}


@check
def torch_compile_default():
    return _compiled(None)


@check
def torch_compile_reduce_overhead():
    return _compiled("reduce-overhead")


@check
def empty_cache_and_mem_get_info():
    x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    del x
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return {"reserved_before": before, "reserved_after": torch.cuda.memory_reserved(),
            "mem_get_info": [free, total]}


def _child(to_child, to_parent):
    t = to_child.get()
    to_parent.put(float(t.sum().item()))
    del t
    to_parent.put("done")


@check
def multiprocessing_cuda_tensor():
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    to_child, to_parent = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_child, args=(to_child, to_parent))
    p.start()
    t = torch.ones(1 << 20, device="cuda")
    to_child.put(t)
    result = to_parent.get(timeout=60)
    to_parent.get(timeout=60)  # the child let go of it before the producer does
    p.join(timeout=60)
    assert result == float(1 << 20), result
    return {"sum_in_child": result}


@check
def nccl_all_reduce():
    import torch.distributed as dist
    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("nccl", init_method=f"file://{f.name}", rank=0, world_size=1)
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.destroy_process_group()
    return {"sum": float(t.sum().item())}


@check
def dataloader_pin_memory():
    ds = torch.utils.data.TensorDataset(torch.randn(256, 64))
    dl = torch.utils.data.DataLoader(ds, batch_size=32, pin_memory=True, num_workers=2)
    total = 0.0
    for (b,) in dl:
        total += b.cuda(non_blocking=True).sum().item()
    return {"batches": len(dl)}


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--only", default="")
    p.add_argument("--oom-bytes", type=int, default=0,
                   help="default: twice what mem_get_info() says the device has")
    ARGS = p.parse_args()
    only = set(filter(None, ARGS.only.split(",")))
    results = {"torch": torch.__version__, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
               "preload": os.environ.get("LD_PRELOAD", ""), "checks": {}}
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        t0 = time.time()
        try:
            value = fn()
            results["checks"][fn.__name__] = {"ok": True, "value": value}
        except Exception as e:  # a check's failure is its result
            results["checks"][fn.__name__] = {
                "ok": False, "error": f"{type(e).__name__}: {e}"[:400],
                "where": traceback.format_exc().splitlines()[-3:]}
        results["checks"][fn.__name__]["seconds"] = round(time.time() - t0, 2)
        print(fn.__name__, "ok" if results["checks"][fn.__name__]["ok"] else "FAIL",
              results["checks"][fn.__name__].get("error", ""), flush=True)
    with open(ARGS.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
