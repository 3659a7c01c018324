"""One side of the two-job remanence check (issue 29): job A writes a
pattern into its tensors, job B allocates the same amount and counts how many
of its bytes still hold A's pattern. Run under `allocd run` (transparent
mode), A and B as different uids (bench/gpu/tenancy_validation.sh):

    python remanence_job.py writer --gib N [--end exit|release|cache|share]
                            [--ready FILE] [--share-file FILE] [--json OUT]
    python remanence_job.py reader --gib N [--share-file FILE] [--json OUT]

writer: N GiB as 2 GiB uint8 tensors filled with 0xA5, synchronized, then
  exit     leaves at once (the daemon ends its session: kill -9's path too);
  release  frees them back to the daemon (empty_cache) and stays alive
           until killed: a releaser that lives on;
  cache    frees them into PyTorch's cache and stays alive until killed:
           the reader, asking for more than the pool has free, makes the
           daemon reclaim A's idle cache (the partial give-back's path:
           the freed segments kept mapped as spares, then given back);
  share    keeps them and writes a CUDA IPC handle of the first one
           (torch.multiprocessing's reduction, pickled) to --share-file,
           then stays alive until killed.
  It touches --ready once done.
reader: with --share-file, first tries to open A's shared tensor (counted
  in "share": opened or refused, and the pattern bytes it read); then N GiB
  of torch.empty, 2 GiB at a time, never written: "pattern_bytes" of them
  hold 0xA5, "nonzero_bytes" anything but 0.
"""
import argparse
import json
import os
import pickle
import signal
import sys
import time

PATTERN = 0xA5
# 2 GiB pieces, counted a slice at a time: count_nonzero of a whole piece
# took a 16 GiB int64 temporary (PyTorch 2.11), past a small pool's room.
PIECE = 2 << 30
COUNT_SLICE = 64 << 20


def writer(a):
    import torch
    pieces = []
    for _ in range(a.gib * (1 << 30) // PIECE):
        t = torch.empty(PIECE, dtype=torch.uint8, device="cuda")
        t.fill_(PATTERN)
        pieces.append(t)
    del t  # the list holds them all: freeing it frees every piece
    torch.cuda.synchronize()
    result = {"role": "writer", "end": a.end, "gib": a.gib,
              "reserved": torch.cuda.memory_reserved()}
    if a.end in ("release", "cache"):
        del pieces
        if a.end == "release":
            torch.cuda.empty_cache()
        result["reserved_after_release"] = torch.cuda.memory_reserved()
    elif a.end == "share":
        from torch.multiprocessing.reductions import reduce_tensor
        with open(a.share_file, "wb") as f:
            pickle.dump(reduce_tensor(pieces[0]), f)
        os.chmod(a.share_file, 0o644)
    emit(a, result)
    if a.ready:
        open(a.ready, "w").close()
    if a.end == "exit":
        os._exit(0)  # no teardown: as a crash or kill -9 leaves it
    if a.end == "cache":
        # SIGUSR1 once the reader is done: what the reclaim left this job.
        signal.signal(signal.SIGUSR1, lambda *_: None)
        signal.pause()
        result["after_reader"] = {"reserved": torch.cuda.memory_reserved(),
                                  "allocd": allocd_counters()}
        emit(a, result)
    signal.pause()  # until the script kills it


def allocd_counters():
    """allocd's spares and reclaim counters where the job runs under it."""
    try:
        import allocd
        stats = allocd.stats()
    except Exception as e:  # natively, or a client without stats
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return {k: stats[k] for k in ("spares", "map_path", "managed_mode") if k in stats}


def reader(a):
    import torch
    torch.empty(1, device="cuda")
    result = {"role": "reader", "gib": a.gib}
    if a.share_file:
        share = {"opened": False}
        try:
            with open(a.share_file, "rb") as f:
                rebuild, args = pickle.load(f)
            t = rebuild(*args)
            share["opened"] = True
            share["pattern_bytes"] = count(t, lambda s: s == PATTERN)
            del t
        except Exception as e:  # the refusal is the expected outcome
            share["error"] = f"{type(e).__name__}: {e}"[:500]
        result["share"] = share
    pattern = nonzero = total = 0
    pieces = []
    for _ in range(a.gib * (1 << 30) // PIECE):
        t = torch.empty(PIECE, dtype=torch.uint8, device="cuda")
        pattern += count(t, lambda s: s == PATTERN)
        nonzero += count(t, lambda s: s)
        total += t.numel()
        pieces.append(t)  # kept: each piece is new memory, not the last one's
    result.update({"bytes": total, "pattern_bytes": pattern,
                   "nonzero_bytes": nonzero,
                   "pattern_fraction": pattern / total if total else 0.0})
    emit(a, result)


def count(piece, mask):
    """The nonzero elements of mask(slice) over the piece's slices."""
    import torch
    return sum(int(torch.count_nonzero(mask(s)).item())
               for s in piece.view(-1).split(COUNT_SLICE))


def emit(a, result):
    result["uid"] = os.getuid()
    result["pid"] = os.getpid()
    result["time"] = time.time()
    print(json.dumps(result), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["writer", "reader"])
    p.add_argument("--gib", type=int, default=4)
    p.add_argument("--end", choices=["exit", "release", "cache", "share"], default="exit")
    p.add_argument("--ready")
    p.add_argument("--share-file")
    p.add_argument("--json")
    a = p.parse_args()
    if a.gib * (1 << 30) % PIECE:
        sys.exit("--gib must be even (2 GiB tensors)")
    (writer if a.role == "writer" else reader)(a)


if __name__ == "__main__":
    main()
