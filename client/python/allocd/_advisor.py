"""The advisor: a thread that streams a session's telemetry and allocation
events to the daemon and applies what the daemon sends back.

Each round it publishes ``torch.cuda.memory_stats()`` and the allocator's
alloc/free stream (for the daemon's autotuner), applies the allocator configs
the daemon pushes with PyTorch's runtime setter (allocator_settings_setter) followed
by ``empty_cache()`` (and once more when what was live then has gone:
SecondRelease) and acknowledges each one (or reports why it could not),
and empties the cache when the daemon asks for memory back on behalf of
another process. advise() runs it on a session of its own (``connect``),
transparent mode on the interposer's session.
"""

import collections
import ctypes
import importlib
import json
import os
import threading
import time
import warnings
import weakref

from . import _allocator_state
from ._bindings import AllocdUnavailable, address, load_client
from ._history import STEP, HistoryReader


def gpu_uuid(torch, device):
    """The UUID of CUDA device `device` as nvidia-smi prints it ("GPU-..."): the daemon serves the
    session from its pool for that GPU, whatever CUDA_VISIBLE_DEVICES numbers it here. "" when torch
    cannot tell (the daemon then serves its first device)."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, AssertionError, RuntimeError):
        return ""
    # PyTorch prints the bare 8-4-4-4-12 hex form.
    bare = len(uuid) == 36 and all(c in "0123456789abcdefABCDEF-" for c in uuid)
    return f"GPU-{uuid}" if bare else uuid


def allocator_settings_setter(torch):
    """PyTorch's runtime setter of allocator settings: the accelerator one
    where it has it (PyTorch >= 2.9, where torch.cuda.memory's, which only
    calls it, warns on every use that it is deprecated), else torch.cuda's."""
    setter = getattr(getattr(torch, "_C", None), "_accelerator_setAllocatorSettings", None)
    return setter if callable(setter) else torch.cuda.memory._set_allocator_settings


def connect(torch, socket, job, config, device, autotune):
    """A daemon session of its own for advise(), as (lib, client).
    AllocdUnavailable (or OSError) when no daemon answers or the client
    library cannot be loaded."""
    lib = load_client()
    client = lib.allocd_connect_gpu(socket.encode(), job.encode(), config.encode(),
                                    f"allocd-python torch {torch.__version__}".encode(),
                                    autotune.encode(), gpu_uuid(torch, device).encode())
    if not client:
        raise AllocdUnavailable(lib.allocd_last_error().decode(errors="replace"))
    return lib, client


def start_advisor(lib, client, torch, device, period, config, record_events):
    """The advisor thread, started on a connected session. AllocdUnavailable
    when $ALLOCD_EVENT_SOURCE=tracker and the tracker cannot be had: asked
    for by name, it is not silently replaced.

    The stream starts with the allocator's state: what the job holds before
    its first event (the model advise() was called after, or what PyTorch
    allocated before `allocd run` attached), so that the daemon's replay of a
    job that marks no steps does not lack it. Read once the reader is built
    and just before it starts (building the tracker the first time compiles
    it, while the job goes on allocating): an allocation between the two is
    left out, never counted twice."""
    start_state = []

    def read_start_state():
        start_state[:] = [_start_state(torch, device)]

    try:
        events = event_reader(torch, device, read_start_state) if record_events else None
    except AllocdUnavailable:
        lib.allocd_disconnect(client)
        raise
    advisor = Advisor(lib, client, torch, device, period, config, events)
    state = start_state[0] if start_state else None
    if state is not None and lib.allocd_record_state(client, *Advisor.columns(state)) == 0:
        advisor.states_sent += 1
    advisor.start()
    return advisor


def _start_state(torch, device):
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


def event_reader(torch, device, before_start=None):
    """The advisor's reader of the allocation stream, started: $ALLOCD_EVENT_SOURCE.
    `before_start` (optional) is called once the reader is built, right
    before it starts recording (again before the history, where the
    tracker could not start).

    "auto" (default): the C++ tracker (allocd/_tracker.py) where it builds
    and attaches, else PyTorch's history with a warning that says why and
    what it costs; "tracker": the tracker, or AllocdUnavailable from
    enable()/advise() whatever `required` says; "history": PyTorch's history
    (HistoryReader).
    """
    source = os.environ.get("ALLOCD_EVENT_SOURCE", "auto")
    if source not in ("auto", "tracker", "history"):
        raise ValueError(f"ALLOCD_EVENT_SOURCE={source!r}: one of auto, tracker, history")

    def start(reader):
        if before_start is not None:
            before_start()
        reader.start()
        return reader

    if source != "history":
        from . import _tracker
        try:
            return start(_tracker.TrackerReader.for_torch(torch, device))
        except _tracker.TrackerUnavailable as why:
            if source == "tracker":
                raise AllocdUnavailable(f"the allocation-stream tracker: {why}") from None
            warnings.warn(
                "allocd: reading the allocation stream from PyTorch's history, which holds "
                "the GIL while it reads (up to ~8% of the mean step on allocation-heavy jobs; "
                f"record_events=False turns it off): the C++ tracker is unavailable: {why}",
                stacklevel=3)
    return start(HistoryReader(torch, device))


class SecondRelease:
    """The second release of the cache after a pushed config is applied.

    The release at the switch cannot free a segment that holds a block live
    then (a step's activations, a generation's growing KV cache). Freed
    later, such a segment stays cached as the old config cut it, and the new
    config builds its own beside it. So the cache is released once more when
    what was live at the switch has gone: at the job's next step mark (the
    step's activations are freed by its optimizer step), once. A job that
    marks no steps shows no such point: it is released at the first round
    that finds less allocated than at the switch, and again at each round
    that finds UNMARKED_LOWER less than at its last release, at most
    UNMARKED_RELEASES times in all (a dip between two decoded tokens comes
    before the call's KV cache is freed, the call's end after). Either
    comes from the job's own thread or the advisor's. On the H200
    (bench/gpu/results/autotune/run_2130_second_release), GPT-2 generation
    pushed expandable segments in its first call went from 12-18% above
    expandable segments from the start to 1-3% (one run 8%), ResNet-50
    pushed from defaults under ``allocd run`` from 23% to 0.4%; on the H100
    (run_2151_at_need) one generation run released once, inside the call,
    and stayed 15% above.
    """

    ALLOCATED = "allocated_bytes.all.current"
    UNMARKED_LOWER = 0.10
    UNMARKED_RELEASES = 3

    def __init__(self, torch, device):
        self._torch = torch
        self._device = device
        self._lock = threading.Lock()
        # A job that marks no steps is released below this (None: nothing
        # pending), and has this many releases left.
        self._release_below = None
        self._unmarked_left = 0
        self.releases = 0

    def _allocated(self):
        return int(self._torch.cuda.memory_stats(self._device).get(self.ALLOCATED, 0))

    def switched(self):
        """A config was applied and the cache released: the next releases wait."""
        allocated = self._allocated()
        with self._lock:
            self._release_below = allocated
            self._unmarked_left = self.UNMARKED_RELEASES

    def at_step_mark(self):
        """The job marked a step: the release is made if one is pending, and
        none after it."""
        with self._lock:
            if self._release_below is None:
                return
            self._release_below = None
        self._release()

    def at_round(self, stats, marks_steps):
        """An advisor round, with the stats it read: a job that marks no
        steps is released at each new low (see the class)."""
        if marks_steps:
            return
        allocated = int(stats.get(self.ALLOCATED, 0))
        with self._lock:
            if self._release_below is None or allocated >= self._release_below:
                return
            self._unmarked_left -= 1
            self._release_below = (int(allocated * (1 - self.UNMARKED_LOWER))
                                   if self._unmarked_left > 0 else None)
        self._release()

    def _release(self):
        self._torch.cuda.empty_cache()
        self.releases += 1


class Advisor:
    """The advisor thread: telemetry and allocator events out, configs and reclaims in.

    history: a started reader of the allocation stream (event_reader), or None.
    """

    # At the job's start the rounds are short, so that the daemon sees the
    # first steps as they end and a push reaches the job steps, not seconds,
    # after its decision (a job of 50 ms steps is decided within its first
    # ten): until a config is applied, or QUICK_START_S after the start or
    # after any of the first WAKING_MARKS step marks, whichever is latest (a
    # ViT under torch.compile compiled for 60 s before its first mark and
    # again for 38 s before its third: under 1 s rounds after them, the daemon
    # saw its steps 17 steps late).
    QUICK_PERIOD_S = 0.1
    QUICK_START_S = 30.0
    # The first marks also wake a round at once: the daemon decides on a
    # job's third (its second under a known-harmful start config), so a job
    # of 5 ms steps is not 20 steps on by the next round.
    WAKING_MARKS = 4
    # How long the control watcher blocks in the client library at a time:
    # stop() (at the interpreter's exit too) waits for it to come back
    # before the session is closed under it.
    CONTROL_WAIT_MS = 100

    def __init__(self, lib, client, torch, device, period, config, history=None):
        self._lib = lib
        self._client = client
        self._torch = torch
        self._device = device
        self._period = period
        self._started = time.monotonic()
        self._quick_until = self._started + self.QUICK_START_S
        self._history = history
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now, not at the period's end
        self._round_done = threading.Event()
        self._lock = threading.Lock()
        self.config = config
        self.config_reason = "the config the process started with"
        self.events_sent = 0
        self.applied = 0
        self.rejected = 0
        self.reclaims = 0
        self.ooms = 0
        self.last_stats = {}
        self.busy_seconds = 0.0
        self.steps_marked = 0
        self.states_sent = 0
        self._step_hook = None
        # (mark number, state) read at a step mark, sent right after it.
        self._states = collections.deque()
        self._state_period = _allocator_state.period()
        self._last_state = None  # time.monotonic() of the last one read
        self._marks_sent = 0
        self._second_release = SecondRelease(torch, device)
        self._thread = threading.Thread(target=self._run, name="allocd-advisor", daemon=True)
        self._control_thread = threading.Thread(target=self._watch_control,
                                                name="allocd-control", daemon=True)

    def start(self):
        self._attach_oom_observer()
        self._attach_step_hook()
        self._thread.start()
        self._control_thread.start()

    def stop(self):
        self._stop.set()
        self._wake.set()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        for thread in (self._thread, self._control_thread):
            if thread.is_alive():
                thread.join()
        if self._history is not None:
            self._history.stop()
        self._lib.allocd_disconnect(self._client)

    @property
    def config_version(self):
        """The version of the running config, as the daemon connected now knows it."""
        return self._lib.allocd_config_version(self._client)

    @property
    def event_source(self):
        """Where the allocation stream is read: "tracker", "history" or None."""
        if self._history is None:
            return None
        return "history" if isinstance(self._history, HistoryReader) else "tracker"

    def events_dropped(self):
        return self._lib.allocd_events_dropped(self._client)

    def session_id(self):
        return self._lib.allocd_session_id(self._client)

    def _error(self):
        return self._lib.allocd_last_error().decode(errors="replace")

    def _run(self):
        while not self._stop.is_set():
            start = time.perf_counter()
            self.step()
            # Time this thread kept the GIL and the allocator from the job.
            self.busy_seconds += time.perf_counter() - start
            self._round_done.set()
            self._wake.wait(self.round_period())
            self._wake.clear()

    def _watch_control(self):
        """Wakes a round as soon as the daemon sends a push or a reclaim: a push
        reaches a job of 30 ms steps within a step, not at the next round a
        second later. Blocks in the client library (ctypes lets the GIL go)."""
        while not self._stop.is_set():
            if self._lib.allocd_wait_control(self._client, self.CONTROL_WAIT_MS) > 0:
                self._round_done.clear()
                self._wake.set()
                # The message waits until the round takes it: not again before.
                self._round_done.wait(self.round_period())

    def round_period(self, now=None):
        """Seconds until the next round: short at the job's start."""
        now = time.monotonic() if now is None else now
        if self.applied == 0 and now < self._quick_until:
            return min(self._period, self.QUICK_PERIOD_S)
        return self._period

    def at_step_mark(self, now=None):
        """The job marked a step (called by the step hook once the mark is in
        the stream): each of the first WAKING_MARKS restarts the quick rounds
        and, while no config has been applied, wakes a round at once."""
        now = time.monotonic() if now is None else now
        self.steps_marked += 1
        if self.steps_marked > self.WAKING_MARKS:
            return
        self._quick_until = max(self._quick_until, now + self.QUICK_START_S)
        if self.applied == 0:
            self._wake.set()

    def step(self):
        """One round: handle what the daemon sent, then publish stats and events."""
        with self._lock:
            for message in self._control():
                if message["type"] == "config":
                    self._apply(message)
                elif message["type"] == "reclaim":
                    self._torch.cuda.empty_cache()
                    self.reclaims += 1
            self._publish()
            self._second_release.at_round(self.last_stats, self.steps_marked > 0)
            if self._history is not None:
                self._send_events()

    def _send_events(self):
        ops, sizes, ids, streams, dropped = self._history.read()
        if not ops and not dropped:
            return
        columns = (ops, sizes, ids, streams)
        start = 0
        for place, state in self._states_at_marks(ops):
            self._record(columns, start, place, dropped)
            dropped, start = 0, place
            # `state` keeps its arrays alive through the call.
            if self._lib.allocd_record_state(self._client, *self.columns(state)) == 0:
                self.states_sent += 1
        self._record(columns, start, len(ops), dropped)
        self.events_sent += len(ops)

    def _record(self, columns, start, end, dropped):
        if start == 0 and end == len(columns[0]):
            part = columns
        else:
            part = tuple(column[start:end] for column in columns)
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

    @staticmethod
    def columns(state):
        segments, blocks = state[:4], state[4:]
        return (*(address(c) for c in segments), len(segments[0]),
                *(address(c) for c in blocks), len(blocks[0]))

    def _read_state(self):
        """The allocator's state for the mark about to be made, when one is due."""
        if self._state_period < 0:
            return
        now = time.monotonic()
        if self._last_state is not None and now - self._last_state < self._state_period:
            return
        self._last_state = now
        try:
            state = _allocator_state.read_state(self._torch, self._device)
        except Exception as error:  # a PyTorch whose snapshot differs: no states
            self._state_period = -1
            warnings.warn(f"allocd: the allocator's state cannot be read ({error!r}); "
                          "the daemon predicts from the allocation stream alone")
            return
        if state is not None:
            # Before the mark: the advisor may read the mark at once.
            self._states.append((self.steps_marked + 1, state))

    def _control(self):
        buffer = ctypes.create_string_buffer(1 << 16)
        while True:
            size = self._lib.allocd_next_control(self._client, buffer, len(buffer))
            if size <= 0:
                return
            yield json.loads(buffer.value.decode())

    def _apply(self, message):
        # The client library applies it as the engine does (ConfigApplier:
        # checks it, ACKs or NACKs it, counts it); PyTorch's part is `target`.
        torch = self._torch
        set_settings = allocator_settings_setter(torch)

        def target(update, error, size, _context):
            try:
                set_settings(update.decode())
            except Exception as refused:  # PyTorch raises RuntimeError for what it rejects
                text = str(refused).encode(errors="replace")[:size]
                ctypes.memmove(error, text, len(text))
                return 1
            # Blocks cached under the old rules would serve the next peak as the
            # old config cut them: released here, between rounds, the new
            # config shapes it.
            torch.cuda.empty_cache()
            self._second_release.switched()
            return 0

        callback = self._lib.allocd_apply_config.argtypes[2](target)  # its ctypes callback type
        outcome = self._lib.allocd_apply_config(self._client, message["version"], callback, None)
        buffer = ctypes.create_string_buffer(1 << 16)
        if self._lib.allocd_applied_config(self._client, buffer, len(buffer)) < 0:
            return
        applied = json.loads(buffer.value.decode())
        self.applied, self.rejected = applied["applied"], applied["rejected"]
        if outcome == 1:
            self.config, self.config_reason = applied["config"], applied["reason"]

    def _publish(self):
        stats = {k: int(v) for k, v in self._torch.cuda.memory_stats(self._device).items()
                 if isinstance(v, (int, float))}
        self.last_stats = stats
        self._lib.allocd_publish_stats(self._client, json.dumps(stats).encode(),
                                       self.config_version)

    def _attach_step_hook(self):
        """Marks the job's steps in the event stream: PyTorch's global hook after
        every optimizer step. The daemon's autotuner then knows the job's steps
        instead of guessing them from the stream, and a job with no optimizer
        (inference, generation) is aperiodic. The first optimizer to step marks
        them: a job with several (a GAN's two) steps each once a step."""
        if self._history is None:
            return
        # By its import path: PyTorch removes the `optimizer` name from
        # torch.optim's namespace (torch.optim.optimizer is no attribute).
        try:
            optimizer_module = importlib.import_module("torch.optim.optimizer")
        except ImportError:
            return
        register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
        if register is None:
            return
        marker = []  # a weak reference to the optimizer whose steps are marked

        def hook(optimizer, _args, _kwargs):
            if not marker:
                marker.append(weakref.ref(optimizer))
            if marker[0]() is optimizer:
                # Before the state is read: it then holds what the job keeps.
                self._second_release.at_step_mark()
                self._read_state()
                self._history.mark_step()
                self.at_step_mark()

        self._step_hook = register(hook)

    def _attach_oom_observer(self):
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return

        def observer(device, alloc, device_allocated, device_free):
            self.ooms += 1
            message = (f"CUDA out of memory on device {device}: tried to allocate {alloc} "
                       f"bytes; {device_allocated} allocated, {device_free} free")
            self._lib.allocd_report_oom(self._client, alloc, message.encode(),
                                        self.config_version)

        attach(observer)

