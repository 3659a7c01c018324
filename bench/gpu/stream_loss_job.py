"""A worker of stream_loss.sh: one of overhead_job.py's workloads stepped for
SECONDS under allocd (`allocd run`, or transparent mode's enable() with
--enable), printing every 5 s, and at its end, what its allocation
stream sent and lost (allocd.stats(): events_sent, events_dropped, the
reader, why it paused).

    python stream_loss_job.py --workload generate --seconds 45 [--enable SOCKET]
"""
import argparse
import json
import os
import sys
import time

KEYS = ("event_source", "events_sent", "events_dropped", "states_sent", "stream_paused",
        "stream_switched", "advisor_rounds")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="generate",
                   choices=["seq2seq", "resnet50", "generate", "churn"])
    p.add_argument("--seconds", type=float, default=45)
    p.add_argument("--enable", metavar="SOCKET",
                   help="transparent mode by allocd.enable() (else the job runs under allocd run)")
    a = p.parse_args()
    import allocd  # imports no torch: enable() below still comes before it
    if a.enable:
        allocd.enable(socket=a.enable, job=f"stream-loss-{a.workload}-enable", required=True,
                      mode="transparent")
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import overhead_job
    start = time.monotonic()
    step = overhead_job.build(torch, a.workload)
    steps, due = 0, 0.0

    def report():
        stats = allocd.stats() or {}
        flat = {**stats, **(stats.get("session") or {})}
        print(json.dumps({"seconds": round(time.monotonic() - start, 1), "steps": steps,
                          **{k: flat.get(k) for k in KEYS}}), flush=True)

    while (elapsed := time.monotonic() - start) < a.seconds:
        step()
        torch.cuda.synchronize()
        steps += 1
        if elapsed >= due:
            report()
            due = elapsed + 5
    report()


if __name__ == "__main__":
    main()
