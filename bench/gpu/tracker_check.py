"""The C++ allocation-stream tracker against PyTorch's own history, on a GPU.

Builds allocd/_trace_tracker.cpp against this PyTorch (timed), reads one
workload's alloc/free stream both ways at once (two streams, a
record_stream'd tensor whose free completes late, sizes small and large)
and compares them event by event; then the cost of each way per event, as
the time of allocating and freeing 200,000 small tensors with neither, with
the tracker, and with the history read every 20,000 events:

    python tracker_check.py [--json OUT]

Exit 0 when the two streams are identical.
"""
import argparse
import json
import time

import torch

from allocd import _history, _tracker


def workload():
    side = torch.cuda.Stream()
    keep = []
    for i in range(200):
        a = torch.empty((i % 7 + 1) * 1000, device="cuda")
        b = torch.empty((i % 3 + 1) << 20, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(side):
            c = torch.empty(4096, device="cuda")
            c.record_stream(torch.cuda.current_stream())
        keep.append(a)
        del b, c
    del keep
    torch.cuda.synchronize()


def churn(n, reader=None, every=20000):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(n):
        torch.empty(256, device="cuda")
        if reader is not None and i % every == every - 1:
            reader.read()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    a = p.parse_args()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    t0 = time.perf_counter()
    path = _tracker.build(torch)
    built_s = time.perf_counter() - t0
    tracker = _tracker.TrackerReader.for_torch(torch, torch.cuda.current_device())
    history = _history.HistoryReader(torch, torch.cuda.current_device())
    tracker.start()
    history.start()
    workload()
    got = [list(zip(*r[:4])) for r in (tracker.read(), history.read())]
    history.stop()
    identical = got[0] == got[1]
    first_difference = next((i for i, (x, y) in enumerate(zip(*got)) if x != y), None)
    n = 200000
    costs = {"none": churn(n)}
    costs["tracker"] = churn(n, tracker)
    tracker.stop()
    history.start()
    costs["history"] = churn(n, history)
    history.stop()
    per_event_ns = {k: (v - costs["none"]) / (3 * n) * 1e9 for k, v in costs.items() if k != "none"}
    result = {"torch": torch.__version__, "library": path, "build_seconds": built_s,
              "events": [len(g) for g in got], "identical": identical,
              "first_difference": first_difference,
              "first_difference_events": None if first_difference is None else
              [g[first_difference] if first_difference < len(g) else None for g in got],
              "churn_seconds": costs, "extra_ns_per_event": per_event_ns}
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
