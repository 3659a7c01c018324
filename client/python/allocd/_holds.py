"""When allocd's threads held PyTorch's allocator.

PyTorch's caching allocator serves one allocation at a time per device
under its own lock. While the advisor empties the cache (a reclaim asked
for by a neighbour, a config applied) or allocates a pre-warm through it,
the job's own allocations on that device wait: an inference server's
request that arrives then is served that much later. The windows are kept
(the most recent ones, with totals) so that a job's latency tail can be
laid beside them (allocd.stats()["allocator_holds"]; bench/gpu/packing_job.py
does).
"""

import collections
import contextlib
import time


class AllocatorHolds:
    """The recent windows in which allocd held the allocator, and totals by
    what held it. `clock` is time.time's stand-in."""

    KEEP = 256

    def __init__(self, clock=time.time):
        self._clock = clock
        self._recent = collections.deque(maxlen=self.KEEP)
        self.seconds = {}
        self.count = {}

    @contextlib.contextmanager
    def hold(self, what):
        """Times the body as a hold of the allocator by `what`."""
        start = self._clock()
        try:
            yield
        finally:
            seconds = self._clock() - start
            self._recent.append((start, seconds, what))
            self.seconds[what] = self.seconds.get(what, 0.0) + seconds
            self.count[what] = self.count.get(what, 0) + 1

    def stats(self):
        """{"recent": [[start (time.time()), seconds, what], ...] oldest first,
        at most KEEP; "seconds" and "count": totals by what}."""
        return {"recent": [list(window) for window in self._recent],
                "seconds": dict(self.seconds), "count": dict(self.count)}
