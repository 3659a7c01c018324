"""One of two jobs on one GPU whose memory peaks alternate: job I holds
--peak-gib in its even rounds (I=0) or odd rounds (I=1) and little in the
others, doing small allocations all the time, as a training step does. The
two peaks together exceed the GPU. Natively, the memory a job freed stays
in its PyTorch cache and the other job runs out of memory; with allocd the
daemon asks the idle job to give its cache back, and both finish.

    python alternating_peaks.py --index 0|1 --mode native|transparent|engine
        [--peak-gib 44] [--rounds 6] [--round-seconds 6] --start EPOCH

A round must outlast gathering a peak: with allocd, 44 GiB is 22,528
daemon chunks to import and map (and, when the other job still caches them,
to reclaim first); each peak's gathering time is reported.
"""
import argparse
import json
import time


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index", type=int, choices=[0, 1], required=True)
    p.add_argument("--mode", choices=["native", "transparent", "engine", "allocd"], required=True)
    p.add_argument("--socket", default="/run/allocd/allocd.sock")
    p.add_argument("--peak-gib", type=float, default=44)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--round-seconds", type=float, default=6.0)
    p.add_argument("--start", type=float, required=True, help="time.time() at which round 0 begins")
    p.add_argument("--json")
    a = p.parse_args()
    if a.mode != "native":
        import allocd
        allocd.enable(socket=a.socket, job=f"peaks-{a.index}", required=True,
                      mode="transparent" if a.mode == "transparent" else "engine", period=0.2)
    import torch
    torch.cuda.init()
    piece = 2 << 30
    ooms, small_ooms, peaks_held, gather_seconds = 0, 0, 0, []
    while time.time() < a.start:
        time.sleep(0.01)
    for r in range(a.rounds):
        end = a.start + (r + 1) * a.round_seconds
        held = []
        if r % 2 == a.index:
            try:
                t = time.monotonic()
                for _ in range(int(a.peak_gib * (1 << 30) // piece)):
                    held.append(torch.empty(piece, dtype=torch.uint8, device="cuda"))
                    held[-1].fill_(1)
                torch.cuda.synchronize()
                gather_seconds.append(round(time.monotonic() - t, 3))
                peaks_held += 1
            except RuntimeError as e:  # torch.OutOfMemoryError is one
                ooms += 1
                print(f"job {a.index} round {r}: {str(e).splitlines()[0][:160]}", flush=True)
                held.clear()
        while time.time() < end:  # the small allocations of a step
            try:
                x = torch.empty(1 << 20, device="cuda")
                del x
            except RuntimeError as e:
                small_ooms += 1
                if small_ooms == 1:
                    print(f"job {a.index} round {r}, a step's 4 MiB: {str(e).splitlines()[0][:200]}",
                          flush=True)
            time.sleep(0.0005)
        held.clear()
    result = {"index": a.index, "mode": a.mode, "peak_gib": a.peak_gib, "rounds": a.rounds,
              "round_seconds": a.round_seconds, "peaks_held": peaks_held, "ooms": ooms,
              "small_ooms": small_ooms,
              "gather_seconds": gather_seconds}
    print(json.dumps(result), flush=True)
    if a.json:
        open(a.json, "w").write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
