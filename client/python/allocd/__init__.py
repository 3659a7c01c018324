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
configs it pushes at runtime with PyTorch's runtime allocator settings
followed by ``empty_cache()`` (so the next peak is met under the new rules),
and once more when what was live at the switch is gone, and acknowledges each one (or reports why it could not), and empties the
cache when the daemon asks for memory back on behalf of another process.

If no daemon answers, the job goes on with PyTorch's allocator as it is and a
warning says why, unless ``required=True``.
"""

import functools
import json
import os
import threading
import warnings

from . import _advisor, _engine, _transparent
from ._bindings import AllocdUnavailable, default_socket

__all__ = ["enable", "advise", "stats", "shutdown", "AllocdUnavailable", "DEFAULT_SOCKET"]


def __getattr__(name):
    # DEFAULT_SOCKET is the client library's (proto/protocol.h), read when
    # asked for: `import allocd` loads no library.
    if name == "DEFAULT_SOCKET":
        return default_socket()
    raise AttributeError(f"module 'allocd' has no attribute {name!r}")


def _settings(socket, job):
    """socket, job and the allocator config: the arguments, else the
    environment's. The socket is "" when neither names one, which the
    libraries take for DEFAULT_SOCKET (read here, it would load
    liballocd_client.so, whose protobuf descriptors clash with the engine
    library's)."""
    socket = socket or os.environ.get("ALLOCD_SOCKET", "")
    job = job if job is not None else os.environ.get("ALLOCD_JOB", "")
    config = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))
    return socket, job, config


def _autotune_json(pinned_keys, autotune_mode, record_events):
    """The job's autotune preferences as the client library takes them. A job
    that sends its allocation stream marks its optimizer steps in it (the
    advisor's hook on torch.optim): the daemon then never guesses a step of
    a job that has no optimizer from the stream (a decoded token)."""
    preferences = {}
    if pinned_keys:
        preferences["pinned_keys"] = list(pinned_keys)
    if autotune_mode:
        preferences["mode"] = autotune_mode
    if record_events:
        preferences["marks_steps"] = True
    return json.dumps(preferences) if preferences else ""


def _unavailable(error, required):
    """What enable() and advise() return when allocd cannot be had: False with
    a warning, or AllocdUnavailable when the caller required allocd."""
    if required:
        raise AllocdUnavailable(str(error)) from error
    warnings.warn(f"allocd: not connected, PyTorch's allocator runs as it is: {error}",
                  RuntimeWarning, stacklevel=3)
    return False


class _State:
    """What allocd runs in this process: written only by enable(), advise()
    and shutdown(), read by stats()."""

    def __init__(self):
        # The advisor thread: advise()'s, or transparent mode's telemetry.
        self.advisor = None
        # What a mode of _MODES installed (with .mode, .stats(), .unroute()).
        self.managed = None
        # The interposer's path once transparent mode is on.
        self.interposer = None


_state = _State()
# enable() and advise() check and set _state under it: `allocd run` enables
# from a thread of its own (_autostart.py) while the job may call them.
_state_lock = threading.Lock()


def _serialised(function):
    @functools.wraps(function)
    def serialised(*args, **kwargs):
        with _state_lock:
            return function(*args, **kwargs)
    return serialised

# The modes that replace PyTorch's allocator: each takes (torch, socket, job,
# config, device, autotune preferences as JSON) and returns what it installed
# (with .mode, .stats() for allocd.stats() and .unroute() for shutdown()), or
# raises AllocdUnavailable/OSError before it changes PyTorch. The transparent
# mode, the default, keeps PyTorch's allocator and is set up before torch loads.
_MODES = {"engine": _engine.enable_mode}
_DEFAULT_MODE = "transparent"


@_serialised
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
    PyTorch's runtime allocator settings and reclaims with
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
    when another job on the GPU is short. A job whose label learned a
    config in earlier runs (a push the autotuner kept) starts on it: called
    before ``import torch``, enable() sets it for PyTorch as `allocd run`
    does, the job's own config kept as where a rollback returns. A peak
    that recurs with a steady period and that a neighbour's reclaim takes
    between occurrences (an inference server's large batch beside a
    trainer) is pre-warmed: a tenth of a period before it, the advisor
    gets its memory back into PyTorch's cache, so that the neighbour waits
    for it, not the job (allocd/_prewarm.py; stats()["prewarm"];
    $ALLOCD_PREWARM=0: off).

    Returns True when enabled. Calling it again is a no-op.
    """
    if _state.managed is not None or _state.interposer is not None:
        return True
    mode = mode or os.environ.get("ALLOCD_MODE", _DEFAULT_MODE)
    if mode == "transparent":
        return _enable_transparent(socket, job, device, required, period,
                                   _autotune_json(pinned_keys, autotune_mode, record_events), record_events)
    if mode not in _MODES:
        raise ValueError(f"allocd.enable: unknown mode {mode!r}; modes: transparent, "
                         f"{', '.join(_MODES)}")
    import torch

    socket, job, config = _settings(socket, job)
    device = 0 if device is None else device
    try:
        _state.managed = _MODES[mode](torch, socket, job, config, device,
                                      _autotune_json(pinned_keys, autotune_mode, False))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    return True


def _enable_transparent(socket, job, device, required, period, autotune, record_events):
    socket, job, _ = _settings(socket, job)
    try:
        path, lib = _transparent.load_interposer(socket, job, autotune)
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    # What PyTorch will run: the job's learned config, when it starts on one.
    config = _settings(socket, job)[2]
    import torch
    if device is None:
        device = torch.cuda.current_device()
    try:
        client = _transparent.open_session(lib, device)
    except AllocdUnavailable as error:
        return _unavailable(error, required)
    # PyTorch's own allocator: its stream is the autotuner's evidence, as in
    # advise().
    _state.advisor = _advisor.start_advisor(lib, client, torch, device, period, config,
                                            record_events, transparent=True)
    _state.interposer = path
    return True


@_serialised
def advise(socket=None, job=None, device=None, period=1.0, required=False,
           record_events=True, pinned_keys=(), autotune_mode=None):
    """Connects this job to the allocd daemon in advisor mode.

    socket: the daemon's socket ($ALLOCD_SOCKET, else allocd.DEFAULT_SOCKET).
    job: the job label that picks the configs the daemon pushes ($ALLOCD_JOB).
    device: the CUDA device whose allocator is advised (the current one).
    period: seconds between telemetry rounds (at most 0.1 s from the job's first
        step mark, until the first config is applied, the daemon stops the
        allocation stream, or for 30 s: the daemon sees the first steps as they
        end, and its push reaches the job within a few steps; sooner when the
        stream's reader would otherwise fill).
    required: raise AllocdUnavailable instead of warning when no daemon answers.
    record_events: send the allocator's alloc/free stream to the daemon's
        autotuner (off: stats only). It is read from PyTorch's allocator
        history first, which stops once the daemon has decided (a history
        the job records itself is left to it), then by a C++ tracker
        inside PyTorch's allocator, compiled against this PyTorch once per
        node (allocd/_tracker.py); where that cannot be built, from the
        history throughout, which costs the GIL a moment per event
        ($ALLOCD_EVENT_SOURCE: auto, tracker, history;
        $ALLOCD_HISTORY_FIRST_S).
    pinned_keys: PYTORCH_CUDA_ALLOC_CONF keys the autotuner must never change,
        e.g. ("expandable_segments",).
    autotune_mode: "off", "recommend" or "apply" for this job, unless an admin
        set its mode (default: the daemon's).

    What the job does that a config must not break (CUDA tensors shared with
    other processes, CUDA graphs, torch.cuda.MemPool, NCCL-registered
    segments) is reported to the daemon as it first happens, and its
    autotuner never pushes a config PyTorch cannot run with it; pushes are
    applied between CUDA graph captures (docs/compatibility.md).

    Returns True when connected. Calling it again is a no-op.
    """
    if _state.advisor is not None:
        return True
    import torch  # imported here so that `import allocd` stays cheap

    socket, job, initial = _settings(socket, job)
    if device is None:
        device = torch.cuda.current_device()
    try:
        lib, client = _advisor.connect(torch, socket, job, initial, device,
                                       _autotune_json(pinned_keys, autotune_mode,
                                                      record_events))
    except (AllocdUnavailable, OSError) as error:
        return _unavailable(error, required)
    _state.advisor = _advisor.start_advisor(lib, client, torch, device, period, initial,
                                            record_events)
    return True


def stats():
    """What allocd knows of this process: session, config version, counts;
    with the advisor, its time by part, the pre-warms ("prewarm") and the
    windows in which it held PyTorch's allocator ("allocator_holds")."""
    managed, advisor = _state.managed, _state.advisor
    if managed is not None:
        return {"connected": True, "mode": "managed", "managed_mode": managed.mode,
                **managed.stats()}
    if advisor is None:
        return {"connected": False}
    mode = {"mode": "managed", "managed_mode": "transparent"} if _state.interposer else {
        "mode": "advise"}
    return {"connected": True, **mode, **advisor.stats()}


def shutdown():
    """Stops advising and ends the session (also done at interpreter exit).

    In managed mode PyTorch's memory functions get their own implementations
    back; the allocator itself stays (PyTorch cannot swap it out)."""
    if _state.advisor is not None:
        _state.advisor.stop()
        _state.advisor = None
    if _state.managed is not None:
        _state.managed.unroute()


import atexit  # noqa: E402  (registered once the module is complete)

atexit.register(shutdown)
