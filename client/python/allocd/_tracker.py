"""The allocation stream from a C++ trace tracker inside PyTorch's allocator.

allocd's autotuner replays what the job's allocator did: every alloc,
free_requested and free_completed. Reading them from PyTorch's history
(``_snapshot()``, _history.HistoryReader) builds a Python dict per event with
the GIL held; a job with 13,000 events a step lost 8% of its mean step to
it. The tracker in ``_trace_tracker.cpp`` keeps them in C++ as the allocator
makes them, and a round takes them as four arrays.

It must be compiled against the PyTorch the job runs (PyTorch has no C ABI
for it): ``build()`` does that once per PyTorch version and source, with
the system's C++ compiler and the headers PyTorch ships, into
``$ALLOCD_CACHE_DIR`` (default ``$XDG_CACHE_HOME/allocd``, else
``~/.cache/allocd``); processes of one node share it, and while one
compiles the others wait for it. Where it cannot (no compiler, no CUDA
headers, a PyTorch whose API differs), ``TrackerUnavailable`` says why and
allocd reads PyTorch's history instead.
"""

import array
import ctypes
import fcntl
import functools
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

from . import _allocator_state, _history
from ._bindings import address, load

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_trace_tracker.cpp")
_COMPILE_TIMEOUT_S = 600


class TrackerUnavailable(Exception):
    """The tracker cannot be built or attached here; the message says why."""


def cache_dir():
    explicit = os.environ.get("ALLOCD_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "allocd")


def _include_paths(torch):
    cpp_extension = getattr(getattr(torch, "utils", None), "cpp_extension", None)
    if cpp_extension is None:
        try:
            cpp_extension = importlib.import_module(torch.__name__ + ".utils.cpp_extension")
        except ImportError as error:
            raise TrackerUnavailable(f"torch.utils.cpp_extension is missing ({error})") from None
    try:
        return cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # PyTorch before 2.6 took a flag
        return cpp_extension.include_paths(cuda=True)


def _compiler():
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise TrackerUnavailable("no C++ compiler (c++, g++ or $CXX) on this machine")
    return cxx


def build(torch):
    """The path of the tracker library for this PyTorch, compiled if not cached."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    key = hashlib.sha256(source + f"{torch.__version__}|{abi}".encode()).hexdigest()[:16]
    directory = cache_dir()
    path = os.path.join(directory, f"trace_tracker-{key}.so")
    if os.path.exists(path):
        return path
    try:
        os.makedirs(directory, exist_ok=True)
        lock = open(os.path.join(directory, ".lock"), "w")
    except OSError as error:
        raise TrackerUnavailable(f"cannot write the cache {directory}: {error}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process of the node compiling it
        if os.path.exists(path):
            return path
        includes = _include_paths(torch)
        lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        cxx = _compiler()
        sys.stderr.write(f"allocd: compiling the allocation-stream tracker for PyTorch "
                         f"{torch.__version__} into {directory} (once per version)\n")
        fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
        error = ""
        try:
            # PyTorch's headers want C++17 before 2.10, C++20 since.
            for standard in ("c++20", "c++17"):
                command = [cxx, f"-std={standard}", "-O2", "-shared", "-fPIC",
                           f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                           *[f"-I{p}" for p in includes], _SOURCE,
                           f"-L{lib_dir}", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{lib_dir}",
                           "-o", partial]
                try:
                    done = subprocess.run(command, capture_output=True, text=True,
                                          timeout=_COMPILE_TIMEOUT_S)
                except (OSError, subprocess.TimeoutExpired) as error:
                    raise TrackerUnavailable(f"compiling it failed: {error}") from None
                if done.returncode == 0:
                    os.replace(partial, path)  # whole or not at all, for the others
                    return path
                lines = done.stderr.strip().splitlines()
                error = next((line for line in lines if "error" in line), lines[-1] if lines else "")
            raise TrackerUnavailable(f"compiling it against PyTorch {torch.__version__} "
                                     f"failed: {error.strip()}")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)


_SIGNATURES = {
    "allocd_tracker_attach": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64]),
    "allocd_tracker_stop": (None, []),
    "allocd_tracker_pending": (ctypes.c_uint64, []),
    "allocd_tracker_mark_step": (ctypes.c_int, []),
    "allocd_tracker_take": (ctypes.c_uint64, [ctypes.c_void_p] * 4 +
                            [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]),
    "allocd_tracker_read_state": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                                 ctypes.POINTER(ctypes.c_uint64 * 2)]),
    "allocd_tracker_take_state": (None, [ctypes.c_void_p] * 9),
    "allocd_history_supported": (ctypes.c_int, []),
    "allocd_history_record": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_int]),
    "allocd_history_counted": (ctypes.c_uint64, [ctypes.c_int]),
    "allocd_history_take": (ctypes.c_int64, [ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_int)]),
    "allocd_history_copy": (None, [ctypes.c_void_p] * 4),
}


def _read_state(lib, device):
    """The allocator's state, as _allocator_state.read_state gives it (None
    when there are more than a state holds), read by PyTorch's C++ snapshot
    without a Python object per block; RuntimeError when PyTorch's
    allocator gives none."""
    counts = (ctypes.c_uint64 * 2)()
    result = lib.allocd_tracker_read_state(
        device, _allocator_state.MAX_SEGMENTS, _allocator_state.MAX_BLOCKS, ctypes.byref(counts))
    if result < 0:
        raise RuntimeError("PyTorch's allocator gave no snapshot")
    if result > 0:
        return None
    segments, blocks = counts
    columns = _allocator_state.empty_columns(segments, blocks)
    lib.allocd_tracker_take_state(*(address(c) for c in columns))
    return columns


def _columns(n):
    """Four empty columns of `n` events: ops, sizes, ids, streams."""
    return (array.array("B", bytes(n)), *(array.array("Q", bytes(8 * n)) for _ in range(3)))


@functools.lru_cache(maxsize=None)
def _gil_holding_take(path):
    """allocd_history_take of the library at `path`, called with the GIL held."""
    take = ctypes.PyDLL(path).allocd_history_take
    take.restype, take.argtypes = _SIGNATURES["allocd_history_take"]
    return take


class NativeHistory:
    """PyTorch's history through the tracker's library: _history.PythonHistory's
    interface, armed, taken and counted in C++. A round's events come from
    PyTorch's C++ snapshot into four columns, with no Python object per
    event or block, and the ring is re-armed in the same call, right after
    the snapshot (fewer events fall between them)."""

    def __init__(self, lib, device, ring):
        self._lib = lib
        self._device = device
        self.ring = ring
        # The take holds the GIL (a PyDLL function of the same library): the
        # events a job's Python threads would make between the snapshot and
        # the re-arm are lost, and a take is about a millisecond (the
        # Python reader holds it for its whole round, several). On the H200,
        # takes without it lost 192 of 319,608 events to a training loop
        # (tracker_check.py), with it 0 of 321,360.
        self._take = _gil_holding_take(lib._name)

    def _record(self, enabled, clear):
        if self._lib.allocd_history_record(enabled, self.ring, int(clear)) != 0:
            raise RuntimeError("PyTorch refused to record its allocator history")

    def arm(self, clear):
        self._record(1, clear)

    def disarm(self):
        self._record(0, True)

    def counted(self):
        return self._lib.allocd_history_counted(self._device)

    def take(self, rearm):
        job_armed = ctypes.c_int(0)
        n = self._take(self._device, self.ring, int(rearm), ctypes.byref(job_armed))
        if n == -1:
            raise RuntimeError("PyTorch's allocator gave no snapshot")
        if n == -2:
            raise RuntimeError("PyTorch refused to record its allocator history")
        columns = _columns(n)
        self._lib.allocd_history_copy(*(address(c) for c in columns))
        return (*columns, bool(job_armed.value))

    def read_state(self):
        return _read_state(self._lib, self._device)


class TrackerReader:
    """The allocation stream of one device from the tracker: start, stop, read.

    The interface of _history.HistoryReader. ``capacity`` bounds the events
    kept between two reads; beyond it the newest are counted as dropped and
    reported before the events that follow the gap.
    """

    def __init__(self, lib, torch, device, capacity=_history.RING):
        self._lib = lib
        self._torch = torch
        self._device = device
        self.capacity = capacity
        self._gap = 0  # dropped after the last events read
        self._stopped = False  # an attach queued for CUDA's initialisation is void

    @classmethod
    def for_torch(cls, torch, device):
        """Built (or cached) for this PyTorch and loaded; TrackerUnavailable if not."""
        try:
            return cls(load(build(torch), _SIGNATURES), torch, device)
        except OSError as error:
            raise TrackerUnavailable(f"loading it failed: {error}") from None

    def start(self):
        """Keeps the device's events from now on; TrackerUnavailable when
        PyTorch refuses the tracker.

        PyTorch gives a tracker only to the device allocators that exist,
        and makes them at CUDA's lazy initialisation: before it (transparent
        enable() runs before the job touches CUDA) the tracker is attached
        there (torch.cuda._lazy_call), not by initialising CUDA now, which a
        job that forks before it uses CUDA could not live with. A refusal
        then is a warning: the job's CUDA must not fail for it.
        """
        self._gap = 0
        self._stopped = False
        if self._torch.cuda.is_initialized():
            self._attach()
        else:
            self._torch.cuda._lazy_call(self._attach_at_initialisation)

    def _attach(self):
        if self._lib.allocd_tracker_attach(self._device, self.capacity) != 0:
            raise TrackerUnavailable("PyTorch refused the tracker")

    def _attach_at_initialisation(self):
        if self._stopped:
            return
        try:
            self._attach()
        except TrackerUnavailable as why:
            warnings.warn(f"allocd: the allocation-stream tracker: {why}; the autotuner gets "
                          "no events from this process", stacklevel=2)

    def stop(self):
        self._stopped = True
        self._lib.allocd_tracker_stop()

    def mark_step(self):
        """The job ended a step here (its optimizer stepped): a step mark in the
        stream, in order with the allocator's events."""
        self._lib.allocd_tracker_mark_step()

    def read_state(self):
        """The allocator's state (_read_state)."""
        return _read_state(self._lib, self._device)

    def history_reader(self):
        """A reader of PyTorch's history (the stream a tracker's stream reads
        first, since the history can stop), through this tracker's library
        where it can arm this PyTorch's history, else through Python."""
        access = None
        if self._lib.allocd_history_supported():
            access = NativeHistory(self._lib, self._device, _history.RING)
        return _history.HistoryReader(self._torch, self._device, access=access)

    def read(self):
        """Events since the last round, as (ops, sizes, ids, streams, dropped_before)."""
        n = self._lib.allocd_tracker_pending()
        ops, sizes, ids, streams = _columns(n)
        dropped = ctypes.c_uint64(0)
        got = self._lib.allocd_tracker_take(address(ops), address(sizes), address(ids),
                                            address(streams), n, ctypes.byref(dropped))
        for column in (ops, sizes, ids, streams):
            del column[got:]
        before, self._gap = self._gap, dropped.value
        return ops, sizes, ids, streams, before
