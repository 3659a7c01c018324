"""allocd for PyTorch jobs: one line to connect a job to the node's allocd daemon.

    import allocd
    allocd.enable(job="llama-lora")   # managed: GPU memory from the daemon
    allocd.advise(job="llama-lora")   # or keep PyTorch's allocator, let allocd tune it

Managed mode (``enable``, before the first CUDA tensor) gives the job GPU
memory that the node daemon (``allocd serve --backend cuda``) shares between
the processes of the node: memory one job frees serves the next, and the
daemon pushes allocator configs into the running job. By default it is
transparent: PyTorch's own caching allocator runs unchanged and only the
device memory under it comes from the daemon (liballocd_interpose.so serves
cudaMalloc/cudaFree and the VMM calls of expandable segments), so
torch.cuda.memory_stats(), snapshots, torch.OutOfMemoryError, CUDA graphs and
torch.compile(mode="reduce-overhead") all work as natively. Start the job
with ``allocd run -- python train.py`` (or call ``enable()`` before
``import torch``). ``enable(mode="engine")`` instead replaces PyTorch's
allocator with allocd's copy of it, rule for rule, behind
CUDAPluggableAllocator.

Advisor mode streams ``torch.cuda.memory_stats()`` and out-of-memory events
to the daemon, with the allocator's alloc/free stream read from PyTorch's
allocator history (for the daemon's autotuner), applies the allocator
configs it pushes at runtime with ``torch.cuda.memory._set_allocator_settings``
followed by ``empty_cache()`` (so the next peak is met under the new rules)
and acknowledges each one (or reports why it could not), and empties the
cache when the daemon asks for memory back on behalf of another process.

If no daemon answers, the job goes on with PyTorch's allocator as it is and a
warning says why, unless ``required=True``.
"""

import array
import ctypes
import json
import os
import threading
import time
import warnings

__all__ = ["enable", "advise", "stats", "shutdown", "AllocdUnavailable", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/run/allocd/allocd.sock"
_LIBRARY = "liballocd_client.so"
_INTERPOSE_LIBRARY = "liballocd_interpose.so"


class AllocdUnavailable(RuntimeError):
    """No allocd daemon could be reached (or its client library loaded)."""


def _library_path(name=_LIBRARY):
    here = os.path.dirname(os.path.abspath(__file__))
    for directory in (os.environ.get("ALLOCD_LIB_DIR"), here):
        if directory and os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise AllocdUnavailable(
        f"{name} not found next to {here} or in $ALLOCD_LIB_DIR; "
        "build allocd (cmake --build --preset release; liballocd_torch.so needs the "
        "CUDA toolkit) and import the package from build/release/python, or "
        "pip install build/release/python")


def _settings(socket, job):
    """socket, job and the allocator config: the arguments, else the environment's."""
    socket = socket or os.environ.get("ALLOCD_SOCKET", DEFAULT_SOCKET)
    job = job if job is not None else os.environ.get("ALLOCD_JOB", "")
    config = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))
    return socket, job, config


def _gpu_uuid(torch, device):
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


def _autotune_json(pinned_keys, autotune_mode):
    """The job's autotune preferences as the client library takes them."""
    preferences = {}
    if pinned_keys:
        preferences["pinned_keys"] = list(pinned_keys)
    if autotune_mode:
        preferences["mode"] = autotune_mode
    return json.dumps(preferences) if preferences else ""


def _unavailable(error, required):
    if required:
        raise AllocdUnavailable(str(error)) from error
    warnings.warn(f"allocd: not connected, PyTorch's allocator runs as it is: {error}",
                  RuntimeWarning, stacklevel=3)
    return False


def _load(path, signatures, mode=ctypes.DEFAULT_MODE):
    """The library at `path`, its functions typed as `signatures` says."""
    lib = ctypes.CDLL(path, mode=mode)
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def _address(column):
    """Where an array.array's items start, for a C function (None when empty)."""
    return column.buffer_info()[0] if len(column) else None


def _loaded_interposer():
    """The path of liballocd_interpose.so if this process has it loaded."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if path.endswith("/" + _INTERPOSE_LIBRARY):
                return path
    return None


def _load_client(path=None, mode=ctypes.DEFAULT_MODE):
    """liballocd_client's C functions: from the interposer when this process
    has it (one copy of the client per process), else liballocd_client.so."""
    path = path or _loaded_interposer()
    extra = {"allocd_interpose_session": (ctypes.c_void_p, [ctypes.c_int])} if path else {}
    c_client = ctypes.c_void_p
    return _load(path or _library_path(), {
        **extra,
        "allocd_last_error": (ctypes.c_char_p, []),
        "allocd_connect_gpu": (c_client, [ctypes.c_char_p] * 6),
        "allocd_record_events": (ctypes.c_int64, [c_client, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_size_t, ctypes.c_uint64]),
        "allocd_events_dropped": (ctypes.c_uint64, [c_client]),
        "allocd_config_version": (ctypes.c_uint64, [c_client]),
        "allocd_disconnect": (None, [c_client]),
        "allocd_session_id": (ctypes.c_uint64, [c_client]),
        "allocd_publish_stats": (ctypes.c_int, [c_client, ctypes.c_char_p, ctypes.c_uint64]),
        "allocd_flush_telemetry": (ctypes.c_int, [c_client]),
        "allocd_next_control": (ctypes.c_int64, [c_client, ctypes.c_char_p, ctypes.c_size_t]),
        "allocd_ack": (ctypes.c_int, [c_client, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]),
        "allocd_report_oom": (ctypes.c_int, [c_client, ctypes.c_uint64, ctypes.c_char_p,
                                             ctypes.c_uint64]),
    }, mode=mode)


# PyTorch's trace actions the autotuner replays, as the daemon numbers them.
_OPS = {"alloc": 0, "free_requested": 1, "free_completed": 2}
# memory_stats() counters of the same three events: allocation requests,
# frees requested (allocation.freed) and blocks returned to the cache
# (active.freed).
_COUNTERS = ("allocation.all.allocated", "allocation.all.freed", "active.all.freed")
# Actions the reader does not need, left out of PyTorch's ring when its
# _record_memory_history knows skip_actions.
_SKIP = ["segment_alloc", "segment_free", "snapshot"]


class _HistoryReader:
    """The allocator's alloc/free stream, read incrementally from PyTorch's history.

    Recording uses the cheapest settings that still give sizes, streams and
    order: ``_record_memory_history("all", context=None, stacks="python",
    max_entries=ring)`` (no stack traces), leaving segment and snapshot
    actions out where PyTorch can. Each round takes ``_snapshot()`` and at
    once re-arms recording with ``clear_history=True``, so the ring only
    ever holds the events since the last round: nothing is copied twice, and
    the ring's memory stays bounded by ``ring`` entries.

    What can be lost, and how it is counted: events the allocator recorded
    between the snapshot and the clear, and the oldest events of a round
    that overflowed the ring. PyTorch's own counters of the three events
    (memory_stats, read just before each snapshot) say how many happened;
    whatever they count beyond what was read is reported as dropped before
    the round's events. The count is a lower bound (events between the
    counter read and the snapshot are read but not yet counted), and it is
    reported where the gap is: before the events that follow it.
    """

    def __init__(self, torch, device, ring=1 << 17):
        self._torch = torch
        self._device = device
        self._ring = ring
        self._skip = True
        self._base = 0
        self._seen = 0
        self._lost = 0

    def _record(self, clear):
        kwargs = dict(context=None, stacks="python", max_entries=self._ring,
                      clear_history=clear)
        if self._skip:
            try:
                self._torch.cuda.memory._record_memory_history("all", skip_actions=_SKIP,
                                                               **kwargs)
                return
            except (TypeError, ValueError, RuntimeError):
                self._skip = False  # a PyTorch without skip_actions
        self._torch.cuda.memory._record_memory_history("all", **kwargs)

    def _counted(self):
        stats = self._torch.cuda.memory_stats(self._device)
        return sum(int(stats.get(name, 0)) for name in _COUNTERS)

    def start(self):
        self._record(clear=True)
        self._base = self._counted()

    def stop(self):
        self._torch.cuda.memory._record_memory_history(None)

    def read(self):
        """Events since the last round, as (ops, sizes, ids, streams, dropped_before)."""
        counted = self._counted() - self._base
        snapshot = self._torch.cuda.memory._snapshot()
        self._record(clear=True)
        traces = snapshot.get("device_traces", [])
        entries = traces[self._device] if self._device < len(traces) else []
        # Column by column with comprehensions: this runs with the GIL held
        # while the job waits, at ~13,000 events a step on a large model
        # (about 40% less than a loop appending to four arrays).
        kept = [e for e in entries if e["action"] in _OPS]
        mask = 0xFFFFFFFFFFFFFFFF
        ops = array.array("B", [_OPS[e["action"]] for e in kept])
        sizes = array.array("Q", [e["size"] for e in kept])
        ids = array.array("Q", [e["addr"] & mask for e in kept])
        streams = array.array("Q", [e["stream"] & mask for e in kept])
        self._seen += len(ops)
        lost = max(self._lost, counted - self._seen)
        dropped, self._lost = lost - self._lost, lost
        return ops, sizes, ids, streams, dropped


def _event_reader(torch, device):
    """The advisor's reader of the allocation stream, started: $ALLOCD_EVENT_SOURCE.

    "auto" (default): the C++ tracker (allocd/_tracker.py) where it builds
    and attaches, else PyTorch's history with a warning that says why and
    what it costs; "tracker": the tracker, or AllocdUnavailable from
    enable()/advise() whatever `required` says; "history": PyTorch's history
    (_HistoryReader).
    """
    source = os.environ.get("ALLOCD_EVENT_SOURCE", "auto")
    if source not in ("auto", "tracker", "history"):
        raise ValueError(f"ALLOCD_EVENT_SOURCE={source!r}: one of auto, tracker, history")
    if source != "history":
        from . import _tracker
        try:
            reader = _tracker.TrackerReader.for_torch(torch, device)
            reader.start()
            return reader
        except _tracker.TrackerUnavailable as why:
            if source == "tracker":
                raise AllocdUnavailable(f"the allocation-stream tracker: {why}") from None
            warnings.warn(
                "allocd: reading the allocation stream from PyTorch's history, which holds "
                "the GIL while it reads (up to ~8% of the mean step on allocation-heavy jobs; "
                f"record_events=False turns it off): the C++ tracker is unavailable: {why}",
                stacklevel=3)
    reader = _HistoryReader(torch, device)
    reader.start()
    return reader


class _Advisor:
    """The advisor thread: telemetry and allocator events out, configs and reclaims in.

    history: a started reader of the allocation stream (_event_reader), or None.
    """

    def __init__(self, lib, client, torch, device, period, config, history=None):
        self._lib = lib
        self._client = client
        self._torch = torch
        self._device = device
        self._period = period
        self._history = history
        self._stop = threading.Event()
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
        self._thread = threading.Thread(target=self._run, name="allocd-advisor", daemon=True)

    def start(self):
        self._attach_oom_observer()
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
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
        return "history" if isinstance(self._history, _HistoryReader) else "tracker"

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
            self._stop.wait(self._period)

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
            if self._history is not None:
                self._send_events()

    def _send_events(self):
        ops, sizes, ids, streams, dropped = self._history.read()
        if not ops and not dropped:
            return
        self._lib.allocd_record_events(self._client, _address(ops), _address(sizes),
                                       _address(ids), _address(streams), len(ops), dropped)
        self.events_sent += len(ops)

    def _control(self):
        buffer = ctypes.create_string_buffer(1 << 16)
        while True:
            size = self._lib.allocd_next_control(self._client, buffer, len(buffer))
            if size <= 0:
                return
            yield json.loads(buffer.value.decode())

    def _apply(self, message):
        version = message["version"]
        try:
            self._torch.cuda.memory._set_allocator_settings(message["update"])
        except Exception as error:  # PyTorch raises RuntimeError for what it rejects
            self.rejected += 1
            self._lib.allocd_ack(self._client, version, 0, str(error).encode())
            return
        # Blocks cached under the old rules would serve the next peak as the
        # old config cut them: released here, between rounds, the new
        # config shapes it.
        self._torch.cuda.empty_cache()
        self.config = message["config"]
        self.config_reason = message.get("reason", "")
        self.applied += 1
        self._lib.allocd_ack(self._client, version, 1, b"")

    def _publish(self):
        stats = {k: int(v) for k, v in self._torch.cuda.memory_stats(self._device).items()
                 if isinstance(v, (int, float))}
        self.last_stats = stats
        self._lib.allocd_publish_stats(self._client, json.dumps(stats).encode(),
                                       self.config_version)

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


_advisor = None
_managed = None
_transparent = None  # the interposer's path once transparent mode is on


def _enable_engine(torch, socket, job, config, device, autotune):
    from . import _engine  # imported here: it needs this module complete
    engine = _engine.enable(torch, socket, job, config, device, autotune)
    if not engine.oom_is_torch_error():
        warnings.warn("allocd: PyTorch's c10 library was not found in this process: an "
                      "allocation that does not fit raises RuntimeError, not "
                      "torch.OutOfMemoryError", RuntimeWarning, stacklevel=3)
    return engine



# The modes that replace PyTorch's allocator: each takes (torch, socket, job,
# config, device, autotune preferences as JSON) and returns what it installed (with .mode, .stats() for
# allocd.stats() and .unroute() for shutdown()), or raises
# AllocdUnavailable/OSError before it changes PyTorch. The transparent mode,
# the default, keeps PyTorch's allocator and is set up before torch loads.
_MODES = {"engine": _enable_engine}
_DEFAULT_MODE = "transparent"


def enable(socket=None, job=None, device=None, required=False, mode=None, period=1.0,
           pinned_keys=(), autotune_mode=None, record_events=True):
    """Managed mode: the job's GPU memory comes from the node's allocd daemon.

    mode="transparent" (the default, or $ALLOCD_MODE): PyTorch's own caching
    allocator runs unchanged on daemon memory (liballocd_interpose.so serves
    cudaMalloc/cudaFree and the VMM calls of expandable segments), so
    everything PyTorch offers keeps working: memory_stats() and friends,
    snapshots, torch.OutOfMemoryError, CUDA graphs, torch.compile(mode=
    "reduce-overhead"). The interposer must be in the process before PyTorch
    initialises CUDA: start the job with ``allocd run -- python train.py``,
    or call enable() before ``import torch``. Pushed configs are applied with
    torch.cuda.memory._set_allocator_settings and reclaims with
    empty_cache(), as in advise(). CUDA tensors shared between processes
    with torch.multiprocessing open in a receiver that runs transparent too
    (not with expandable_segments:True).

    mode="engine": allocd's copy of PyTorch's caching allocator runs behind
    torch.cuda.memory.CUDAPluggableAllocator, where allocd can run policies
    PyTorch does not have; call it before the first CUDA tensor. The config
    is $PYTORCH_CUDA_ALLOC_CONF (read by allocd instead of PyTorch). PyTorch's
    memory functions answer from it, for the managed device: torch.cuda[.memory].
    memory_stats, memory_stats_as_nested_dict, memory_allocated,
    max_memory_allocated, memory_reserved, max_memory_reserved,
    reset_peak_memory_stats, reset_accumulated_memory_stats, memory_summary,
    the same functions of torch.accelerator, memory_snapshot, _snapshot,
    _dump_snapshot and _record_memory_history (the engine's events, without
    stack frames). An allocation that does not fit raises
    torch.OutOfMemoryError, after which the process goes on. What it cannot
    offer, because PyTorch does not ask a pluggable allocator for it:
    CUDA graphs (torch.cuda.graph capture, and torch.compile's
    mode="reduce-overhead" graph trees, which fail with "does not yet support
    checkPoolLiveAllocations"), torch.cuda.MemPool, opening CUDA tensors
    shared by another process, torch._C._cuda_attach_out_of_memory_observer,
    and stack frames in snapshots (allocd/_engine.py lists it all).

    socket, job: as for advise(). device: the CUDA device, as this process
    numbers it (default: the current one in transparent mode, 0 in engine
    mode). required: raise AllocdUnavailable instead of warning when no
    daemon answers or a library is missing. period: seconds between
    telemetry rounds (transparent mode). pinned_keys, autotune_mode: as for
    advise(); the allocation stream goes to the daemon's autotuner (in
    transparent mode from PyTorch's allocator, read as advise() reads it;
    in engine mode from the engine itself). record_events (transparent
    mode): as for advise(). Read from PyTorch's history (where the tracker
    cannot be built) it is what transparent mode costs a step: on a
    GPU-bound llama with ~13,000 allocator events a step the median step
    was native's and the mean 8% slower (each telemetry round holds the GIL
    while it reads; bench/gpu/results/transparent), so a job that does not
    want the autotuner can turn it off. $ALLOCD_READ_AHEAD_MS (or `allocd
    run --read-ahead-ms`, 200 by default, 0: off) is how long the interposer
    keeps the next segments' chunks it reads ahead; memory the daemon has
    not cached is made by the process itself, counted by the daemon
    ($ALLOCD_CLIENT_CREATES=0: the daemon makes it). A job whose last run
    (same job label, same GPU) ended is handed that run's segments: the
    interposer maps them from the daemon's cache while the job starts, and
    gives back what PyTorch has not taken 30 s after the last one it took
    ($ALLOCD_HANDOVER_MS or `allocd run --handover-ms`; 0: off), or at once
    when another job on the GPU is short.

    Returns True when enabled. Calling it again is a no-op.
    """
    global _managed
    if _managed is not None or _transparent is not None:
        return True
    mode = mode or os.environ.get("ALLOCD_MODE", _DEFAULT_MODE)
    if mode == "transparent":
        return _enable_transparent(socket, job, device, required, period,
                                   _autotune_json(pinned_keys, autotune_mode), record_events)
    if mode not in _MODES:
        raise ValueError(f"allocd.enable: unknown mode {mode!r}; modes: transparent, "
                         f"{', '.join(_MODES)}")
    import torch

    socket, job, config = _settings(socket, job)
    device = 0 if device is None else device
    try:
        _managed = _MODES[mode](torch, socket, job, config, device,
                                _autotune_json(pinned_keys, autotune_mode))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    return True


def _enable_transparent(socket, job, device, required, period, autotune, record_events):
    global _transparent
    import sys
    socket, job, config = _settings(socket, job)
    path = _loaded_interposer()
    try:
        if path is None:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                raise AllocdUnavailable(
                    "CUDA was initialised before allocd.enable(): start the job with "
                    "`allocd run -- python ...`, or call allocd.enable() before importing torch")
            path = _library_path(_INTERPOSE_LIBRARY)
        # The interposer connects with these when PyTorch first asks for memory.
        os.environ["ALLOCD_SOCKET"], os.environ["ALLOCD_JOB"] = socket, job
        os.environ["ALLOCD_AUTOTUNE"] = autotune
        lib = _load_client(path, mode=ctypes.RTLD_GLOBAL)
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    import torch
    if device is None:
        device = torch.cuda.current_device()
    client = lib.allocd_interpose_session(device)
    if not client:
        return _unavailable(AllocdUnavailable(
            f"no daemon session for CUDA device {device} (the interposer said why on stderr); "
            "the job runs on PyTorch's own memory"), required)
    # PyTorch's own allocator: its stream is the autotuner's evidence, as in
    # advise().
    _start_advisor(lib, client, torch, device, period, config, record_events)
    _transparent = path
    return True


def advise(socket=None, job=None, device=None, period=1.0, required=False,
           record_events=True, pinned_keys=(), autotune_mode=None):
    """Connects this job to the allocd daemon in advisor mode.

    socket: the daemon's socket ($ALLOCD_SOCKET, else /run/allocd/allocd.sock).
    job: the job label that picks the configs the daemon pushes ($ALLOCD_JOB).
    device: the CUDA device whose allocator is advised (the current one).
    period: seconds between telemetry rounds.
    required: raise AllocdUnavailable instead of warning when no daemon answers.
    record_events: send the allocator's alloc/free stream to the daemon's
        autotuner (off: stats only). It is read by a C++ tracker inside
        PyTorch's allocator, compiled against this PyTorch once per node
        (allocd/_tracker.py); where that cannot be built, from PyTorch's
        allocator history, which costs the GIL a moment per event and
        clears a history the job records itself ($ALLOCD_EVENT_SOURCE:
        auto, tracker, history).
    pinned_keys: PYTORCH_CUDA_ALLOC_CONF keys the autotuner must never change,
        e.g. ("expandable_segments",).
    autotune_mode: "off", "recommend" or "apply" for this job, unless an admin
        set its mode (default: the daemon's).

    Returns True when connected. Calling it again is a no-op.
    """
    global _advisor
    if _advisor is not None:
        return True
    import torch  # imported here so that `import allocd` stays cheap

    socket, job, initial = _settings(socket, job)
    if device is None:
        device = torch.cuda.current_device()
    try:
        lib = _load_client()
        client = lib.allocd_connect_gpu(socket.encode(), job.encode(), initial.encode(),
                                        f"allocd-python torch {torch.__version__}".encode(),
                                        _autotune_json(pinned_keys, autotune_mode).encode(),
                                        _gpu_uuid(torch, device).encode())
        if not client:
            raise AllocdUnavailable(lib.allocd_last_error().decode(errors="replace"))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    return _start_advisor(lib, client, torch, device, period, initial, record_events)


def _start_advisor(lib, client, torch, device, period, config, record_events):
    """Starts the advisor thread on a connected session. AllocdUnavailable
    when $ALLOCD_EVENT_SOURCE=tracker and the tracker cannot be had: asked
    for by name, it is not silently replaced."""
    global _advisor
    try:
        events = _event_reader(torch, device) if record_events else None
    except AllocdUnavailable:
        lib.allocd_disconnect(client)
        raise
    _advisor = _Advisor(lib, client, torch, device, period, config, events)
    _advisor.start()
    return True


def stats():
    """What allocd knows of this process: session, config version, counts."""
    if _managed is not None:
        return {"connected": True, "mode": "managed", "managed_mode": _managed.mode,
                **_managed.stats()}
    if _advisor is None:
        return {"connected": False}
    mode = {"mode": "managed", "managed_mode": "transparent"} if _transparent else {
        "mode": "advise"}
    return {
        "connected": True,
        **mode,
        "session_id": _advisor.session_id(),
        "config": _advisor.config,
        "config_version": _advisor.config_version,
        "config_reason": _advisor.config_reason,
        "configs_applied": _advisor.applied,
        "configs_rejected": _advisor.rejected,
        "reclaims": _advisor.reclaims,
        "ooms_reported": _advisor.ooms,
        "events_sent": _advisor.events_sent,
        "events_dropped": _advisor.events_dropped(),
        "advisor_seconds": _advisor.busy_seconds,
        "event_source": _advisor.event_source,
        "memory_stats": dict(_advisor.last_stats),
    }


def shutdown():
    """Stops advising and ends the session (also done at interpreter exit).

    In managed mode PyTorch's memory functions get their own implementations
    back; the allocator itself stays (PyTorch cannot swap it out)."""
    global _advisor
    if _advisor is not None:
        _advisor.stop()
        _advisor = None
    if _managed is not None:
        _managed.unroute()


import atexit  # noqa: E402  (registered once the module is complete)

atexit.register(shutdown)
