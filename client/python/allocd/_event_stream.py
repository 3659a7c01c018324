"""The allocation stream the advisor sends the daemon's autotuner: the
allocator's alloc/free events, read by the tracker or PyTorch's history,
and the allocator's state where the stream starts and at step marks.
"""

import array
import collections
import os
import sys
import time
import warnings

from . import _allocator_state
from ._bindings import AllocdUnavailable, address
from ._history import ALLOC, FREE_COMPLETED, FREE_REQUESTED, STEP, HistoryReader


def start_state(torch, device):
    """The allocator's state where the stream starts, or None (states off, CUDA
    not started yet, so nothing held and nothing to start for it; more than a
    state holds; or a PyTorch whose snapshot differs)."""
    initialised = getattr(torch.cuda, "is_initialized", lambda: True)
    if _allocator_state.period() < 0 or not initialised():
        return None
    try:
        return _allocator_state.read_state(torch, device)
    except Exception:  # noqa: BLE001 (the stream goes on without it; marks say why)
        return None


def _event_source():
    source = os.environ.get("ALLOCD_EVENT_SOURCE", "auto")
    if source not in ("auto", "tracker", "history"):
        raise ValueError(f"ALLOCD_EVENT_SOURCE={source!r}: one of auto, tracker, history")
    return source


def _history_instead(why):
    """Where the tracker cannot be had: AllocdUnavailable when it was asked
    for by name, else a warning that says why and what the history costs."""
    if _event_source() == "tracker":
        raise AllocdUnavailable(f"the allocation-stream tracker: {why}") from None
    warnings.warn(
        "allocd: reading the allocation stream from PyTorch's history, which holds "
        "the GIL while it reads (up to ~8% of the mean step on allocation-heavy jobs; "
        f"record_events=False turns it off): the C++ tracker is unavailable: {why}",
        stacklevel=4)


def new_reader(torch, device):
    """The advisor's reader of the allocation stream, built but not started:
    $ALLOCD_EVENT_SOURCE. Building the tracker the first time compiles it.

    "auto" (default): the C++ tracker (allocd/_tracker.py) where it builds,
    else PyTorch's history with a warning that says why and what it costs;
    "tracker": the tracker, or AllocdUnavailable from enable()/advise()
    whatever `required` says; "history": PyTorch's history (HistoryReader).
    """
    if _event_source() != "history":
        from . import _tracker
        try:
            return _tracker.TrackerReader.for_torch(torch, device)
        except _tracker.TrackerUnavailable as why:
            _history_instead(why)
    return HistoryReader(torch, device)


def start_reader(reader, torch, device, before_start=None):
    """`reader` (new_reader's) started, or PyTorch's history started instead
    where PyTorch refuses the tracker (AllocdUnavailable for
    $ALLOCD_EVENT_SOURCE=tracker). `before_start` (optional) is called right
    before a reader starts recording (again before the history)."""
    if before_start is not None:
        before_start()
    if isinstance(reader, HistoryReader):
        reader.start()
        return reader
    from . import _tracker
    try:
        reader.start()
        return reader
    except _tracker.TrackerUnavailable as why:
        _history_instead(why)
    return start_reader(HistoryReader(torch, device), torch, device, before_start)


def history_first_seconds():
    """How long a stream the tracker would read is read from PyTorch's history
    first ($ALLOCD_HISTORY_FIRST_S, default 120; 0: never), each time it
    starts. The history can stop, and the daemon stops a stream once it
    has decided (StreamDemand): a run then pays nothing. The tracker cannot
    be detached from PyTorch's allocator, so a stream it reads costs the
    job its record of every allocation for the rest of the run; the
    history costs more while it runs (a snapshot a round, its ring copied),
    so a stream the daemon did not stop by then moves to the tracker."""
    text = os.environ.get("ALLOCD_HISTORY_FIRST_S", "120")
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"ALLOCD_HISTORY_FIRST_S={text!r}: seconds (0: never)") from None
    return max(0.0, seconds)


def first_reader(reader, torch, device, job_records=False):
    """The reader a stream starts on, given `reader` (new_reader's): PyTorch's
    history where `reader` is the tracker, $ALLOCD_EVENT_SOURCE is auto,
    history_first_seconds() is not 0 and the job does not record the
    history itself (`job_records`: it was seen arming it); else `reader`.
    The history is read through the tracker's library (no Python object
    per event) where it can be."""
    if isinstance(reader, HistoryReader) or _event_source() != "auto" or \
            history_first_seconds() <= 0 or job_records or records_own_history(torch, device):
        return reader
    return reader.history_reader()


def records_own_history(torch, device):
    """Whether the job records PyTorch's allocator history itself (for a
    memory snapshot it will dump; asked where allocd's reader does not
    record it): allocd then leaves the history alone. Nothing is recorded
    before CUDA is up (arming the history starts it)."""
    initialised = getattr(torch.cuda, "is_initialized", lambda: True)
    if not initialised():
        return False
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is not None:
        return bool(enabled())
    try:
        traces = torch.cuda.memory._snapshot().get("device_traces", [])
    except Exception:  # noqa: BLE001 (a PyTorch whose snapshot differs: no history to keep)
        return False
    return device < len(traces) and bool(traces[device])


def may_reach(sizes, at_least):
    """Whether a size in `sizes` (an array of unsigned 64-bit) may be at
    least `at_least` (> 0): False only when none is. Works on the bytes, in
    C: max() makes a Python int of every size, 0.8 ms for a round's 17,000
    events under the GIL (which the job's thread waits for) on a slow core,
    this 0.18 ms. A size of at least 256**k has a byte above its k lowest
    that is not zero; each such byte of every size, sliced out, is counted
    for zeros."""
    high = (at_least.bit_length() - 1) // 8  # 256**high <= at_least
    raw = sizes.tobytes()
    little = sys.byteorder == "little"
    return any(raw[(byte if little else 7 - byte)::8].count(0) != len(sizes)
               for byte in range(high, 8))


def columns(state):
    """A state's arrays as allocd_record_state takes them."""
    segments, blocks = state[:4], state[4:]
    return (*(address(c) for c in segments), len(segments[0]),
            *(address(c) for c in blocks), len(blocks[0]))


class EventStream:
    """What `reader` (a started reader of the allocation stream) reads, sent
    on the session `client`, with the allocator's states it reads at step
    marks. A stream made without one is deferred: it sends nothing, and
    marks no steps, until begin() gives it its reader."""

    # The shortest wait read_within() asks for: a job that allocates faster
    # than a reader can hold in it loses events rather than the advisor
    # spinning on the GIL.
    MIN_READ_WITHIN_S = 0.01

    def __init__(self, lib, client, reader=None, clock=time.monotonic):
        self._lib = lib
        self._client = client
        self.reader = reader
        self._clock = clock
        # When the reader was last read, and how fast its events came in the
        # round before (events a second; None: not known yet).
        self._read_at = None
        self._rate = None
        self.events_sent = 0
        self.states_sent = 0
        # When the first events lost since the last state sent were sent as a
        # gap (self._clock()), or None: the daemon's autotuner skips a window
        # with a gap until a state after it.
        self.unstated_loss = None
        # (mark number, state) read at a step mark, sent right after it.
        self._states = collections.deque()
        self._state_period = _allocator_state.period()
        self._last_state = None  # time.monotonic() of the last one read
        self._marks_sent = 0
        # Addresses of allocations that are the advisor's, not the job's (a
        # pre-warm: _prewarm.py), each with the ops of its events still to
        # leave out, in order.
        self._hidden = {}
        # From this size on, send() returns the allocations it sends (0: none).
        self.watch_bytes = 0

    @property
    def deferred(self):
        return self.reader is None

    def begin(self, reader, state=None):
        """Starts a deferred stream on `reader` (started), sending `state` (the
        allocator's, read right before the reader started; None: none)
        first: the daemon replays the stream from it, as from any stream
        that starts after the job allocated."""
        self.reader = reader
        self._read_at = self._rate = None
        if state is not None:
            self.send_state(state)

    def send_state(self, state):
        """Sends `state` (where the stream starts); whether it was."""
        if self._lib.allocd_record_state(self._client, *columns(state)) != 0:
            return False
        self.states_sent += 1
        self.unstated_loss = None
        return True

    def unstated_loss_age(self):
        """Seconds since events lost were sent with no state after them yet
        (None: none)."""
        return None if self.unstated_loss is None else self._clock() - self.unstated_loss

    def pause(self):
        """Sends what the reader read since the last send, stops the reader,
        and leaves the stream deferred: begin() starts it again, from the
        allocator's state then, as a stream that starts after the job
        allocated. Called where begin() is: on the advisor's round."""
        self.send()
        reader, self.reader = self.reader, None
        reader.stop()

    def hide(self, address):
        """The allocation just made at `address` and freed is the advisor's
        (a pre-warm), not the job's demand: its alloc, free_requested and
        free_completed are left out of the next send (the job's later
        allocations at that address are not). Events the reader dropped are
        not looked for after it: the job's next allocation there is its own."""
        self._hidden[address] = [ALLOC, FREE_REQUESTED, FREE_COMPLETED]

    def send(self):
        """Sends what the reader read since the last call; returns the
        (bytes, stream) of the allocations sent of at least watch_bytes."""
        if self.reader is None:
            return []
        ops, sizes, ids, streams, dropped = self.reader.read()
        self._note_rate(len(ops) + dropped)
        if self._hidden:
            ops, sizes, ids, streams = self._without_hidden(ops, sizes, ids, streams)
            self._hidden.clear()
        if not ops and not dropped:
            return []
        if dropped and self.unstated_loss is None:
            self.unstated_loss = self._clock()
        stream = (ops, sizes, ids, streams)
        start = 0
        for place, state in self._states_at_marks(ops):
            self._record(stream, start, place, dropped)
            dropped, start = 0, place
            # `state` keeps its arrays alive through the call.
            self.send_state(state)
        self._record(stream, start, len(ops), dropped)
        self.events_sent += len(ops)
        return self._large_allocations(ops, sizes, streams)

    def _note_rate(self, events):
        now = self._clock()
        if self._read_at is not None and now > self._read_at:
            self._rate = events / (now - self._read_at)
        self._read_at = now

    def read_within(self):
        """Seconds until the reader would hold half the events it can keep
        (its capacity) at the rate of the last round; None when nothing
        bounds the next round (no reader, no rate yet, or a reader without
        a bound). The advisor's round comes no later: past the bound the
        reader loses events, and the daemon skips a window with a gap."""
        capacity = getattr(self.reader, "capacity", None)
        if capacity is None or not self._rate:
            return None
        since = self._clock() - self._read_at
        return max(self.MIN_READ_WITHIN_S, capacity / 2 / self._rate - since)

    def _large_allocations(self, ops, sizes, streams):
        if not self.watch_bytes or not may_reach(sizes, self.watch_bytes):
            return []
        return [(sizes[i], streams[i]) for i in range(len(ops))
                if ops[i] == ALLOC and sizes[i] >= self.watch_bytes]

    def _without_hidden(self, ops, sizes, ids, streams):
        """The columns without the hidden allocations' events."""
        keep = []
        for i, address in enumerate(ids):
            left = self._hidden.get(address)
            if left and ops[i] == left[0]:
                left.pop(0)
                if not left:
                    del self._hidden[address]
                continue
            keep.append(i)
        if len(keep) == len(ops):
            return ops, sizes, ids, streams
        return tuple(array.array(column.typecode, (column[i] for i in keep))
                     for column in (ops, sizes, ids, streams))

    def _record(self, stream, start, end, dropped):
        if start == 0 and end == len(stream[0]):
            part = stream
        else:
            part = tuple(column[start:end] for column in stream)
        self._lib.allocd_record_events(self._client, *(address(c) for c in part),
                                       end - start, dropped)

    def _states_at_marks(self, ops):
        """(index right after a step mark, its state) for the marks in `ops`
        read with one; states of marks already sent are dropped."""
        places = []
        raw = ops.tobytes()
        mark = raw.find(STEP)
        while mark >= 0:
            self._marks_sent += 1
            while self._states and self._states[0][0] < self._marks_sent:
                self._states.popleft()
            if self._states and self._states[0][0] == self._marks_sent:
                places.append((mark + 1, self._states.popleft()[1]))
            mark = raw.find(STEP, mark + 1)
        return places

    def mark_step(self, mark):
        """The job made its step mark number `mark`: the allocator's state is
        read for it, when one is due, then the mark goes into the stream.
        Returns the seconds spent reading the state (0 when none was due, or
        the stream is deferred)."""
        # Read once: a round may pause the stream meanwhile (this runs on
        # the job's thread); a mark given to the reader it stopped is in no
        # stream, as one made while deferred.
        reader = self.reader
        if reader is None:
            # The marks a deferred stream let pass are in no stream: the
            # first one sent after begin() is the next.
            self._marks_sent = mark
            return 0.0
        seconds = self._read_state(reader, mark)
        reader.mark_step()
        return seconds

    def _read_state(self, reader, mark):
        """Reads the allocator's state for mark `mark` from `reader` when one
        is due; the seconds it took (0 when none was due)."""
        if self._state_period < 0:
            return 0.0
        now = time.monotonic()
        if self._last_state is not None and now - self._last_state < self._state_period:
            return 0.0
        self._last_state = now
        start = time.perf_counter()
        try:
            state = reader.read_state()
        except Exception as error:  # a PyTorch whose snapshot differs: no states
            self._state_period = -1
            warnings.warn(f"allocd: the allocator's state cannot be read ({error!r}); "
                          "the daemon predicts from the allocation stream alone")
            return time.perf_counter() - start
        if state is not None:
            # Before the mark: the advisor may read the mark at once.
            self._states.append((mark, state))
        return time.perf_counter() - start

    def stop(self):
        if self.reader is not None:
            self.reader.stop()
