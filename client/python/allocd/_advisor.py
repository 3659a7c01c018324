"""The advisor: a thread that runs the client's control loop on PyTorch's
own allocator, and streams its allocation events to the daemon.

The loop is the client library's (LiveSession, as in engine mode): each
round, one allocd_poll applies the allocator configs the daemon pushes,
through PyTorch's runtime setter (allocator_settings_setter) and
``empty_cache()``, releases the cache once more when what was live then has
gone (SecondRelease), ACKs or NACKs each push, empties the cache when the
daemon asks for memory back on behalf of another process, and publishes
``torch.cuda.memory_stats()``. What stays here is what must be Python:
PyTorch's side of that (the allocator target's three functions), the hooks
into PyTorch (step marks, OOMs, and what the process does that a config
must not break: _features.py, whose capture guard keeps pushes out of CUDA
graph captures), and the allocation stream
(_event_stream.py). advise() runs it on a session of its own (``connect``),
transparent mode on the interposer's session.
"""

import ctypes
import importlib
import json
import os
import threading
import time
import weakref

from ._bindings import AllocdUnavailable, Target, load_client, typed_functions
from ._event_stream import EventStream, first_reader, new_reader, start_reader, start_state
from ._features import FeatureHooks
from ._holds import AllocatorHolds
from ._prewarm import Prewarmer, enabled as prewarm_enabled
from ._spares import start_spare_keeper
from ._stream_control import StreamControl, defers_streams


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


def session_stats(lib, client, buffer=None):
    """The session as allocd_session_stats names it (a dict), read into
    `buffer` (a ctypes string buffer; a new one when None); None when the
    client library cannot say."""
    buffer = buffer if buffer is not None else ctypes.create_string_buffer(1 << 16)
    if lib.allocd_session_stats(client, buffer, len(buffer)) < 0:
        return None
    return json.loads(buffer.value.decode())


def stream_deferred_until(session):
    """The reserved bytes up to which the allocation stream stays off (0: it
    starts now). A run handed its job's learned config is told how far it
    can grow and still be doing what the config was learned on
    (stream_from_reserved; a session whose job is decided on another
    session's stream is told kStreamNotRead, and a StreamDemand says when
    that changes): until then the autotuner has nothing to decide,
    and PyTorch, which charges the job for every allocator event from the
    moment a stream is attached and cannot detach one, charges nothing.
    $ALLOCD_DEFER_STREAM=0 starts it at once whatever was learned."""
    if not defers_streams() or not session:
        return 0
    return int(session.get("stream_from_reserved", 0))


def start_advisor(lib, client, torch, device, period, config, record_events,
                  transparent=False):
    """The advisor thread, started on a connected session (`transparent`: the
    interposer's, whose cudaMallocs a pre-warm serves). AllocdUnavailable
    when $ALLOCD_EVENT_SOURCE=tracker and the tracker cannot be had: asked
    for by name, it is not silently replaced.

    The stream starts with the allocator's state: what the job holds before
    its first event (the model advise() was called after, or what PyTorch
    allocated before `allocd run` attached), so that the daemon's replay of a
    job that marks no steps does not lack it. Read once the reader is built
    and just before it starts (building the tracker the first time compiles
    it, while the job goes on allocating): an allocation between the two is
    left out, never counted twice. A learned run's stream starts later, the
    same way, if at all (stream_deferred_until)."""
    state = []
    events = None
    defer_until = 0
    built = reader = None
    try:
        if record_events:
            defer_until = stream_deferred_until(session_stats(lib, client))
            built = new_reader(torch, device)
            if not defer_until:
                reader = start_reader(first_reader(built, torch, device), torch, device,
                                      lambda: state.append(start_state(torch, device)))
            events = EventStream(lib, client, reader)
    except AllocdUnavailable:
        lib.allocd_disconnect(client)
        raise
    holds = AllocatorHolds()
    advisor = Advisor(lib, client, torch, device, period, config, events,
                      start_prewarmer(lib, torch, device, events, holds) if transparent
                      else "off (transparent mode only)", holds,
                      start_spare_keeper(lib, device) if transparent else None)
    if defer_until:
        advisor.stream.defer(built, defer_until)
    elif events is not None:
        advisor.stream.started_on(reader, built)
        if state and state[-1] is not None:
            events.send_state(state[-1])
    advisor.take_start_config()
    advisor.start()
    return advisor


def start_prewarmer(lib, torch, device, events, holds=None):
    """The pre-warms of the job's recurring peak (_prewarm.py), or why there are
    none: they need the interposer (transparent mode), whose grant the
    pre-warm's cudaMalloc takes, and the allocation stream, which tells
    whether a pre-warmed peak came."""
    if not prewarm_enabled():
        return "off ($ALLOCD_PREWARM=0)"
    sized = (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64])
    functions = typed_functions(lib, {"allocd_interpose_prewarm": sized,
                                      "allocd_interpose_prewarm_map": sized,
                                      "allocd_interpose_prewarm_unused":
                                          (ctypes.c_int, [ctypes.c_int])})
    if functions is None:
        return "off (the interposer has no allocd_interpose_prewarm_map: an older build)"
    prewarm, map_segment, unused = functions
    if events is None:
        return "off (no allocation stream: record_events=False)"
    try:
        capacity = torch.cuda.get_device_properties(device).total_memory
    except (AttributeError, AssertionError, RuntimeError):
        return "off (the GPU's memory is unknown)"
    prewarmer = Prewarmer(torch, device, lambda size: prewarm(device, size),
                          lambda size: map_segment(device, size), lambda: unused(device),
                          capacity, holds=holds)
    events.watch_bytes = prewarmer.watch_bytes()
    return prewarmer


class Advisor:
    """The advisor thread: rounds of the client's control loop, and the
    allocation stream (events: an EventStream, or None)."""

    # At the job's first steps the rounds are short, so that the daemon sees
    # them as they end and a push reaches the job steps, not seconds, after
    # its decision (a job of 50 ms steps is decided within its first ten):
    # until a config is applied, or QUICK_START_S after any of the first
    # WAKING_MARKS step marks, whichever is latest (a ViT under torch.compile
    # compiled for 60 s before its first mark and again for 38 s before its
    # third: under 1 s rounds after them, the daemon saw its steps 17 steps
    # late). Not before the first mark: nothing is decided on a marking job
    # before it, and a job that marks none (a server) is decided on its
    # event count, whatever the rounds; a server's requests waited for quick
    # rounds' GIL-held takes of its stream (p99 1.37 ms against 1.28 ms
    # without the stream, alone on an H200). Nor while the stream is off (the
    # daemon has decided, or reads another session's): the daemon reads
    # nothing the quick rounds would bring it sooner, and a push wakes a
    # round itself (_watch_control), while each round's session read-back
    # and memory_stats() hold the GIL the job waits for (0.12-0.23% of a
    # step at 10 rounds a second).
    QUICK_PERIOD_S = 0.1
    QUICK_START_S = 30.0
    # The first marks also wake a round at once: the daemon decides on a
    # job's third (its second under a known-harmful start config), so a job
    # of 5 ms steps is not 20 steps on by the next round.
    WAKING_MARKS = 4
    # The marks after each config applied wake a round too: the daemon
    # promotes a push to a job's other ranks at the canary's first mark
    # under it, and judges it at its second. Left to 1 s rounds, the other
    # rank of a DDP job of 0.22 s steps ran the old config 4 steps longer.
    MARKS_AFTER_APPLY = 3
    # How long the control watcher blocks in the client library at a time
    # while no message comes. Each return takes the GIL from the job's
    # thread: at 100 ms the watcher's ten a second were most of the job
    # thread's extra context switches in advisor mode (0.12-0.16 a ResNet-50
    # step). stop() ends the wait (allocd_stop_waiting_control) before it
    # closes the session under it.
    CONTROL_WAIT_MS = 60_000
    # PyTorch's memory_stats() is Python work under the GIL (0.4 ms a call
    # on a T5-sized job), which the job's thread waits for: at the start's
    # quick rounds it is read at most once this often, and again at once
    # after the allocator changed (a config applied, the cache released),
    # where what is left is what the daemon asked to know.
    STATS_PERIOD_S = 0.5
    # How long advise() waits for the start config the daemon chose at
    # registration: it is pushed on the control stream as the session opens.
    START_CONFIG_WAIT_S = 2.0

    def __init__(self, lib, client, torch, device, period, config, events=None,
                 prewarmer=None, holds=None, spares=None):
        self._lib = lib
        # The calls of each round and step mark, made holding the GIL
        # (_bindings.GIL_HELD_CALLS).
        self._held = getattr(lib, "gil_held", lib)
        self._client = client
        self._torch = torch
        self._device = device
        self._period = period
        self._quick_until = 0.0  # short rounds until then: from the first mark
        self._events = events
        # The pre-warms of the job's recurring peak (a Prewarmer), or why none.
        self._prewarmer = prewarmer if isinstance(prewarmer, Prewarmer) else None
        self._prewarm_off = None if self._prewarmer is not None else (prewarmer or "off")
        # When this thread held PyTorch's allocator, which the job waited for.
        self.holds = holds if holds is not None else AllocatorHolds()
        # The interposer's spare segments (a SpareKeeper: a reclaim gives
        # back what it asks, not the whole cache), or None.
        self._spares = spares
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now, not at the period's end
        self._round_done = threading.Event()
        self._lock = threading.Lock()
        # The session as allocd_session_stats names it, read after each round.
        self.session = {"config": config, "config_reason": "the config the process started with"}
        self.applied = 0  # configs applied: the quick rounds end at the first
        self.last_stats = {}
        self._stats_text = None  # the last stats published, as JSON
        self._stats_read_at = 0.0
        self.busy_seconds = 0.0
        self.rounds = 0
        # Where the rounds' time goes (wall time: Python's work and the
        # poll hold the GIL, the client library's other calls let it go,
        # _bindings.GIL_HELD_CALLS): reading and sending
        # the allocation stream, the control loop, and reading the session
        # back; "stats" is the part of the loop spent on the memory_stats()
        # it publishes, here and at the job's step marks. "step_hook" is the
        # time the job's own thread spends in allocd's hook after each
        # optimizer step, and "state" the part of it that reads the
        # allocator's state (the job waits for both).
        self.seconds_by_part = {"events": 0.0, "poll": 0.0, "stats": 0.0, "session": 0.0,
                                "step_hook": 0.0, "state": 0.0, "prewarm": 0.0}
        self._session_buffer = ctypes.create_string_buffer(1 << 16)  # the rounds'
        self.steps_marked = 0
        self._waking_until_mark = 0  # marks up to this one wake a round: after an apply
        self._step_hook = None
        self._feature_hooks = None
        self._target = self._allocator_target()
        # When the stream runs, and which reader reads it.
        self.stream = StreamControl(torch, device, events, prewarms=self._prewarmer is not None)
        self._thread = threading.Thread(target=self._run, name="allocd-advisor", daemon=True)
        self._control_thread = threading.Thread(target=self._watch_control,
                                                name="allocd-control", daemon=True)

    def start(self):
        self._attach_oom_observer()
        self._attach_step_hook()
        self.stream.watch_job_history()
        self._feature_hooks = FeatureHooks(
            self._torch, lambda bits: self._lib.allocd_report_features(self._client, bits),
            self._lock).attach()
        self._thread.start()
        self._control_thread.start()

    def stop(self):
        self._stop.set()
        self._wake.set()
        self._round_done.set()  # a watcher waiting for a round that will not come
        self._lib.allocd_stop_waiting_control(self._client)
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        if self._feature_hooks is not None:
            self._feature_hooks.remove()
        self.stream.unwatch_job_history()
        for thread in (self._thread, self._control_thread):
            if thread.is_alive():
                thread.join()
        if self._events is not None:
            self._events.stop()
        self._lib.allocd_disconnect(self._client)

    def stats(self):
        """What allocd.stats() says of the advisor's session."""
        self._read_session()
        events = self._events
        return {**self.session,
                "events_sent": events.events_sent if events else 0,
                "steps_marked": self.steps_marked,
                "states_sent": events.states_sent if events else 0,
                "advisor_seconds": self.busy_seconds,
                "advisor_rounds": self.rounds,
                "advisor_seconds_by_part": dict(self.seconds_by_part),
                **self.stream.stats(),
                "prewarm": self._prewarmer.stats() if self._prewarmer is not None
                else {"off": self._prewarm_off},
                "allocator_holds": self.holds.stats(),
                "spares": self._spares.stats() if self._spares is not None
                else {"off": "transparent mode only; $ALLOCD_PARTIAL_RECLAIM=0 turns it off"},
                "memory_stats": dict(self.last_stats)}

    @property
    def event_source(self):
        """StreamControl.event_source."""
        return self.stream.event_source

    def _run(self):
        while not self._stop.is_set():
            start = time.perf_counter()
            self.step()
            # Time this thread kept the GIL and the allocator from the job.
            self.busy_seconds += time.perf_counter() - start
            self.rounds += 1
            self._round_done.set()
            self._wake.wait(self.next_wait())
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

    def take_start_config(self):
        """Applies the config the daemon chose for the job at registration (its
        learned config, the node's prior, or a harmful one replaced) on the
        caller's thread, before advise() returns: the job's next allocations
        are made under it, not those before the advisor's first round (a DDP
        rank of a model built just after advise() then kept its weights in
        the start config's segments: 6% above the same config from step 0).
        A process that started on it already (`allocd run`, enable()) runs
        its version and waits for nothing."""
        self._read_session()
        if self.session.get("start_config_source", "own") == "own" or \
                self.session.get("config_version", 0) != 0:
            return
        deadline = time.monotonic() + self.START_CONFIG_WAIT_S
        while self.applied == 0 and (left := deadline - time.monotonic()) > 0:
            if self._lib.allocd_wait_control(self._client, max(1, int(left * 1e3))) > 0:
                self.step()

    def round_period(self, now=None):
        """Seconds until the next round: short at the job's start, while its
        stream is on."""
        now = time.monotonic() if now is None else now
        stream_off = self._events is not None and self._events.deferred
        if self.applied == 0 and now < self._quick_until and not stream_off:
            return min(self._period, self.QUICK_PERIOD_S)
        return self._period

    def next_wait(self):
        """Seconds until the next round: the period (round_period), or sooner
        when a pre-warm is due or the stream's reader would be half full."""
        waits = [self.round_period()]
        if self._prewarmer is not None:
            waits.append(self._prewarmer.seconds_until_due())
        if self._events is not None:
            waits.append(self._events.read_within())
        return min(w for w in waits if w is not None)

    def at_step_mark(self, now=None):
        """The job marked a step (called by the step hook once the mark is in
        the stream): each of the first WAKING_MARKS starts the quick rounds
        again and, while no config has been applied, wakes a round at once; so do
        the MARKS_AFTER_APPLY marks after each config applied."""
        now = time.monotonic() if now is None else now
        self.steps_marked += 1
        if self.steps_marked <= self._waking_until_mark:
            self._wake.set()
        if self.steps_marked > self.WAKING_MARKS:
            return
        self._quick_until = max(self._quick_until, now + self.QUICK_START_S)
        if self.applied == 0:
            self._wake.set()

    def mark_reaches_session(self, mark):
        """Whether the job's step mark number `mark` is handed to the session
        (allocd_mark_step): the first, which tells it the job marks steps,
        and the marks after each config applied, the first of which makes
        the second release. Any other mark would only cross into the
        client library and back through ctypes, on the job's thread every
        step, for nothing (it released the GIL there until the call was
        made holding it). A config applied after the session was last
        read is seen at the round's read-back: its release comes at the
        first mark after that."""
        return mark == 1 or mark <= self._waking_until_mark

    def step(self):
        """One round: the allocation stream, then the client's control loop
        (which sends the stream before it ACKs a push: the daemon watches the
        push from where the job switched)."""
        parts = self.seconds_by_part
        with self._lock:
            start = time.perf_counter()
            large = self._events.send() if self._events is not None else []
            sent = time.perf_counter()
            self._held.allocd_poll(self._client, ctypes.byref(self._target))
            if self._spares is not None:
                self._spares.release_old()
            polled = time.perf_counter()
            self._read_session(self._session_buffer)
            self.stream.round(self.session, self.last_stats)
            parts["session"] += time.perf_counter() - polled
            parts["poll"] += polled - sent
            parts["events"] += sent - start
        if self._prewarmer is not None:
            # Outside the lock: a pre-warm's ask may wait for the daemon to
            # reclaim (in this thread: the job's hooks do not wait for it);
            # it takes the lock for its CUDA calls, which a CUDA graph
            # capture must not meet. The next round, which sends its events,
            # comes after it.
            start = time.perf_counter()
            self._prewarmer.observe(self.session, large)
            self._prewarmer.run_due(self.session.get("reclaims", 0),
                                    self.session.get("config", ""), self._events.hide,
                                    self._lock)
            parts["prewarm"] += time.perf_counter() - start

    def _read_session(self, buffer=None):
        """Reads the session back (into `buffer`, the round's own: other threads
        read into one of their own)."""
        session = session_stats(self._lib, self._client, buffer)
        if session is not None:
            self.session = session
            self.saw_applied(self.session["configs_applied"])

    def saw_applied(self, applied):
        """The session has applied `applied` configs: the marks after a new
        one wake rounds."""
        if applied > self.applied:
            self._waking_until_mark = self.steps_marked + self.MARKS_AFTER_APPLY
        self.applied = applied

    def _allocator_target(self):
        """PyTorch's allocator as the control loop drives it (allocd_target).
        The callbacks live as long as the advisor."""
        torch, device = self._torch, self._device

        def reconfigure(update, error, size, _context):
            self._stats_text = None
            try:
                allocator_settings_setter(torch)(update.decode())
            except Exception as refused:  # PyTorch raises RuntimeError for what it rejects
                text = str(refused).encode(errors="replace")[:size]
                ctypes.memmove(error, text, len(text))
                return 1
            return 0

        def hold_empty_cache():
            with self.holds.hold("empty_cache"):
                torch.cuda.empty_cache()
            self._stats_text = None

        def empty_cache(_context):
            if self._spares is None:
                hold_empty_cache()
            else:
                self._spares.release_cached(hold_empty_cache)

        def release_cached(bytes_asked, _context):
            self._spares.release_cached(hold_empty_cache, bytes_asked)

        def stats(buffer, size, _context):
            start = time.perf_counter()
            if self._stats_text is None or start - self._stats_read_at >= self.STATS_PERIOD_S:
                self.last_stats = {k: int(v) for k, v in torch.cuda.memory_stats(device).items()
                                   if isinstance(v, (int, float))}
                self._stats_text = json.dumps(self.last_stats).encode()
                self._stats_read_at = start
            text = self._stats_text
            if len(text) < size:
                ctypes.memmove(buffer, text + b"\0", len(text) + 1)
            self.seconds_by_part["stats"] += time.perf_counter() - start
            return len(text)

        return Target(Target.RECONFIGURE(reconfigure), Target.EMPTY_CACHE(empty_cache),
                      Target.STATS(stats), None,
                      Target.RELEASE_CACHED(release_cached) if self._spares is not None
                      else Target.RELEASE_CACHED())

    def _attach_step_hook(self):
        """Marks the job's steps in the event stream: PyTorch's global hook after
        every optimizer step. The daemon's autotuner then knows the job's steps
        instead of guessing them from the stream, and a job with no optimizer
        (inference, generation) is aperiodic. The first optimizer to step marks
        them: a job with several (a GAN's two) steps each once a step."""
        if self._events is None:
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
            # A step captured into a CUDA graph is no step the job runs now,
            # and the second release it may bring cannot be made in a capture.
            if self._feature_hooks is not None and self._feature_hooks.capturing:
                return
            if not marker:
                marker.append(weakref.ref(optimizer))
            if marker[0]() is optimizer:
                start = time.perf_counter()
                mark = self.steps_marked + 1
                if self.mark_reaches_session(mark):
                    # Before the state is read: it then holds what the job keeps.
                    self._held.allocd_mark_step(self._client, ctypes.byref(self._target))
                self.seconds_by_part["state"] += self._events.mark_step(mark)
                self.at_step_mark()
                self.seconds_by_part["step_hook"] += time.perf_counter() - start

        self._step_hook = register(hook)

    def _attach_oom_observer(self):
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return

        def observer(device, alloc, device_allocated, device_free):
            if self._prewarmer is not None and self._prewarmer.active:
                return  # the pre-warm's own, not the job's (it is counted there)
            message = (f"CUDA out of memory on device {device}: tried to allocate {alloc} "
                       f"bytes; {device_allocated} allocated, {device_free} free")
            self._lib.allocd_report_oom(self._client, alloc, message.encode())
            if self.stream.want("the job ran out of memory"):
                self._wake.set()

        attach(observer)
