"""A job for bench/gpu/learned_stream.sh: an MLP trained at one batch size,
then (--grow) at four times it, with allocd.advise() unless --native.

    python learned_stream_job.py [--native] [--job LABEL] [--socket S]
        [--steps 60] [--grow]

Prints one JSON line after each phase: the phase, PyTorch's peak reserved
bytes, and with allocd the stream's state (allocd.stats(): event_source,
stream_deferred_until_reserved, stream_started, events_sent, states_sent,
steps_marked, start_config_source).
"""
import argparse
import json
import time

import torch


def phase(model, opt, batch, steps):
    for _ in range(steps):
        x = torch.randn(batch, 4096, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--native", action="store_true")
    p.add_argument("--job", default="learned-stream")
    p.add_argument("--socket", default="/run/allocd/allocd.sock")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--grow", action="store_true", help="a second phase at 4x the batch")
    a = p.parse_args()
    allocd = None
    if not a.native:
        import allocd
        allocd.advise(socket=a.socket, job=a.job, required=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for name, batch in [("base", 4096)] + ([("grown", 16384)] if a.grow else []):
        phase(model, opt, batch, a.steps)
        # The advisor's rounds read the stats once a second: give the
        # round after the phase's peak its time.
        time.sleep(2.5)
        line = {"phase": name, "batch": batch,
                "peak_reserved": torch.cuda.max_memory_reserved()}
        if allocd is not None:
            keys = ("event_source", "stream_deferred_until_reserved", "stream_started",
                    "events_sent", "states_sent", "steps_marked", "start_config_source")
            stats = allocd.stats()
            line.update({k: stats.get(k) for k in keys})
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
