"""A reclaim's partial give-back, in transparent mode.

A neighbour on the GPU is short of memory and the daemon asks this job for
what it lacks: part of what PyTorch's allocator caches. PyTorch offers one
way to give cached memory back, ``empty_cache()``, which releases all of
it. An inference server beside a trainer then gave its KV caches along
with its batch, and mapped them again, daemon round trip and all, at its
next request. So the empty_cache() of a reclaim runs with the interposer
keeping the segments it frees mapped as spares (allocd_interpose_keep_freed),
and only the largest of them, enough to cover the ask, go back
(allocd_interpose_release_spares): after PyTorch's lock is let go, and
after the interposer's own (it only takes them out of its books under it),
so the job's allocations do not wait for the unmaps. A later cudaMalloc of a kept
size takes one at the cost of a lookup (client/spare_segments.h).

What stays spare is the job's: the daemon counts it as cached (a later
reclaim takes it), a cudaMalloc that does not fit gives it back first, and
what no cudaMalloc takes within KEEP_S goes back at the advisor's next
round. A full release (a reclaim of everything, a config applied) keeps and
gives back the same way, every spare at once: its unmaps, too, wait until
PyTorch's lock is let go (tens of GiB unmapped under it held the job's
allocations 7-14 ms).
These CUDA calls run on the advisor's thread under its round lock, which a
CUDA graph capture holds: none lands inside a capture.
``ALLOCD_PARTIAL_RECLAIM=0`` turns it off (a reclaim empties the cache).
"""

import ctypes
import os

from ._bindings import typed_functions


class SpareKeeper:
    """The interposer's spares of `device`, driven from the advisor's rounds.
    `keep_freed(on)`, `release(bytes)` and `release_old(keep_ms)` are the
    interposer's functions for the device."""

    # How long a kept segment waits for a cudaMalloc of its size: a job's
    # next request after a reclaim comes within its cycle, seconds.
    KEEP_S = 30.0

    def __init__(self, keep_freed, release, release_old, keep_s=KEEP_S):
        self._keep_freed = keep_freed
        self._release = release
        self._release_old = release_old
        self._keep_ms = int(keep_s * 1000)
        self.partial_releases = 0
        self.full_releases = 0
        self.bytes_given = 0

    def release_cached(self, empty_cache, bytes_asked=0):
        """Runs `empty_cache()` (PyTorch's, under the caller's hold) keeping
        what it frees, then gives back the largest spares until `bytes_asked`
        are (0: every spare, a full release): the bytes given."""
        self._keep_freed(1)
        try:
            empty_cache()
        finally:
            self._keep_freed(0)
        if bytes_asked:
            self.partial_releases += 1
        else:
            self.full_releases += 1
        return self._count(self._release(bytes_asked))

    def release_old(self):
        """Gives back the spares older than KEEP_S: the bytes given."""
        return self._count(self._release_old(self._keep_ms))

    def _count(self, answer):
        """The bytes an interposer's answer gave (-1: no session serves the
        device, nothing given), counted."""
        given = max(answer, 0)
        self.bytes_given += given
        return given

    def stats(self):
        return {"partial_releases": self.partial_releases, "full_releases": self.full_releases,
                "bytes_given": self.bytes_given, "keep_s": self._keep_ms / 1000}


def enabled():
    """Whether a reclaim gives back only what it asks: ``ALLOCD_PARTIAL_RECLAIM``
    (default 1; 0: off)."""
    return os.environ.get("ALLOCD_PARTIAL_RECLAIM", "1") != "0"


def start_spare_keeper(lib, device):
    """The interposer's spares of `device` (a SpareKeeper), or None where it is
    turned off or the interposer has none (an older build)."""
    if not enabled():
        return None
    functions = typed_functions(lib, {
        "allocd_interpose_keep_freed": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
        "allocd_interpose_release_spares": (ctypes.c_int64, [ctypes.c_int, ctypes.c_uint64]),
        "allocd_interpose_release_old_spares": (ctypes.c_int64,
                                                [ctypes.c_int, ctypes.c_uint32])})
    if functions is None:
        return None
    keep_freed, release, release_old = functions
    return SpareKeeper(lambda on: keep_freed(device, on), lambda n: release(device, n),
                       lambda ms: release_old(device, ms))
