"""Time to acquire a working set: `--gib` GiB as 2 GiB tensors, each a fresh
cudaMalloc (PyTorch's cache is empty at start), then freed. Run natively, and
under transparent managed mode once with a cold daemon pool (chunks created)
and once warm (the pool's cached chunks reused):

    python working_set.py --mode native|transparent [--gib 40] [--repeat N] [--json OUT]
                          [--no-record-events]

--repeat N acquires the working set N times in the process, freeing it with
empty_cache() in between (the cudaFrees give it back to the daemon's pool):
every round after the first is warm. "seconds" is the first round, "rounds"
all of them, "first_round_us_each" each 2 GiB tensor of the first round.
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
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--no-record-events", dest="record_events", action="store_false",
                   help="transparent: send the daemon no allocation stream (no autotuner)")
    a = p.parse_args()
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job="working-set", required=True,
                      record_events=a.record_events)
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, outside the timing
    torch.cuda.synchronize()
    rounds, first_round_each = [], []
    for _ in range(max(1, a.repeat)):
        start = time.perf_counter()
        pieces, marks = [], [start]
        for _ in range(a.gib // 2):
            pieces.append(torch.empty(2 << 30, dtype=torch.uint8, device="cuda"))
            marks.append(time.perf_counter())
        torch.cuda.synchronize()
        rounds.append(time.perf_counter() - start)
        if not first_round_each:  # where a first round slower than the next pays
            first_round_each = [round((b - a_) * 1e6) for a_, b in zip(marks, marks[1:])]
        reserved = torch.cuda.memory_reserved()
        del pieces
        torch.cuda.empty_cache()
    result = {"mode": a.mode, "gib": a.gib, "seconds": rounds[0], "rounds": rounds,
              "first_round_us_each": first_round_each,
              "reserved": reserved,
              "device_allocs": torch.cuda.memory_stats()["num_device_alloc"]}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
