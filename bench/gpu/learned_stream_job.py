"""A job for bench/gpu/learned_stream.sh, with allocd.advise() (or, with
--transparent, allocd.enable()) unless --native.

    python learned_stream_job.py [--native | --transparent] [--job LABEL] [--socket S]
        [--steps 60] [--grow]
    python learned_stream_job.py --transparent --cache-gib G [--wait-s 30] ...
    python learned_stream_job.py --transparent --hold-gib G [--hold-s 3] ...
    python learned_stream_job.py --own-history before|after ...

Training (the default): an MLP trained at one batch size, then (--grow) at
four times it. One JSON line after each phase: PyTorch's peak reserved
bytes, and with allocd the stream's state (allocd.stats()), which a first
line gives as the job starts.
--cache-gib: G GiB allocated and freed (kept in PyTorch's cache), then one
JSON line once the stream started or --wait-s passed: what a neighbour's
reclaim of that cache did to a learned run's deferred stream.
--hold-gib: the neighbour, G GiB held for --hold-s seconds.
--own-history: the job records PyTorch's allocator history itself
(_record_memory_history with PyTorch's defaults, as for a memory snapshot),
from before advise() or after the first phase; each phase's line then says
how many events the job's history holds and how many carry stack frames.
"""
import argparse
import json
import time

STREAM_KEYS = ("event_source", "stream_from_reserved", "stream_deferred_until_reserved",
               "stream_started", "stream_paused", "stream_switched", "events_sent",
               "states_sent", "steps_marked", "start_config_source", "reclaims")


def train(torch, model, opt, batch, steps):
    for _ in range(steps):
        x = torch.randn(batch, 4096, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def stream(allocd):
    if allocd is None:
        return {}
    stats = allocd.stats()
    return {k: stats.get(k) for k in STREAM_KEYS}


def own_history(torch):
    """What the job's own history holds: its events, and those with frames."""
    traces = torch.cuda.memory._snapshot().get("device_traces", [[]])[0]
    return {"own_history_events": len(traces),
            "own_history_with_frames": sum(1 for e in traces if e.get("frames"))}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--native", action="store_true")
    p.add_argument("--transparent", action="store_true")
    p.add_argument("--job", default="learned-stream")
    p.add_argument("--socket", default="/run/allocd/allocd.sock")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--grow", action="store_true", help="a second phase at 4x the batch")
    p.add_argument("--cache-gib", type=float, default=0)
    p.add_argument("--wait-s", type=float, default=30)
    p.add_argument("--hold-gib", type=float, default=0)
    p.add_argument("--hold-s", type=float, default=3)
    p.add_argument("--own-history", choices=["before", "after"])
    a = p.parse_args()
    allocd = None
    if a.transparent:
        import allocd
        allocd.enable(socket=a.socket, job=a.job, required=True, mode="transparent")
    import torch
    if a.own_history == "before":
        torch.cuda.memory._record_memory_history()
    if not a.native and not a.transparent:
        import allocd
        allocd.advise(socket=a.socket, job=a.job, required=True)
    if a.hold_gib or a.cache_gib:
        held = torch.empty(int((a.hold_gib or a.cache_gib) * (1 << 30)), dtype=torch.uint8,
                           device="cuda")
        torch.cuda.synchronize()
        if a.hold_gib:
            time.sleep(a.hold_s)
            print(json.dumps({"held_gib": a.hold_gib, **stream(allocd)}), flush=True)
            return
        del held
        print(json.dumps({"cached_gib": a.cache_gib, **stream(allocd)}), flush=True)
        deadline = time.monotonic() + a.wait_s
        while stream(allocd).get("event_source") == "deferred" and time.monotonic() < deadline:
            time.sleep(0.2)
        print(json.dumps({"after_s": round(a.wait_s - (deadline - time.monotonic()), 1),
                          "reserved": torch.cuda.memory_reserved(), **stream(allocd)}),
              flush=True)
        return
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    if allocd is not None:
        print(json.dumps({"phase": "start", **stream(allocd)}), flush=True)
    phases = [("base", 4096)] + ([("grown", 16384)] if a.grow else []) + \
        ([("recorded", 4096)] if a.own_history == "after" else [])
    for name, batch in phases:
        if name == "recorded":
            torch.cuda.memory._record_memory_history()
        train(torch, model, opt, batch, a.steps)
        # The advisor's rounds read the stats once a second: give the
        # round after the phase's peak its time.
        time.sleep(2.5)
        print(json.dumps({"phase": name, "batch": batch,
                          "peak_reserved": torch.cuda.max_memory_reserved(), **stream(allocd),
                          **(own_history(torch) if a.own_history else {})}),
              flush=True)


if __name__ == "__main__":
    main()
