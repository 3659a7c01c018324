"""Partial snapshots from real PyTorch: does allocd reconstruct them?

Runs one synthetic training-like workload in a fresh process per recording
mode (PYTORCH_CUDA_ALLOC_CONF is read once per process):
  full       _record_memory_history from before the first tensor
  late       recording starts after the "model" is on the GPU
  ring       _record_memory_history(max_entries=N): PyTorch's ring wraps
  ring-exp   the same with expandable_segments:True (addresses from the
             driver's VMM reservations; mapped ranges to reconstruct)
Each child reports PyTorch's own peaks; the parent replays each snapshot
with `allocd replay --json` and prints both. The window of every partial
snapshot holds the steady-state steps, so its replay's peaks should be
PyTorch's (peak reserved within 0.1%).

  python3 bench/gpu/partial_snapshot_check.py --allocd build/release/tools/allocd --out /tmp/partial
"""
import argparse, json, os, subprocess, sys

CHILD = r'''
import json, pickle, random, sys, torch
mode, out, max_entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
def record(entries):
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=entries)
if mode == "full":
    record(10_000_000)
rng = random.Random(0)
weights = [torch.empty(rng.randint(8, 96) << 20, dtype=torch.uint8, device="cuda") for _ in range(40)]
small = [torch.empty(rng.randint(1, 4096) * 64, dtype=torch.uint8, device="cuda") for _ in range(200)]
if mode == "late":
    record(10_000_000)
elif mode.startswith("ring"):
    record(max_entries)
del weights[::7]  # frees of blocks a late recording never saw allocated
for step in range(30):
    # Every step asks for the same sizes: each holds the job's peak, so any
    # window with a whole step has PyTorch's peaks.
    r = random.Random(1)
    acts = []
    for layer in range(24):
        acts.append(torch.empty(r.randint(1, 64) << 20, dtype=torch.uint8, device="cuda"))
        tmp = [torch.empty(r.randint(1, 2048) * 512, dtype=torch.uint8, device="cuda") for _ in range(8)]
        del tmp
    while acts:
        acts.pop()
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
pickle.dump(snap, open(out, "wb"))
s = torch.cuda.memory_stats()
print(json.dumps({"events": len(snap["device_traces"][torch.cuda.current_device()]),
                  "peak_reserved": s["reserved_bytes.all.peak"],
                  "peak_allocated": s["allocated_bytes.all.peak"],
                  "num_device_alloc": s["num_device_alloc"]}))
'''


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--allocd", required=True)
    p.add_argument("--out", default="/tmp/partial_snapshots")
    p.add_argument("--max-entries", type=int, default=5000)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    failed = False
    for mode, conf in [("full", ""), ("late", ""), ("ring", ""), ("ring-exp", "expandable_segments:True")]:
        path = os.path.join(a.out, mode + ".pickle")
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        child = subprocess.run([sys.executable, "-c", CHILD, mode, path, str(a.max_entries)],
                               env=env, capture_output=True, text=True, check=True)
        torch_stats = json.loads(child.stdout.strip().splitlines()[-1])
        r = subprocess.run([a.allocd, "replay", path, "--json", "--config", conf],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{mode}: allocd replay failed: {r.stdout}{r.stderr}")
            failed = True
            continue
        replay = json.loads(r.stdout)
        part = replay["partial"]
        diff = (replay["peak_reserved"] - torch_stats["peak_reserved"]) / torch_stats["peak_reserved"]
        print(json.dumps({"mode": mode, "conf": conf, "events": torch_stats["events"],
                          "pytorch": torch_stats,
                          "allocd": {k: replay[k] for k in ("peak_reserved", "peak_allocated", "num_device_alloc")},
                          "peak_reserved_diff": round(diff, 5),
                          "partial": part["partial"], "reconstructed": part["reconstructed"],
                          "ring_buffer_wrapped": part["ring_buffer_wrapped"],
                          "unrecoverable": part["unrecoverable"]}))
        if part["reconstructed"] or not part["partial"]:
            failed |= abs(diff) > 0.001 or replay["peak_allocated"] != torch_stats["peak_allocated"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
