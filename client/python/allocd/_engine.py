"""Engine mode: allocd's copy of PyTorch's caching allocator, behind
``torch.cuda.memory.CUDAPluggableAllocator``, on GPU memory from the daemon.

This is where allocd runs allocator policies of its own. PyTorch asks a
pluggable allocator only for malloc, free and a few hooks; everything else
PyTorch's Python calls on its allocator, a pluggable one refuses
("CUDAPluggableAllocator does not yet support getDeviceStats"). So engine
mode answers those calls itself, from the engine, at the one place every
public name goes through: the ``torch._C`` functions that PyTorch's own
Python functions look up each time they run (not at import), for the managed
device only:

==========================================  ===================================
torch._C function                           public functions it serves
==========================================  ===================================
_cuda_memoryStats                           torch.cuda[.memory].memory_stats,
                                            memory_stats_as_nested_dict,
                                            memory_allocated, memory_reserved,
                                            max_memory_allocated,
                                            max_memory_reserved, memory_summary
_cuda_resetPeakMemoryStats                  reset_peak_memory_stats
                                            (and reset_max_memory_allocated)
_cuda_resetAccumulatedMemoryStats           reset_accumulated_memory_stats
_accelerator_getDeviceStats                 torch.accelerator.memory_stats,
                                            memory_allocated, memory_reserved,
                                            max_memory_allocated,
                                            max_memory_reserved
_accelerator_resetPeakStats                 torch.accelerator.reset_peak_memory_stats
_accelerator_resetAccumulatedStats          torch.accelerator.reset_accumulated_memory_stats
_accelerator_isAllocatorInitialized         every torch.accelerator memory function
                                            (the allocator PyTorch registered
                                            for CUDA is never initialized
                                            under a pluggable one)
_accelerator_emptyCache                     torch.accelerator.empty_cache
_cuda_memorySnapshot                        torch.cuda.memory._snapshot,
                                            memory_snapshot, _dump_snapshot
_cuda_record_memory_history(_legacy)        torch.cuda.memory._record_memory_history
==========================================  ===================================

Routing there rather than replacing the public functions keeps their
signatures, defaults and device handling exactly PyTorch's (each turns its
``device`` argument into an index before the call), and also serves code
that bound a public name before ``enable()`` (``from torch.cuda import
memory_allocated``). ``unroute()`` (``allocd.shutdown()``) puts PyTorch's
functions back.

What engine mode cannot offer: what PyTorch 2.9-2.11's pluggable wrapper
(torch/csrc/cuda/CUDAPluggableAllocator.cpp) refuses and Python cannot
answer for it, because PyTorch's C++ calls it directly:
- CUDA-graph memory pools: the graph trees of
  ``torch.compile(mode="reduce-overhead")`` fail ("does not yet support
  checkPoolLiveAllocations"; getCheckpointState and setCheckpointPoolState
  likewise). The engine has no private graph pools either (PyTorch's
  begin/endAllocateToPool hooks), so ``torch.cuda.graph`` capture is not
  supported: memory a captured graph uses could be handed to other tensors.
  ``torch.cuda.MemPool`` / ``use_mem_pool`` go through the same hooks and are
  not supported either.
- ``getIpcDevPtr``: opening a CUDA tensor another process shared
  (``torch.multiprocessing``).
- ``cacheInfo`` (the largest cached block), which cuDNN's v7 benchmark path
  asks to size workspaces.
- ``attachOutOfMemoryObserver`` (``torch._C._cuda_attach_out_of_memory_observer``)
  and ``attachAllocatorTraceTracker`` (NCCL's allocator-registration hook).
- Stack frames: snapshots have the engine's segments, blocks and events,
  each with empty ``frames`` (the engine never sees Python's stack);
  ``_record_memory_history``'s context/stacks/skip_actions are ignored.
"""

import ctypes
import json
import pickle
import sys
import warnings

from ._bindings import AllocdUnavailable, library_path, load

_TORCH_LIBRARY = "liballocd_torch.so"

_SIGNATURES = {
    "allocd_torch_configure": (ctypes.c_int, [ctypes.c_char_p] * 3 + [ctypes.c_int,
                                                                  ctypes.c_char_p]),
    "allocd_torch_last_error": (ctypes.c_char_p, []),
    "allocd_torch_stats_json": (ctypes.c_int64, [ctypes.c_char_p, ctypes.c_size_t]),
    "allocd_torch_memory_stats_json": (ctypes.c_int64, [ctypes.c_char_p, ctypes.c_size_t]),
    "allocd_torch_reset_peak_stats": (ctypes.c_int, []),
    "allocd_torch_reset_accumulated_stats": (ctypes.c_int, []),
    "allocd_torch_device": (ctypes.c_int, []),
    "allocd_torch_record_history": (ctypes.c_int, [ctypes.c_int, ctypes.c_uint64, ctypes.c_int]),
    "allocd_torch_snapshot_pickle": (ctypes.c_int64, [ctypes.c_char_p, ctypes.c_size_t]),
    "allocd_torch_oom_is_torch_error": (ctypes.c_int, []),
}

# PyTorch's allocator hooks that liballocd_torch serves, by setter.
_HOOKS = (("set_reset_fn", "allocd_torch_empty_cache"),
          ("set_memory_fraction_fn", "allocd_torch_set_memory_fraction"),
          ("set_record_stream_fn", "allocd_torch_record_stream"))


def enable(torch, socket, job, config, device, autotune=""):
    """Installs liballocd_torch.so as PyTorch's CUDA allocator and routes
    PyTorch's memory functions to it. Returns the Engine. Raises
    AllocdUnavailable (or OSError) when it cannot, before touching PyTorch.
    """
    path = library_path(_TORCH_LIBRARY)
    lib = load(path, _SIGNATURES)
    if lib.allocd_torch_configure(socket.encode(), job.encode(), config.encode(), device,
                                  autotune.encode()):
        raise AllocdUnavailable(lib.allocd_torch_last_error().decode(errors="replace"))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "allocd_torch_malloc", "allocd_torch_free")
    hooks = allocator.allocator()
    for setter, symbol in _HOOKS:
        if hasattr(hooks, setter):
            getattr(hooks, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(allocator)
    engine = Engine(lib, torch, allocator)
    engine.route()
    return engine


def enable_mode(torch, socket, job, config, device, autotune):
    """enable(mode="engine"): enable(), and a warning when an allocation that
    does not fit cannot raise PyTorch's own error type."""
    engine = enable(torch, socket, job, config, device, autotune)
    if not engine.oom_is_torch_error():
        warnings.warn("allocd: PyTorch's c10 library was not found in this process: an "
                      "allocation that does not fit raises RuntimeError, not "
                      "torch.OutOfMemoryError", RuntimeWarning, stacklevel=3)
    return engine


def _nested(flat):
    """{"allocated_bytes.all.peak": 1} -> {"allocated_bytes": {"all": {"peak": 1}}},
    the shape torch._C._cuda_memoryStats returns."""
    nested = {}
    for name, value in flat.items():
        *path, leaf = name.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


class Engine:
    """liballocd_torch.so, installed as PyTorch's CUDA allocator."""

    mode = "engine"

    def __init__(self, lib, torch, allocator=None):
        self.lib = lib
        self.torch = torch
        self.allocator = allocator  # keeps PyTorch's wrapper alive
        self.device = lib.allocd_torch_device()
        # torch._C function name -> PyTorch's own, while routed.
        self._originals = {}

    # -- the engine's answers ------------------------------------------------

    def _read(self, function):
        """The bytes a size-returning liballocd_torch function writes."""
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = function(buffer, size)
            if n < 0:
                raise RuntimeError("allocd: " + self.lib.allocd_torch_last_error().decode(
                    errors="replace"))
            if n < size:
                return buffer.raw[:n]
            size = n + 1

    def stats(self):
        """The counters plus the session (allocd.stats())."""
        return json.loads(self._read(self.lib.allocd_torch_stats_json))

    def memory_stats(self):
        """The engine's counters under torch.cuda.memory_stats()'s names."""
        return json.loads(self._read(self.lib.allocd_torch_memory_stats_json))

    def snapshot(self):
        """torch.cuda.memory._snapshot()'s dict, from the engine."""
        return pickle.loads(self._read(self.lib.allocd_torch_snapshot_pickle))

    def reset_peak_stats(self):
        self.lib.allocd_torch_reset_peak_stats()

    def reset_accumulated_stats(self):
        self.lib.allocd_torch_reset_accumulated_stats()

    def record_history(self, enabled, max_entries=sys.maxsize, clear=False):
        self.lib.allocd_torch_record_history(int(bool(enabled)), max(0, int(max_entries)),
                                             int(bool(clear)))

    def oom_is_torch_error(self):
        """Whether a failed allocation raises torch.OutOfMemoryError here."""
        return bool(self.lib.allocd_torch_oom_is_torch_error())

    # -- routing PyTorch's memory functions ---------------------------------

    def _manages(self, device):
        # PyTorch's Python passes an index (None only from callers of the
        # private function that mean the current device).
        if device is None:
            return self.torch.cuda.current_device() == self.device
        return int(device) == self.device

    def _per_device(self, name, answer):
        """torch._C.`name`(device): the engine's `answer()` for the managed
        device, PyTorch's own function for any other."""
        original = self._originals[name]

        def routed(device=None, *args, **kwargs):
            if self._manages(device):
                return answer()
            return original(device, *args, **kwargs)

        return routed

    def _snapshot(self, name):
        original = self._originals[name]

        def routed(pool=None, *args, **kwargs):
            # `pool`: None (_snapshot), or (pool id, pool id, include_traces)
            # from memory_snapshot on 2.10+, (0, 0, ...) naming the default
            # pool. A MemPool's snapshot is PyTorch's (engine mode has no
            # pools).
            if pool is not None and tuple(pool[:2]) != (0, 0):
                return original(pool, *args, **kwargs)
            snapshot = self.snapshot()
            if pool is not None and len(pool) > 2 and not pool[2]:
                snapshot["device_traces"] = [[] for _ in snapshot.get("device_traces", [])]
            return snapshot

        return routed

    def _serves_current_device(self):
        """Whether PyTorch's CUDA is up and its current device is the engine's
        (the torch.accelerator calls below name no device)."""
        return self.torch.cuda.is_initialized() and self._manages(None)

    def _allocator_initialized(self):
        # torch.accelerator asks the allocator PyTorch registered for CUDA at
        # load time, which a pluggable allocator does not replace: it stays
        # uninitialized, and torch.accelerator.memory_stats() would be {}.
        original = self._originals["_accelerator_isAllocatorInitialized"]

        def routed():
            return bool(original()) or self._serves_current_device()

        return routed

    def _empty_cache(self):
        # Likewise torch.accelerator.empty_cache(): that registered allocator
        # holds nothing; PyTorch's current (pluggable) allocator is the
        # engine's.
        original = self._originals["_accelerator_emptyCache"]

        def routed():
            if self._serves_current_device():
                return self.torch._C._cuda_emptyCache()
            return original()

        return routed

    def _record_history(self, enabled, context="all", stacks="all", max_entries=sys.maxsize,
                        clear_history=False, *args, **kwargs):
        # torch._C._cuda_record_memory_history's positional arguments.
        # "state" keeps stack traces of live blocks only, which the engine
        # has none of: the segments are in every snapshot anyway.
        self.record_history(enabled == "all", max_entries, clear_history)

    def _record_history_legacy(self, enabled, record_context=True, trace_alloc_max_entries=1,
                               trace_alloc_record_context=False, record_context_cpp=False,
                               clear_history=False, *args, **kwargs):
        self.record_history(enabled and trace_alloc_max_entries > 1, trace_alloc_max_entries,
                            clear_history)

    def _routes(self):
        nested = lambda: _nested(self.memory_stats())  # noqa: E731
        return {
            "_cuda_memoryStats": lambda: self._per_device("_cuda_memoryStats", nested),
            "_cuda_resetPeakMemoryStats": lambda: self._per_device(
                "_cuda_resetPeakMemoryStats", self.reset_peak_stats),
            "_cuda_resetAccumulatedMemoryStats": lambda: self._per_device(
                "_cuda_resetAccumulatedMemoryStats", self.reset_accumulated_stats),
            "_accelerator_getDeviceStats": lambda: self._per_device(
                "_accelerator_getDeviceStats", nested),
            "_accelerator_resetPeakStats": lambda: self._per_device(
                "_accelerator_resetPeakStats", self.reset_peak_stats),
            "_accelerator_resetAccumulatedStats": lambda: self._per_device(
                "_accelerator_resetAccumulatedStats", self.reset_accumulated_stats),
            "_accelerator_isAllocatorInitialized": self._allocator_initialized,
            "_accelerator_emptyCache": self._empty_cache,
            "_cuda_memorySnapshot": lambda: self._snapshot("_cuda_memorySnapshot"),
            "_cuda_record_memory_history": lambda: self._record_history,
            "_cuda_record_memory_history_legacy": lambda: self._record_history_legacy,
        }

    def route(self):
        """Points PyTorch's memory functions at the engine (those this
        PyTorch has; the others are left alone)."""
        if self._originals:
            return
        c = self.torch._C
        for name, make in self._routes().items():
            original = getattr(c, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(c, name, make())

    def unroute(self):
        """Puts PyTorch's own functions back."""
        c = self.torch._C
        for name, original in self._originals.items():
            setattr(c, name, original)
        self._originals = {}
