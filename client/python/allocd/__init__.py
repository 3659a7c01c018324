"""allocd for PyTorch jobs: one line to connect a job to the node's allocd daemon.

    import allocd
    allocd.enable(job="llama-lora")   # managed: GPU memory from the daemon
    allocd.advise(job="llama-lora")   # or keep PyTorch's allocator, let allocd tune it

Managed mode (``enable``, before the first CUDA tensor) replaces PyTorch's
CUDA allocator with allocd's copy of it, rule for rule, on GPU memory that
the node daemon (``allocd serve --backend cuda``) shares between the
processes of the node: memory one job frees serves the next, and the daemon
pushes allocator configs into the running job.

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
import warnings

__all__ = ["enable", "advise", "stats", "shutdown", "AllocdUnavailable", "DEFAULT_SOCKET"]

DEFAULT_SOCKET = "/run/allocd/allocd.sock"
_LIBRARY = "liballocd_client.so"
_TORCH_LIBRARY = "liballocd_torch.so"


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


def _load(path, signatures):
    """The library at `path`, its functions typed as `signatures` says."""
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def _load_client():
    c_client = ctypes.c_void_p
    return _load(_library_path(), {
        "allocd_last_error": (ctypes.c_char_p, []),
        "allocd_connect": (c_client, [ctypes.c_char_p] * 5),
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
    })


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
        ops, sizes, ids, streams = (array.array("B"), array.array("Q"), array.array("Q"),
                                    array.array("Q"))
        for entry in entries:
            op = _OPS.get(entry.get("action"))
            if op is None:
                continue
            ops.append(op)
            sizes.append(int(entry.get("size", 0)))
            ids.append(int(entry.get("addr", 0)) & 0xFFFFFFFFFFFFFFFF)
            streams.append(int(entry.get("stream", 0)) & 0xFFFFFFFFFFFFFFFF)
        self._seen += len(ops)
        lost = max(self._lost, counted - self._seen)
        dropped, self._lost = lost - self._lost, lost
        return ops, sizes, ids, streams, dropped


class _Advisor:
    """The advisor thread: telemetry and allocator events out, configs and reclaims in."""

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
        self._thread = threading.Thread(target=self._run, name="allocd-advisor", daemon=True)

    def start(self):
        self._attach_oom_observer()
        if self._history is not None:
            self._history.start()
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

    def events_dropped(self):
        return self._lib.allocd_events_dropped(self._client)

    def session_id(self):
        return self._lib.allocd_session_id(self._client)

    def _error(self):
        return self._lib.allocd_last_error().decode(errors="replace")

    def _run(self):
        while not self._stop.is_set():
            self.step()
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

        def address(column):
            return column.buffer_info()[0] if len(column) else None

        self._lib.allocd_record_events(self._client, address(ops), address(sizes),
                                       address(ids), address(streams), len(ops), dropped)
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


class _Managed:
    """liballocd_torch.so, installed as PyTorch's CUDA allocator."""

    def __init__(self, lib, allocator):
        self.lib = lib
        self.allocator = allocator  # keeps PyTorch's wrapper alive

    def stats(self):
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self.lib.allocd_torch_stats_json(buffer, size)
            if n < 0:
                return {}
            if n < size:
                return json.loads(buffer.value.decode())
            size = n + 1


def enable(socket=None, job=None, device=None, required=False, pinned_keys=(),
           autotune_mode=None):
    """Managed mode: PyTorch allocates CUDA memory through allocd.

    Call it before the first CUDA tensor (PyTorch cannot swap an allocator
    that has allocated). The config is $PYTORCH_CUDA_ALLOC_CONF (read by
    allocd instead of PyTorch); the daemon may push others at runtime.
    torch.cuda.memory_stats() is not available under a pluggable allocator:
    allocd.stats() has the same counters.

    socket, job: as for advise(). device: the CUDA device to manage, as this
    process numbers it (default 0; the daemon's device must be the same GPU).
    required: raise AllocdUnavailable instead of warning when no daemon
    answers or the library is missing.
    pinned_keys, autotune_mode: as for advise(). The engine's own
    malloc/free stream goes to the daemon's autotuner.

    Returns True when enabled. Calling it again is a no-op.
    """
    global _managed
    if _managed is not None:
        return True
    import torch

    socket, job, config = _settings(socket, job)
    device = 0 if device is None else device
    try:
        path = _library_path(_TORCH_LIBRARY)
        lib = _load(path, {
            "allocd_torch_configure": (ctypes.c_int, [ctypes.c_char_p] * 3 + [ctypes.c_int,
                                                                          ctypes.c_char_p]),
            "allocd_torch_last_error": (ctypes.c_char_p, []),
            "allocd_torch_stats_json": (ctypes.c_int64, [ctypes.c_char_p, ctypes.c_size_t]),
        })
        if lib.allocd_torch_configure(socket.encode(), job.encode(), config.encode(), device,
                                      _autotune_json(pinned_keys, autotune_mode).encode()):
            raise AllocdUnavailable(lib.allocd_torch_last_error().decode(errors="replace"))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "allocd_torch_malloc", "allocd_torch_free")
    hooks = allocator.allocator()
    for setter, symbol in (("set_reset_fn", "allocd_torch_empty_cache"),
                           ("set_memory_fraction_fn", "allocd_torch_set_memory_fraction"),
                           ("set_record_stream_fn", "allocd_torch_record_stream")):
        if hasattr(hooks, setter):
            getattr(hooks, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    _managed = _Managed(lib, allocator)
    return True


def advise(socket=None, job=None, device=None, period=1.0, required=False,
           record_events=True, pinned_keys=(), autotune_mode=None):
    """Connects this job to the allocd daemon in advisor mode.

    socket: the daemon's socket ($ALLOCD_SOCKET, else /run/allocd/allocd.sock).
    job: the job label that picks the configs the daemon pushes ($ALLOCD_JOB).
    device: the CUDA device whose allocator is advised (the current one).
    period: seconds between telemetry rounds.
    required: raise AllocdUnavailable instead of warning when no daemon answers.
    record_events: send the allocator's alloc/free stream, read from PyTorch's
        allocator history, to the daemon's autotuner (off: stats only; turn it
        off when the job records its own memory history, which this clears).
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
    try:
        lib = _load_client()
        client = lib.allocd_connect(socket.encode(), job.encode(), initial.encode(),
                                    f"allocd-python torch {torch.__version__}".encode(),
                                    _autotune_json(pinned_keys, autotune_mode).encode())
        if not client:
            raise AllocdUnavailable(lib.allocd_last_error().decode(errors="replace"))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    if device is None:
        device = torch.cuda.current_device()
    history = _HistoryReader(torch, device) if record_events else None
    _advisor = _Advisor(lib, client, torch, device, period, initial, history)
    _advisor.start()
    return True


def stats():
    """What allocd knows of this process: session, config version, counts."""
    if _managed is not None:
        return {"connected": True, "mode": "managed", **_managed.stats()}
    if _advisor is None:
        return {"connected": False}
    return {
        "connected": True,
        "mode": "advise",
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
        "memory_stats": dict(_advisor.last_stats),
    }


def shutdown():
    """Stops advising and ends the session (also done at interpreter exit)."""
    global _advisor
    if _advisor is not None:
        _advisor.stop()
        _advisor = None


import atexit  # noqa: E402  (registered once the module is complete)

atexit.register(shutdown)
