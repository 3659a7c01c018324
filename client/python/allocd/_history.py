"""The allocation stream read from PyTorch's allocator history: where a
stream starts (the history can stop once the daemon has decided, a tracker
cannot be detached), and where the C++ tracker (_tracker.py) cannot be had."""

import array
import collections
import threading

from . import _allocator_state

# PyTorch's trace actions the autotuner replays, as the daemon numbers them.
ALLOC, FREE_REQUESTED, FREE_COMPLETED = 0, 1, 2
_OPS = {"alloc": ALLOC, "free_requested": FREE_REQUESTED, "free_completed": FREE_COMPLETED}
# The daemon's step mark (proto/protocol.h kEventOpStep): the job ended a step.
STEP = 3
# memory_stats() counters of the same three events: allocation requests,
# frees requested (allocation.freed) and blocks returned to the cache
# (active.freed).
_COUNTERS = ("allocation.all.allocated", "allocation.all.freed", "active.all.freed")
# Actions the reader does not need, left out of PyTorch's ring when its
# _record_memory_history knows skip_actions.
_SKIP = ["segment_alloc", "segment_free", "snapshot"]
# The most events a reader keeps between two rounds, the history's ring and
# the tracker's buffer alike: a round's worth at the least. The advisor
# paces its rounds so that neither is half full (EventStream.read_within):
# a job that marks no step gets 1 s rounds, and a batched generation of
# 157,000 events a second overflowed a ring of 2**17 (PyTorch's ring holds
# what a round reached, about 130 bytes an event, and keeps that much).
RING = 1 << 20


def arm(torch, *args, **kwargs):
    """PyTorch's _record_memory_history, called past the advisor's watch of
    the job's own calls (watch_job_history)."""
    record = torch.cuda.memory._record_memory_history
    return getattr(record, "allocd_unwatched", record)(*args, **kwargs)


def _armed_by_job(entries):
    """Whether the newest allocation in `entries` carries stack frames: the
    job armed the history itself (PyTorch's defaults record them; this
    reader never does). From the end: the first alloc met decides."""
    for entry in reversed(entries):
        if entry["action"] == "alloc":
            return bool(entry.get("frames"))
    return False


class PythonHistory:
    """PyTorch's history through torch's Python API: armed by
    _record_memory_history, read from _snapshot()'s dicts (one per event
    and per block, with the GIL held), counted by memory_stats(). Where the
    tracker's library is not had (_tracker.NativeHistory is the same in C++)."""

    def __init__(self, torch, device, ring):
        self._torch = torch
        self._device = device
        self.ring = ring
        self._skip = True

    def arm(self, clear):
        kwargs = dict(context=None, stacks="python", max_entries=self.ring,
                      clear_history=clear)
        if self._skip:
            try:
                arm(self._torch, "all", skip_actions=_SKIP, **kwargs)
                return
            except (TypeError, ValueError, RuntimeError):
                self._skip = False  # a PyTorch without skip_actions
        arm(self._torch, "all", **kwargs)

    def disarm(self):
        arm(self._torch, None)

    def counted(self):
        stats = self._torch.cuda.memory_stats(self._device)
        return sum(int(stats.get(name, 0)) for name in _COUNTERS)

    def take(self, rearm):
        """The ring's events, as (ops, sizes, ids, streams, armed_by_job), and
        the ring armed again cleared when `rearm` and the job did not arm it."""
        snapshot = self._torch.cuda.memory._snapshot()
        traces = snapshot.get("device_traces", [])
        entries = traces[self._device] if self._device < len(traces) else []
        job_armed = _armed_by_job(entries)
        if rearm and not job_armed:
            self.arm(clear=True)
        # Column by column with comprehensions: this runs with the GIL held
        # while the job waits, at ~13,000 events a step on a large model
        # (about 40% less than a loop appending to four arrays).
        kept = [e for e in entries if e["action"] in _OPS]
        mask = 0xFFFFFFFFFFFFFFFF
        ops = array.array("B", [_OPS[e["action"]] for e in kept])
        sizes = array.array("Q", [e["size"] for e in kept])
        ids = array.array("Q", [e["addr"] & mask for e in kept])
        streams = array.array("Q", [e["stream"] & mask for e in kept])
        return ops, sizes, ids, streams, job_armed

    def read_state(self):
        return _allocator_state.read_state(self._torch, self._device)


class HistoryReader:
    """The allocator's alloc/free stream, read incrementally from PyTorch's history.

    Recording uses the cheapest settings that still give sizes, streams and
    order: ``_record_memory_history("all", context=None, stacks="python",
    max_entries=ring)`` (no stack traces), leaving segment and snapshot
    actions out where PyTorch can. Each round takes the ring's events and
    at once re-arms recording with ``clear_history=True``, so the ring only
    ever holds the events since the last round: nothing is copied twice, and
    the ring's memory stays bounded by ``ring`` entries. ``access`` does the
    arming, taking and counting: PythonHistory by default;
    _tracker.NativeHistory where the tracker's library is had (no Python
    object per event, and the re-arm right after the snapshot in C++).

    What can be lost, and how it is counted: events the allocator recorded
    between the snapshot and the clear, and the oldest events of a round
    that overflowed the ring. PyTorch's own counters of the three events
    (memory_stats, read just before each snapshot) say how many happened;
    whatever they count beyond what was read is reported as dropped before
    the round's events. The count is a lower bound (events between the
    counter read and the snapshot are read but not yet counted), and it is
    reported where the gap is: before the events that follow it.
    """

    def __init__(self, torch, device, ring=RING, access=None):
        self._torch = torch
        self._device = device
        self._access = access if access is not None else PythonHistory(torch, device, ring)
        self._base = 0
        self._seen = 0
        self._lost = 0
        # Where each step mark fell, as a count of PyTorch's counters of the
        # three events since start(): the training thread appends, read()
        # takes (a deque's append and popleft need no lock).
        self._marks = collections.deque()
        self._recording = False
        self._stopped = False  # a start queued for CUDA's initialisation is void
        # The job armed PyTorch's history itself (hand_to_job, or its events
        # carry stack frames, which this reader never asks for): the history
        # is the job's from then on, left as the job set it, and this reader
        # reads nothing more. Re-arming and the job's call take turns.
        self.job_records = False
        self._arm_lock = threading.Lock()

    @property
    def capacity(self):
        """The most events kept between two reads (the ring's): beyond it the
        oldest are lost, and counted as dropped."""
        return self._access.ring

    @property
    def read_in(self):
        """Where the ring is read: "C++" (the tracker's library) or "Python"."""
        return "Python" if isinstance(self._access, PythonHistory) else "C++"

    def start(self):
        """Records from now on; before CUDA is up (transparent enable() runs
        before the job touches CUDA), from its lazy initialisation, as the
        tracker attaches: recording now would start CUDA, which a job that
        forks before it uses CUDA cannot live with. Until then nothing is
        read and no step is marked."""
        self._stopped = False
        initialised = getattr(self._torch.cuda, "is_initialized", lambda: True)
        if initialised():
            self._start_recording()
        else:
            self._torch.cuda._lazy_call(self._start_at_initialisation)

    def _start_recording(self):
        self._access.arm(clear=True)
        # Counted from here: a reader started again (a stream restarted with
        # the allocator's state) owes nothing to what it read before.
        self._base = self._access.counted()
        self._seen = self._lost = 0
        self._marks.clear()
        self._recording = True

    def _start_at_initialisation(self):
        if not self._stopped:
            self._start_recording()

    def stop(self):
        self._stopped = True
        if self._recording:
            self._recording = False
            if not self.job_records:
                self._access.disarm()

    def hand_to_job(self, call):
        """The job arms (or disarms) the history itself: `call`, its call of
        _record_memory_history, made once this reader will not re-arm it,
        so that the job's settings are the last; returns what it returns."""
        with self._arm_lock:
            self.job_records = True
            return call()

    def mark_step(self):
        """The job ended a step here (its optimizer stepped): read() puts a step
        mark where PyTorch's counters say the stream was, give or take the
        events lost around it."""
        if self._recording:
            self._marks.append(self._access.counted() - self._base)

    def read_state(self):
        """The allocator's state (_allocator_state.read_state)."""
        return self._access.read_state()

    def read(self):
        """Events since the last round, as (ops, sizes, ids, streams, dropped_before)."""
        if not self._recording:
            return (array.array("B"), *(array.array("Q") for _ in range(3)), 0)
        counted = self._access.counted() - self._base
        with self._arm_lock:
            ops, sizes, ids, streams, job_armed = self._access.take(rearm=not self.job_records)
            if self.job_records or job_armed:
                self.job_records = True
                self._recording = False
        first = self._seen + self._lost  # this round's first event, counted
        self._seen += len(ops)
        lost = max(self._lost, counted - self._seen)
        dropped, self._lost = lost - self._lost, lost
        places = []
        while self._marks and self._marks[0] - first <= len(ops):
            places.append(max(0, self._marks.popleft() - first))
        for place in reversed(places):  # later ones first: earlier places stay put
            ops.insert(place, STEP)
            for column in (sizes, ids, streams):
                column.insert(place, 0)
        return ops, sizes, ids, streams, dropped
