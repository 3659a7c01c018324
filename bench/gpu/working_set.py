"""Time to acquire a working set: `--gib` GiB as 2 GiB tensors, each a fresh
cudaMalloc (PyTorch's cache is empty at start), then freed. Run natively, and
under transparent managed mode once with a cold daemon pool (chunks created)
and once warm (the pool's cached chunks reused):

    python working_set.py --mode native|transparent [--gib 40] [--json OUT]
"""
import argparse
import json
import os
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["native", "transparent"], required=True)
    p.add_argument("--gib", type=int, default=40)
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--json")
    a = p.parse_args()
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job="working-set", required=True)
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, outside the timing
    torch.cuda.synchronize()
    start = time.perf_counter()
    pieces = [torch.empty(2 << 30, dtype=torch.uint8, device="cuda") for _ in range(a.gib // 2)]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"mode": a.mode, "gib": a.gib, "seconds": seconds,
              "reserved": torch.cuda.memory_reserved(),
              "device_allocs": torch.cuda.memory_stats()["num_device_alloc"]}
    del pieces
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
