"""Pre-warming a recurring peak: a job whose largest allocation recurs with a
steady period, and whose cache for it a neighbour takes between occurrences
(a reclaim), gets it back into its own cache before it recurs, so that the
neighbour waits for it instead of the job.

An inference server beside a trainer on one GPU: every 3 s the server runs
one large batch (a 60 GiB KV cache), and in between the trainer's peak
reclaims the server's idle cache. Left alone, the batch's cudaMalloc waits
while the trainer's idle cache is emptied and given back (13-38 ms on an
H200), and the requests queue behind it. PeakForecast learns the period from
when the peak's segments were mapped (the interposer logs the large ones:
map_path's large_segments) and, a lead before the next occurrence, the
advisor has the interposer take a grant of that size
(allocd_interpose_prewarm: the daemon may ask idle neighbours to give back
what they cache, as for any acquire, while the advisor waits, not the job)
and map it, on the advisor's thread (allocd_interpose_prewarm_map, under the
advisor's round lock, which a CUDA graph capture holds: a CUDA call on
another thread would invalidate a capture in global mode), for the next
cudaMalloc of that size; then it allocates and frees that much through
PyTorch's allocator on the default stream: the cudaMalloc takes the mapped
segment at the cost of a lookup (PyTorch's allocator lock, which the job's
requests wait for, is held for microseconds, not for a mapping: 7-12 ms for
60 GiB on an H200), and the block stays in PyTorch's cache, where the batch
finds it. The
allocation is tried only once the segment is mapped, so it never goes down
PyTorch's out-of-memory path (which would empty the job's own cache); what
PyTorch did not take (its cache had room already) is given back at once
(allocd_interpose_prewarm_unused); and the allocation's events are left out
of the allocation stream the autotuner replays (EventStream.hide).

$ALLOCD_PREWARM=0 turns it off.
"""

import contextlib
import os
import sys
import time

from ._holds import AllocatorHolds

# allocd_interpose_prewarm's answers: parked; the daemon could not give it.
PARKED, REFUSED = 0, 1
# allocd_interpose_prewarm_map's: mapped for the next cudaMalloc of its size;
# the peak's own cudaMalloc took the grant meanwhile; mapping it failed.
MAPPED, TAKEN, MAP_FAILED = 0, 2, 3


def enabled():
    """Whether pre-warming is on: ``ALLOCD_PREWARM`` (default 1; 0: off)."""
    return os.environ.get("ALLOCD_PREWARM", "1") != "0"


class PeakForecast:
    """When a job's peak (its largest allocation, from the daemon) recurs.

    Conservative: a pattern is MIN_OCCURRENCES occurrences of one size (at
    least MIN_SHARE of the GPU), their intervals within MAX_JITTER of their
    mean, and the job reclaimed between each two (its cache for the peak was
    taken: otherwise the peak is a cache hit and needs nothing). The next
    occurrence is expected a period after the last, and a pre-warm is due a
    lead (LEAD of the period) before it. Each expected occurrence must come,
    seen as its segment mapped (`occurred`) or as its allocation in the
    allocation stream (`allocated`: a cache hit, after a pre-warm) by half a
    period after it; when it does not, the pattern is broken and learnt
    again from scratch.

    Times are seconds of one clock (time.time()); `reclaims` is the
    session's count of reclaims answered (session stats' "reclaims").
    """

    MIN_OCCURRENCES = 3
    MAX_JITTER = 0.05
    LEAD = 0.1
    MIN_SHARE = 0.1
    SIZE_TOLERANCE = 0.02

    def __init__(self, capacity_bytes):
        self.min_bytes = int(capacity_bytes * self.MIN_SHARE)
        # (time, bytes, reclaims when seen), oldest first.
        self._occurrences = []
        # The expected occurrence a due pre-warm was handled for.
        self._handled = None
        self.broken = 0  # patterns that stopped recurring

    def occurred(self, at, size, reclaims):
        """A segment of `size` bytes was mapped at `at`: the job's allocation
        came from the daemon, not its cache."""
        if size < self.min_bytes:
            return
        if self._occurrences and not self._same_size(self._occurrences[-1][1], size):
            self._occurrences.clear()
        self._occurrences.append((at, size, reclaims))
        del self._occurrences[:-self.MIN_OCCURRENCES]

    def allocated(self, now, size, reclaims):
        """The allocation stream read at `now` holds an allocation of `size`
        bytes (from the cache or not): the expected occurrence, when one is
        awaited and this is its size, came (at the expected time: the
        stream tells no time)."""
        expected = self.next_at()
        if expected is None or self._handled != expected or \
                not self._same_size(self._occurrences[-1][1], size) or \
                now < expected - self.lead():
            return
        self._occurrences.append((expected, size, reclaims))
        del self._occurrences[:-self.MIN_OCCURRENCES]

    def pattern(self):
        """(period, bytes) of the recurring peak, or None."""
        if len(self._occurrences) < self.MIN_OCCURRENCES:
            return None
        times = [o[0] for o in self._occurrences]
        intervals = [b - a for a, b in zip(times, times[1:])]
        period = sum(intervals) / len(intervals)
        if period <= 0 or any(abs(i - period) > self.MAX_JITTER * period for i in intervals):
            return None
        reclaims = [o[2] for o in self._occurrences]
        if any(b <= a for a, b in zip(reclaims, reclaims[1:])):
            return None  # not contended: the cache kept the peak
        return period, self._occurrences[-1][1]

    def next_at(self):
        """When the peak is expected next, or None."""
        found = self.pattern()
        return None if found is None else self._occurrences[-1][0] + found[0]

    def lead(self):
        found = self.pattern()
        return 0.0 if found is None else self.LEAD * found[0]

    def due_at(self):
        """When the next pre-warm is due, or None (no pattern, or handled)."""
        expected = self.next_at()
        if expected is None or self._handled == expected:
            return None
        return expected - self.lead()

    def take_due(self, now, reclaims):
        """What to do at `now`: None (nothing due), ("prewarm", bytes), or
        ("skip", why). Each expected occurrence is handled once. Also breaks
        a pattern whose expected occurrence did not come."""
        expected = self.next_at()
        if expected is None:
            return None
        if now > expected + self.pattern()[0] / 2:
            self._occurrences.clear()
            self._handled = None
            self.broken += 1
            return None
        if self._handled == expected or now < expected - self.lead():
            return None
        self._handled = expected
        if now >= expected:
            return ("skip", "late")
        if reclaims == self._occurrences[-1][2]:
            return ("skip", "not reclaimed")
        return ("prewarm", self._occurrences[-1][1])

    def _same_size(self, a, b):
        return abs(a - b) <= self.SIZE_TOLERANCE * max(a, b)


class Prewarmer:
    """The advisor's pre-warms: PeakForecast fed from each round, and the
    pre-warm when one is due.

    `prewarm_segment(bytes)` is allocd_interpose_prewarm for the device
    (PARKED, REFUSED, or negative: no session), `map_segment(bytes)`
    allocd_interpose_prewarm_map (MAPPED, TAKEN, MAP_FAILED) and
    `free_unused()` allocd_interpose_prewarm_unused; `clock` is time.time's
    stand-in; `log` takes the log lines; `holds` (an AllocatorHolds) times
    the pre-warm's allocation, which holds PyTorch's allocator."""

    def __init__(self, torch, device, prewarm_segment, map_segment, free_unused,
                 capacity_bytes, clock=time.time, log=None, holds=None):
        self._torch = torch
        self._device = device
        self._prewarm_segment = prewarm_segment
        self._map_segment = map_segment
        self._free_unused = free_unused
        self._clock = clock
        self._log = log if log is not None else (
            lambda line: sys.stderr.write(f"allocd: {line}\n"))
        self.forecast = PeakForecast(capacity_bytes)
        self._holds = holds if holds is not None else AllocatorHolds(clock)
        self._seen_until = -1  # large_segments already taken (by their time, in ns)
        self._own = []  # (start, end) in ns of the pre-warms' own segments
        self.active = False  # a pre-warm's allocation in flight (its OOM is not the job's)
        self.counters = {"prewarms_attempted": 0, "prewarms_served": 0,
                         "prewarms_taken_by_peak": 0,
                         "prewarms_refused": 0, "prewarms_failed": 0,
                         "prewarms_skipped": {}, "peak_patterns_broken": 0}
        self.last = ""
        # The outcomes logged since the pattern was found: each once.
        self._logged = set()
        self._broken_seen = 0

    def seconds_until_due(self, now=None):
        """Seconds until a pre-warm is due (None: none is)."""
        due = self.forecast.due_at()
        if due is None:
            return None
        now = self._clock() if now is None else now
        return max(0.0, due - now)

    def observe(self, session, large_allocs):
        """One round's evidence: the session as allocd_session_stats names it
        (its map_path's large_segments, its reclaims), and the (bytes,
        stream) of the large allocations the round's allocation stream
        held."""
        reclaims = session.get("reclaims", 0)
        for at_ns, size in session.get("map_path", {}).get("large_segments", ()):
            if at_ns <= self._seen_until:
                continue
            self._seen_until = at_ns
            if any(start <= at_ns <= end for start, end in self._own):
                continue
            self.forecast.occurred(at_ns / 1e9, size, reclaims)
        now = self._clock()
        for size, stream in large_allocs:
            if stream == 0:  # the default stream, where the pre-warm puts it
                self.forecast.allocated(now, size, reclaims)
        self.counters["peak_patterns_broken"] = self.forecast.broken

    def watch_bytes(self):
        """The size from which the allocation stream's allocations matter."""
        return self.forecast.min_bytes

    def run_due(self, reclaims, config, hide, cuda_lock=contextlib.nullcontext()):
        """Pre-warms when one is due; `config` is the allocator config the job
        runs (with expandable segments PyTorch maps its own, through no
        cudaMalloc to take the parked grant), `hide(address)` leaves the
        pre-warm's events out of the allocation stream, and `cuda_lock` is
        held for its CUDA calls (the advisor's round lock, which a CUDA
        graph capture holds)."""
        action = self.forecast.take_due(self._clock(), reclaims)
        self.counters["peak_patterns_broken"] = self.forecast.broken
        if action is None:
            return
        kind, what = action
        if kind == "prewarm" and "expandable_segments:true" in config.replace(" ", "").lower():
            kind, what = "skip", "expandable segments"
        if kind == "skip":
            skipped = self.counters["prewarms_skipped"]
            skipped[what] = skipped.get(what, 0) + 1
            return
        self._prewarm(what, hide, cuda_lock)

    def _prewarm(self, size, hide, cuda_lock):
        self.counters["prewarms_attempted"] += 1
        period = self.forecast.pattern()[0]
        start = time.time_ns()
        answer = self._prewarm_segment(size)
        if answer != PARKED:
            self.counters["prewarms_refused"] += 1
            self._say("refused", f"the daemon could not give it ({answer})", size, period, start)
            return
        with cuda_lock:
            self._map_and_cache(size, hide, period, start)

    def _map_and_cache(self, size, hide, period, start):
        answer = self._map_segment(size)
        if answer == TAKEN:
            # The grant came late (the daemon waited for a neighbour) and the
            # peak's own cudaMalloc, come meanwhile, waited for it and took it.
            self.counters["prewarms_taken_by_peak"] += 1
            self._say("late", "taken by the peak's own cudaMalloc (it came late)", size,
                      period, start)
            return
        if answer != MAPPED:
            self.counters["prewarms_failed"] += 1
            self._say("failed", f"mapping it failed ({answer})", size, period, start)
            return
        torch = self._torch
        self.active = True
        try:
            stream = torch.cuda.default_stream(self._device).cuda_stream
            with self._holds.hold("prewarm"):
                address = torch.cuda.caching_allocator_alloc(size, self._device, stream)
                torch.cuda.caching_allocator_delete(address)
        except RuntimeError as error:  # torch.OutOfMemoryError is one
            self.counters["prewarms_failed"] += 1
            self._say("failed", f"PyTorch's allocation failed: {str(error).splitlines()[0]}",
                      size, period, start)
            return
        finally:
            self.active = False
            # Mapped and not taken (PyTorch served the allocation from its
            # cache): not held for a cudaMalloc that may never come.
            self._free_unused()
            self._own = self._own[-3:] + [(start, time.time_ns())]
        hide(address)
        self.counters["prewarms_served"] += 1
        self._say("served", "cached", size, period, start)

    def _say(self, kind, outcome, size, period, start):
        """Keeps the pre-warm's outcome for stats(), and logs it the first time
        its kind (served, late, refused, failed) comes in a pattern: every period
        would flood the job's log."""
        self.last = (f"pre-warm of the peak of {size / (1 << 30):.1f} GiB recurring every "
                     f"{period:.2f} s: {outcome} in {(time.time_ns() - start) / 1e6:.1f} ms")
        if self.forecast.broken != self._broken_seen:
            self._broken_seen, self._logged = self.forecast.broken, set()
        if kind not in self._logged:
            self._logged.add(kind)
            self._log(self.last + " (logged once per outcome and pattern; allocd.stats()"
                      "[\"prewarm\"] counts them all)")

    def stats(self):
        found = self.forecast.pattern()
        return {**self.counters,
                "prewarms_skipped": dict(self.counters["prewarms_skipped"]),
                "peak_period_s": found[0] if found else None,
                "peak_bytes": found[1] if found else None,
                "last_prewarm": self.last}
