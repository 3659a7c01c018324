"""A stand-in for torch in a program that `allocd run` starts (test_run.py).

What allocd's transparent mode asks of PyTorch (memory_stats, the allocator
history, _set_allocator_settings, empty_cache, the OOM observer, the
optimizer step hook), a CUDA that starts lazily and runs the calls queued
for its start (torch.cuda._lazy_call), and an allocator whose malloc() asks
the interposer for memory (cudaMalloc, found in the process as PyTorch's
libraries find it) and records alloc/free events in the history.
"""

import ctypes
import types

__version__ = "2.11.0+fake"

# What the program can look at: configs applied, caches emptied.
settings = []
empty_cache_calls = 0

_initialized = False
_queued = []
_ring = []
_recording = False
_max_entries = None
_counts = {"allocation.all.allocated": 0, "allocation.all.freed": 0, "active.all.freed": 0}
_next_addr = 1 << 20
_segments = 0


def _lazy_init():
    global _initialized
    if _initialized:
        return
    for call in _queued:
        call()
    _initialized = True


def _event(action, addr, size):
    counter = {"alloc": "allocation.all.allocated", "free_requested": "allocation.all.freed",
               "free_completed": "active.all.freed"}[action]
    _counts[counter] += 1
    if _recording:
        _ring.append({"action": action, "addr": addr, "size": size, "stream": 7, "frames": []})
        if _max_entries and len(_ring) > _max_entries:
            del _ring[0]


def malloc(size):
    """A CUDA tensor of `size` bytes: CUDA starts, and the first one makes the
    allocator ask the interposer for a segment."""
    global _next_addr, _segments
    _lazy_init()
    if not _segments:
        _segments = 1
        pointer = ctypes.c_void_p()
        cuda_malloc = ctypes.CDLL(None).cudaMalloc
        cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        if cuda_malloc(ctypes.byref(pointer), 2 << 20) != 0:
            raise RuntimeError("CUDA out of memory")
    addr, _next_addr = _next_addr, _next_addr + size
    _event("alloc", addr, size)
    return addr, size


def free(block):
    addr, size = block
    _event("free_requested", addr, size)
    _event("free_completed", addr, size)


def _lazy_call(callable, **kwargs):
    if _initialized:
        callable()
    else:
        _queued.append(callable)


def _set_allocator_settings(update):
    settings.append(update)


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None,
                           clear_history=False, skip_actions=None, **kwargs):
    global _recording, _max_entries
    _recording, _max_entries = enabled is not None, max_entries
    if clear_history or enabled is None:
        _ring.clear()


def _snapshot():
    return {"segments": [], "device_traces": [list(_ring)]}


def _memory_stats(device):
    return {"reserved_bytes.all.current": 4 << 20, "allocated_bytes.all.current": 1 << 20,
            "num_alloc_retries": 0, **_counts}


def _empty_cache():
    global empty_cache_calls
    empty_cache_calls += 1


def _no_uuid(device):
    raise AttributeError("uuid")


cuda = types.SimpleNamespace(
    _lazy_call=_lazy_call, is_initialized=lambda: _initialized,
    current_device=lambda: (_lazy_init(), 0)[1], memory_stats=_memory_stats,
    empty_cache=_empty_cache, get_device_properties=_no_uuid,
    memory=types.SimpleNamespace(_set_allocator_settings=_set_allocator_settings,
                                 _record_memory_history=_record_memory_history,
                                 _snapshot=_snapshot))
_C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=lambda observer: None)
optim = types.SimpleNamespace(optimizer=types.SimpleNamespace(
    register_optimizer_step_post_hook=lambda hook: types.SimpleNamespace(remove=lambda: None)))
