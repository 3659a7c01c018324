"""A job under load for restart_validation.sh: in transparent managed mode,
allocates and frees tensors of 64-512 MiB in a loop, holding up to --gib GiB,
each tensor filled with its own value and checked before it is freed (a
chunk handed to two processes would show). On SIGUSR1 it stops after the
current step and prints one JSON line with what PyTorch reserved (every byte
of it daemon chunks), then waits for SIGTERM.

    allocd run --socket SOCK -- python restart_holder.py --gib 12 --seed 1
"""
import argparse
import json
import os
import random
import signal
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=12)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    import torch
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
    rng = random.Random(a.seed)
    held = []  # (tensor, value)
    limit = int(a.gib * (1 << 30))
    torch.empty(1, device="cuda")
    print(json.dumps({"pid": os.getpid(), "ready": True}), flush=True)
    steps = 0
    while not stop:
        total = sum(t.numel() for t, _ in held)
        if not held or (total < limit and rng.random() < 0.5):
            size = rng.choice([64, 128, 256, 512]) << 20
            value = rng.randrange(1, 255)
            try:
                t = torch.full((size,), value, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                continue
            held.append((t, value))
        else:
            t, value = held.pop(rng.randrange(len(held)))
            if not bool((t == value).all()):
                print(json.dumps({"pid": os.getpid(), "corrupt": True}), flush=True)
                sys.exit(3)
            del t
            if rng.random() < 0.3:
                torch.cuda.empty_cache()  # segments back to the daemon
        steps += 1
        time.sleep(0.002)
    torch.cuda.synchronize()
    for t, value in held:
        if not bool((t == value).all()):
            print(json.dumps({"pid": os.getpid(), "corrupt": True}), flush=True)
            sys.exit(3)
    print(json.dumps({"pid": os.getpid(), "steps": steps,
                      "reserved": torch.cuda.memory_reserved(),
                      "allocated": torch.cuda.memory_allocated()}), flush=True)
    signal.sigwait({signal.SIGTERM})


if __name__ == "__main__":
    main()
