"""When the advisor's allocation stream runs, and which reader reads it.

The stream is off while the daemon has nothing to decide: a run handed its
job's learned config, a session whose job is decided on another session's
stream, a job the daemon settled (its StreamDemands). It is read from
PyTorch's history first, which can stop, then by the tracker, which
cannot be detached from PyTorch's allocator, and never from a history the
job records itself (a memory snapshot it will dump).
"""

import functools
import os
import time

from . import _allocator_state
from ._bindings import AllocdUnavailable
from ._event_stream import first_reader, history_first_seconds, start_reader, start_state
from ._history import HistoryReader


def defers_streams():
    """Whether the allocation stream may be off while the autotuner has
    nothing to decide ($ALLOCD_DEFER_STREAM, default 1): deferred at the
    start of a learned run or of a session whose stream its job does not
    read, paused once the daemon settles the config a run runs."""
    return os.environ.get("ALLOCD_DEFER_STREAM", "1") != "0"


class StreamControl:
    """The stream of `events` (an EventStream; None: no stream, and every
    call does nothing) for `torch`'s `device`. `prewarms`: the job's
    recurring peaks are pre-warmed, which needs the stream once a
    neighbour has reclaimed the job's cache. Driven by the advisor's
    rounds (round(), under its lock) and the job's OOM observer (want())."""

    # A stream that lost events and sent no allocator state since is
    # restarted with one this long after the loss (at least twice
    # ALLOCD_STATE_PERIOD_S: a job that marks steps sends one at a mark
    # before), then twice as long after each restart, up to RESTATE_MAX_S:
    # a job that loses events every round reads its allocator that rarely.
    RESTATE_AFTER_S = 4.0
    RESTATE_MAX_S = 120.0

    def __init__(self, torch, device, events, prewarms=False):
        self._torch = torch
        self._device = device
        self.events = events
        self._prewarms = prewarms
        # Off (defer): the reader it starts on, the reserved bytes past which
        # it starts, and a reason to start it at the next round whatever.
        self._deferred_reader = None
        self._from_reserved = 0
        self._wanted = None
        # Why it last started, stopped (or was kept on when asked to stop),
        # and moved to the tracker: stats().
        self.started = None
        self.paused = None
        self.switched = None
        # Restarts with a state after a loss (_restate_after_loss), and the
        # wait before the next (None: not yet set).
        self.restated = 0
        self._restate_wait = None
        self._demands_seen = 0  # the daemon's StreamDemands followed
        # The tracker, built and not started, while the history is read
        # first, and until when the history is.
        self._tracker = None
        self._history_until = None
        # The job armed PyTorch's history itself (watch_job_history).
        self._job_history = False
        self._unwatch = None

    @property
    def event_source(self):
        """Where the stream is read: "tracker", "history", "deferred" (off) or
        None (no stream)."""
        if self.events is None:
            return None
        if self.events.deferred:
            return "deferred"
        return "history" if isinstance(self.events.reader, HistoryReader) else "tracker"

    def stats(self):
        reader = self.events.reader if self.event_source == "history" else None
        return {"event_source": self.event_source,
                "history_read_in": None if reader is None else reader.read_in,
                "stream_deferred_until_reserved": self._from_reserved,
                "stream_started": self.started,
                "stream_paused": self.paused,
                "stream_switched": self.switched,
                "stream_restated": self.restated}

    def defer(self, reader, until_reserved):
        """Leaves the stream off (`reader`: new_reader's, not started) until
        the allocator's peak reserved memory passes `until_reserved` bytes,
        the job runs out of memory, or (with pre-warms) a neighbour first
        reclaims the job's cache: a pre-warm is made only for a peak that
        reclaims took, and the stream tells it whether the peak it
        pre-warmed came. Then a round starts it, with the allocator's
        state, as a stream that starts after the job allocated."""
        self._deferred_reader = reader
        self._from_reserved = until_reserved

    def want(self, why):
        """Starts a stream that is off at the next round, for `why`; whether
        there is one to start. Not here: PyTorch calls its OOM observer
        holding its allocator, which starting a stream takes."""
        if self._deferred_reader is None:
            return False
        self._wanted = why
        return True

    def started_on(self, reader, built):
        """The stream started on `reader` (started) where new_reader built
        `built`: read from PyTorch's history first, with the tracker kept
        for when it has run history_first_seconds() without the daemon
        pausing it."""
        if reader is built or not isinstance(reader, HistoryReader) or \
                isinstance(built, HistoryReader):
            return
        self._tracker = built
        self._history_until = time.monotonic() + history_first_seconds()

    def round(self, session, memory_stats):
        """A round's turn, `session` (allocd_session_stats's) and the job's
        `memory_stats` read: the daemon's demands followed, a history read
        past its time moved to the tracker, an off stream started when due."""
        if self.events is None:
            return
        self._follow_demand(session)
        self._switch_to_tracker_when_due()
        self._restate_after_loss()
        if self._deferred_reader is not None:
            self._start_when_due(session, memory_stats)

    def _needed(self, session):
        """Why the stream must run whatever the job's memory (None: nothing
        says it must): an OOM, or a neighbour's reclaim of the cache of a
        job with pre-warms."""
        if self._wanted is not None:
            return self._wanted
        if self._prewarms and session.get("reclaims", 0) > 0:
            return ("a neighbour reclaimed its cache: the pre-warms of a recurring peak "
                    "need the stream")
        return None

    def _follow_demand(self, session):
        """Follows what the daemon says it reads of the stream (its newest
        StreamDemand): all of it now, or nothing until the job's reserved
        memory passes a size (the autotuner settled the config the job
        runs, or reads another session of the job). A stream it does not
        read stops, and is deferred as a learned run's start is. Only
        PyTorch's history can stop: a stream the tracker reads stays on."""
        demands = session.get("stream_demands", 0)
        if demands <= self._demands_seen:
            return
        self._demands_seen = demands
        until = int(session.get("stream_demanded_from_reserved", 0))
        reason = session.get("stream_demand_reason") or "the daemon's"
        if self.events.deferred:
            self._from_reserved = until
            if until == 0:
                self._wanted = reason
            return
        if until == 0:
            return  # on already
        needed = self._needed(session)
        if not defers_streams():
            self.paused = "kept on: $ALLOCD_DEFER_STREAM=0"
        elif not isinstance(self.events.reader, HistoryReader):
            self.paused = "kept on: the tracker cannot be detached from PyTorch's allocator"
        elif needed is not None:
            self.paused = f"kept on: {needed}"
        else:
            self.events.pause()
            # Started again as it started first (first_reader): from the
            # history, unless the job records it by then.
            self.defer(self._tracker or HistoryReader(self._torch, self._device), until)
            self.paused = reason

    def _switch_to_tracker_when_due(self):
        """Moves a stream read from PyTorch's history first to the tracker once
        it ran history_first_seconds() without the daemon pausing it, or the
        job armed the history itself (HistoryReader.job_records: the history
        is the job's), the allocator's state first, as a stream that starts
        after the job allocated. Without the tracker, a stream whose history
        the job took ends there."""
        reader = self.events.reader
        if not isinstance(reader, HistoryReader):
            return
        job_records = reader.job_records
        if job_records and self._tracker is None:
            self.events.pause()
            self.switched = "off: the job records PyTorch's history itself"
            return
        if self._tracker is None or (not job_records and time.monotonic() < self._history_until):
            return
        self.events.pause()
        tracker, self._tracker = self._tracker, None
        # Under $ALLOCD_EVENT_SOURCE=auto: PyTorch's refusal of the tracker
        # is a warning, and the history goes on.
        reader, state = self._start_with_state(tracker)
        self.switched = (
            "kept on PyTorch's history: PyTorch refused the tracker"
            if isinstance(reader, HistoryReader) else
            "to the tracker: the job records PyTorch's history itself" if job_records else
            f"to the tracker after {history_first_seconds():g} s on PyTorch's history that "
            "the daemon did not pause")
        self.events.begin(reader, state)

    def _start_with_state(self, reader):
        """`reader` started (start_reader: PyTorch's history instead where
        PyTorch refuses the tracker), and the allocator's state read right
        before it records (None: none), for begin(): a stream that starts
        after the job allocated."""
        state = []
        started = start_reader(reader, self._torch, self._device,
                               lambda: state.append(start_state(self._torch, self._device)))
        return started, (state[-1] if state else None)

    def _restate_after_loss(self):
        """Restarts a stream that lost events and has sent no allocator state
        since, once its wait is over, the state first, as a stream that
        starts after the job allocated: the daemon's autotuner skips a
        window that holds the gap until a state after it (or until the gap
        leaves the window), and a job that marks no step (generation, a
        server) sends none otherwise. Not with states off
        (ALLOCD_STATE_PERIOD_S < 0), nor on a history the job records."""
        age = self.events.unstated_loss_age()
        period = _allocator_state.period()
        reader = self.events.reader
        if age is None or reader is None or period < 0 or \
                getattr(reader, "job_records", False):
            return
        if self._restate_wait is None:
            self._restate_wait = max(self.RESTATE_AFTER_S, 2 * period)
        if age < self._restate_wait:
            return
        self._restate_wait = min(2 * self._restate_wait, self.RESTATE_MAX_S)
        self.events.pause()
        self.events.begin(*self._start_with_state(reader))
        self.restated += 1

    def _start_when_due(self, session, memory_stats):
        """Starts the stream that is off when the round's stats (or an OOM,
        or the daemon) say the job outgrew what it was left off for."""
        reserved = max(memory_stats.get("reserved_bytes.all.peak", 0),
                       memory_stats.get("reserved_bytes.all.current", 0))
        why = self._needed(session)
        if why is None and reserved > self._from_reserved:
            why = (f"its peak reserved memory, {reserved} bytes, passed the "
                   f"{self._from_reserved} below which the daemon had nothing to decide")
        if why is None:
            return
        built, self._deferred_reader = self._deferred_reader, None
        self._wanted = None
        try:
            reader, state = self._start_with_state(
                first_reader(built, self._torch, self._device, self._job_history))
        except AllocdUnavailable as error:
            self.started = f"not started: {error}"
            return
        # Said before the stream shows as on: stats() reads both unlocked.
        self.started = why
        self.events.begin(reader, state)
        self.started_on(reader, self._tracker or built)

    def watch_job_history(self):
        """Wraps PyTorch's _record_memory_history so that the job's own calls
        (a memory snapshot it will dump) take the history from the stream:
        a reader of it stops re-arming it before the job's call is made, and
        the stream moves to the tracker; allocd's own calls go past the
        wrapper (_history.arm). unwatch_job_history() takes it away."""
        memory = getattr(self._torch.cuda, "memory", None)
        record = getattr(memory, "_record_memory_history", None)
        if self.events is None or record is None or hasattr(record, "allocd_unwatched"):
            return

        def watched(*args, **kwargs):
            self._job_history = True
            reader = self.events.reader
            if isinstance(reader, HistoryReader):
                return reader.hand_to_job(lambda: record(*args, **kwargs))
            return record(*args, **kwargs)

        functools.update_wrapper(watched, record)
        watched.allocd_unwatched = record
        memory._record_memory_history = watched
        self._unwatch = lambda: setattr(memory, "_record_memory_history", record)

    def unwatch_job_history(self):
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
