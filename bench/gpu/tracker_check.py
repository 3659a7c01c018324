"""The C++ allocation-stream tracker against PyTorch's own history, on a GPU.

Builds allocd/_trace_tracker.cpp against this PyTorch (timed), reads one
workload's alloc/free stream both ways at once (two streams, a
record_stream'd tensor whose free completes late, sizes small and large)
and compares them event by event; then the history as the tracker's
library reads it (C++, a stream's first reader), over three rounds that
each re-arm it, against the tracker's events of the same time; then the
cost of each way per event, as
the time of allocating and freeing 200,000 small tensors with neither
(before either is attached: PyTorch cannot detach a tracker, and builds
each event for it even when it is stopped), with the tracker, and with the
history read every 20,000 events through Python and in C++ (the stopped
tracker still attached). One
run of each, in that order, so a core that changes speed meanwhile moves
them: bench/gpu/overhead.py's churn workload compares them alternately,
each in a process of its own. Then the
allocator's state read both ways (the tracker's C++ snapshot and
torch.cuda.memory_snapshot(), _allocator_state.read_state) on a job holding
thousands of blocks of every kind (held, cached, freed on a side stream and
not yet completed, in small, large and expandable segments), compared column
by column, and the time of a read each way (median of 20):

    python tracker_check.py [--json OUT]

Exit 0 when the three streams and the two states are identical.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

from allocd import _allocator_state, _history, _tracker


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


def concurrent_rounds(reader, seconds=4.0, period=0.1):
    """`reader` started and read every `period` s on a thread of its own, as
    the advisor reads it, while this thread trains an MLP whose backward
    allocates on PyTorch's autograd thread (no GIL): events read, events
    reported lost (between a round's snapshot and its re-arm), and the
    median and longest round in ms."""
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    x = torch.randn(256, 1024, device="cuda")
    done, got, rounds = threading.Event(), [0, 0], []

    def read_rounds():
        while not done.is_set():
            time.sleep(period)
            start = time.perf_counter()
            ops, _, _, _, lost = reader.read()
            rounds.append((time.perf_counter() - start) * 1e3)
            got[0] += len(ops)
            got[1] += lost

    reader.start()
    thread = threading.Thread(target=read_rounds)
    thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    done.set()
    thread.join()
    ops, _, _, _, lost = reader.read()
    reader.stop()
    return {"events": got[0] + len(ops), "lost": got[1] + lost, "rounds": len(rounds),
            "round_ms_median": statistics.median(rounds), "round_ms_max": max(rounds)}


def state_held():
    """Thousands of blocks of every kind, kept alive by the list returned:
    held (small and large), cached (every other one freed), and one freed
    while a side stream that used it still works (its free not yet completed)."""
    held = [torch.empty((i % 13 + 1) * 4096, dtype=torch.uint8, device="cuda")
            for i in range(6000)]
    held += [torch.empty((i % 5 + 1) << 21, dtype=torch.uint8, device="cuda") for i in range(300)]
    del held[::2]
    side = torch.cuda.Stream()
    pending = torch.empty(64 << 20, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(4_000_000_000)  # keeps the side stream busy past the reads
    pending.record_stream(side)
    del pending  # its free waits on the side stream
    return held


def compare_states(tracker, device, reads=20):
    """The two reads of the state held now: identical, their sizes and their
    median times."""
    ours = tracker.read_state()
    theirs = _allocator_state.read_state(torch, device)
    times = {"tracker_ms": [], "memory_snapshot_ms": []}
    for _ in range(reads):
        start = time.perf_counter()
        tracker.read_state()
        times["tracker_ms"].append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        _allocator_state.read_state(torch, device)
        times["memory_snapshot_ms"].append((time.perf_counter() - start) * 1e3)
    same = ours is not None and theirs is not None and \
        [c.tolist() for c in ours] == [c.tolist() for c in theirs]
    return {"identical": same,
            "segments": None if ours is None else len(ours[0]),
            "held_blocks": None if ours is None else len(ours[4]),
            "pending_free_blocks": None if ours is None else
            sum(1 for f in ours[8] if f & _allocator_state.BLOCK_FREE_REQUESTED),
            "expandable_segments": None if ours is None else
            sum(1 for f in ours[3] if f & _allocator_state.SEGMENT_EXPANDABLE),
            **{k: statistics.median(v) for k, v in times.items()}}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--state-only", action="store_true",
                   help="(internal) compare the two state reads in this process and print them")
    a = p.parse_args()
    if a.state_only:
        torch.cuda.init()
        tracker = _tracker.TrackerReader.for_torch(torch, torch.cuda.current_device())
        held = state_held()
        print(json.dumps(compare_states(tracker, torch.cuda.current_device())))
        del held
        return 0
    torch.cuda.init()
    torch.empty(1, device="cuda")
    n = 200000
    churn(n)  # warm
    costs = {"none": churn(n)}
    t0 = time.perf_counter()
    path = _tracker.build(torch)
    built_s = time.perf_counter() - t0
    device = torch.cuda.current_device()
    tracker = _tracker.TrackerReader.for_torch(torch, device)
    history = _history.HistoryReader(torch, device)
    tracker.start()
    history.start()
    workload()
    got = [list(zip(*r[:4])) for r in (tracker.read(), history.read())]
    history.stop()
    identical = got[0] == got[1]
    first_difference = next((i for i, (x, y) in enumerate(zip(*got)) if x != y), None)
    # The history read in C++ (a stream's first reader), over three rounds,
    # each re-arming the ring, against the tracker's events of the same time.
    native = tracker.history_reader()
    native.start()
    ours, dropped = [], 0
    for _ in range(3):
        workload()
        ops, sizes, ids, streams, lost = native.read()
        ours.extend(zip(ops, sizes, ids, streams))
        dropped += lost
    native.stop()
    theirs = list(zip(*tracker.read()[:4]))
    native_identical = ours == theirs and dropped == 0
    concurrent = {"python": concurrent_rounds(_history.HistoryReader(torch, device)),
                  "cpp": concurrent_rounds(tracker.history_reader())}
    costs["tracker"] = churn(n, tracker)
    tracker.stop()
    history.start()
    costs["history"] = churn(n, history)
    history.stop()
    native.start()
    costs["history_cpp"] = churn(n, native)
    native.stop()
    per_event_ns = {k: (v - costs["none"]) / (3 * n) * 1e9 for k, v in costs.items() if k != "none"}
    result = {"torch": torch.__version__, "library": path, "build_seconds": built_s,
              "events": [len(g) for g in got], "identical": identical,
              "first_difference": first_difference,
              "first_difference_events": None if first_difference is None else
              [g[first_difference] if first_difference < len(g) else None for g in got],
              "history_cpp": {"read_in": native.read_in, "events": [len(ours), len(theirs)],
                              "identical": native_identical, "dropped": dropped,
                              "while_training": concurrent},
              "churn_seconds": costs, "extra_ns_per_event": per_event_ns,
              "states": states()}
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    return 0 if identical and native_identical and \
        all(s["identical"] for s in result["states"].values()) else 1


def states():
    """compare_states in a fresh process per config, with and without
    expandable segments (a segment kind only a process's first config sets)."""
    out = {}
    for conf in ("", "expandable_segments:True"):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        done = subprocess.run([sys.executable, __file__, "--state-only"], env=env,
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        out[conf or "defaults"] = json.loads(lines[-1]) if lines else \
            {"identical": False, "error": done.stderr[-2000:]}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
