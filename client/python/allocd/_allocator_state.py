"""The allocator's state at a step mark, for the daemon's autotuner.

The autotuner predicts what a config would reserve by replaying the job's
allocation stream. Replayed from its window alone it misses what the window
lost: segments made under an earlier config, fragmentation, allocations from
before recording began. So at a step mark (at most every ``period`` seconds)
the advisor reads PyTorch's segments and the blocks the program holds
(``torch.cuda.memory_snapshot()``, no history needed) and sends them right
after the mark; a decision then replays a switch from the job's real memory.
"""

import array
import os

# AllocatorState's flags and limits (proto/protocol.h).
SEGMENT_SMALL = 1
SEGMENT_EXPANDABLE = 2
BLOCK_FREE_REQUESTED = 1
MAX_SEGMENTS = 4096
MAX_BLOCKS = 16384

_HELD = {"active_allocated": 0, "active_pending_free": BLOCK_FREE_REQUESTED}
_MASK = 0xFFFFFFFFFFFFFFFF


def period():
    """Seconds between two states: ``ALLOCD_STATE_PERIOD_S`` (default 2; 0: at
    every mark; negative: none)."""
    try:
        return float(os.environ.get("ALLOCD_STATE_PERIOD_S", "2"))
    except ValueError:
        return 2.0


def empty_columns(segments=0, blocks=0):
    """A state's nine columns, zeroed, for `segments` segments and `blocks`
    held blocks: the segments' addresses, sizes, streams and flags, then the
    blocks' ids, addresses, sizes, requested sizes and flags."""
    def column(typecode, n):
        return array.array(typecode, bytes(array.array(typecode).itemsize * n))
    return (*(column("Q", segments) for _ in range(3)), column("I", segments),
            *(column("Q", blocks) for _ in range(4)), column("I", blocks))


def read_state(torch, device):
    """The segments of `device` and the blocks held in them, as the columns
    allocd_record_state takes (four of segments, five of blocks:
    empty_columns); None when there are more than a state may hold. Reads
    torch.cuda.memory_snapshot(); the tracker reads the same in C++
    (_tracker.TrackerReader.read_state)."""
    (seg_addresses, seg_sizes, seg_streams, seg_flags,
     ids, addresses, sizes, requested, block_flags) = empty_columns()
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device) != device:
            continue
        if len(seg_addresses) == MAX_SEGMENTS:
            return None
        seg_addresses.append(segment["address"] & _MASK)
        seg_sizes.append(segment["total_size"])
        seg_streams.append(segment.get("stream", 0) & _MASK)
        small = segment.get("segment_type") == "small"
        seg_flags.append((SEGMENT_SMALL if small else 0) |
                         (SEGMENT_EXPANDABLE if segment.get("is_expandable") else 0))
        for block in segment.get("blocks", ()):
            flags = _HELD.get(block.get("state"))
            if flags is None:  # inactive: the cache's, not the program's
                continue
            if len(ids) == MAX_BLOCKS:
                return None
            # The events name an allocation by its address.
            ids.append(block["address"] & _MASK)
            addresses.append(block["address"] & _MASK)
            sizes.append(block["size"])
            # Never past its size: the daemon refuses a report that says so.
            requested.append(min(block.get("requested_size", block["size"]), block["size"]))
            block_flags.append(flags)
    return (seg_addresses, seg_sizes, seg_streams, seg_flags,
            ids, addresses, sizes, requested, block_flags)
