"""malloc+free through PyTorch, native caching allocator vs allocd managed
mode: the fast path (a cached block of the same size on the same stream),
timed per pair over many iterations. Run once per mode, in a fresh process.

    python malloc_bench.py --mode native|allocd [--socket PATH] [--json OUT]
"""
import argparse
import json
import time

SIZES = {"512B": 512, "1MiB": 1 << 20, "64MiB": 64 << 20}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["native", "allocd"], required=True)
    p.add_argument("--socket", default="/run/allocd/allocd.sock")
    p.add_argument("--iterations", type=int, default=200000)
    p.add_argument("--json")
    a = p.parse_args()
    import torch
    if a.mode == "allocd":
        import allocd
        allocd.enable(socket=a.socket, job="malloc-bench", required=True)
    torch.cuda.init()
    stream = torch.cuda.current_stream().cuda_stream
    alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    result = {"mode": a.mode, "iterations": a.iterations, "us_per_pair": {}, "us_per_tensor": {}}
    for name, size in SIZES.items():
        free(alloc(size, 0, stream))  # warm: the block is cached
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(a.iterations):
                free(alloc(size, 0, stream))
            best = min(best, (time.perf_counter() - start) / a.iterations * 1e6)
        result["us_per_pair"][name] = best
        # What a training loop pays: a tensor made and dropped.
        numel = max(1, size // 4)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(a.iterations // 4):
                t = torch.empty(numel, device="cuda")
                del t
            best = min(best, (time.perf_counter() - start) / (a.iterations // 4) * 1e6)
        result["us_per_tensor"][name] = best
    text = json.dumps(result)
    print(text)
    if a.json:
        open(a.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
