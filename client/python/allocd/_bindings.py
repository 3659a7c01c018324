"""allocd's C libraries through ctypes: where they are found, how they load,
and liballocd_client's C functions with their signatures (the engine's and
the tracker's libraries keep their tables in their own modules).
"""

import ctypes
import os

CLIENT_LIBRARY = "liballocd_client.so"
INTERPOSE_LIBRARY = "liballocd_interpose.so"


class AllocdUnavailable(RuntimeError):
    """No allocd daemon could be reached (or its client library loaded)."""

    # Raised to users as allocd.AllocdUnavailable, the name they catch.
    __module__ = "allocd"


def library_path(name=CLIENT_LIBRARY):
    """The path of allocd's library `name`: in $ALLOCD_LIB_DIR, else next to
    the package. AllocdUnavailable when neither has it."""
    here = os.path.dirname(os.path.abspath(__file__))
    for directory in (os.environ.get("ALLOCD_LIB_DIR"), here):
        if directory and os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise AllocdUnavailable(
        f"{name} not found next to {here} or in $ALLOCD_LIB_DIR; "
        "build allocd (cmake --build --preset release; liballocd_torch.so needs the "
        "CUDA toolkit) and import the package from build/release/python, or "
        "pip install build/release/python")


# liballocd_client's calls made holding the GIL (through a ctypes.PyDLL
# handle of the same library, load_client's `gil_held`). Each is brief, and
# the advisor makes them on its round and in the step hook while the job's
# thread runs Python: released and retaken around each, the GIL changed
# hands twice more a round and once more a step, each time a wait for the
# job's thread. On ResNet-50 the advisor's rounds and step hook together
# cost 3.2% of the step against a second native process (12 of 12 process
# sets), the advisor without them 0.05%
# (bench/gpu/results/packing/run_1202d_advisor_parts).
# No deadlock, because no caller waits for a lock these hold while Python
# runs: allocd_poll runs Python (the allocator's stats and settings)
# holding the client's poll lock, and Python may hand the GIL over
# meanwhile, so the lock's other taker, allocd_session_stats, releases the
# GIL while it waits (it stays out of this list); allocd_mark_step's lock
# (SecondRelease's) is never held while Python runs.
GIL_HELD_CALLS = ("allocd_poll", "allocd_mark_step")


def load(path, signatures, mode=ctypes.DEFAULT_MODE, library=ctypes.CDLL):
    """The library at `path` (as a `library`: CDLL releases the GIL in each
    call, PyDLL holds it), its functions typed as `signatures` says."""
    lib = library(path, mode=mode)
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def typed_functions(lib, signatures):
    """`lib`'s functions named in `signatures` ({name: (restype, argtypes)}),
    typed, in its order; None when `lib` lacks one (an older build)."""
    functions = [getattr(lib, name, None) for name in signatures]
    if None in functions:
        return None
    for function, (restype, argtypes) in zip(functions, signatures.values()):
        function.restype, function.argtypes = restype, argtypes
    return functions


def default_socket():
    """Where the daemon serves clients unless told otherwise: the client
    library's constant. AllocdUnavailable when the library is missing."""
    lib = load(library_path(), {"allocd_default_socket": (ctypes.c_char_p, [])})
    return lib.allocd_default_socket().decode()


def address(column):
    """Where an array.array's items start, for a C function (None when empty)."""
    return column.buffer_info()[0] if len(column) else None


def loaded_interposer():
    """The path of liballocd_interpose.so if this process has it loaded."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if path.endswith("/" + INTERPOSE_LIBRARY):
                return path
    return None


class Target(ctypes.Structure):
    """allocd_target: the allocator a session's control loop drives
    (allocd_poll), as its functions and their context (RELEASE_CACHED() is
    none: empty_cache serves)."""

    RECONFIGURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                                   ctypes.c_size_t, ctypes.c_void_p)
    EMPTY_CACHE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    STATS = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    RELEASE_CACHED = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_void_p)
    _fields_ = [("reconfigure", RECONFIGURE), ("empty_cache", EMPTY_CACHE),
                ("stats", STATS), ("context", ctypes.c_void_p),
                ("release_cached", RELEASE_CACHED)]


def load_client(path=None, mode=ctypes.DEFAULT_MODE):
    """liballocd_client's C functions: from the interposer when this process
    has it (one copy of the client per process), else liballocd_client.so.
    Its `gil_held` has GIL_HELD_CALLS, made holding the GIL."""
    path = path or loaded_interposer() or library_path()
    extra = {"allocd_interpose_session": (ctypes.c_void_p, [ctypes.c_int]),
             "allocd_interpose_wait_session": (ctypes.c_int, [])} \
        if os.path.basename(path) == INTERPOSE_LIBRARY else {}
    c_client = ctypes.c_void_p
    signatures = {
        **extra,
        "allocd_last_error": (ctypes.c_char_p, []),
        "allocd_start_on_learned_config": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p,
                                                          ctypes.c_char_p, ctypes.c_size_t]),
        "allocd_connect_gpu": (c_client, [ctypes.c_char_p] * 6),
        "allocd_record_events": (ctypes.c_int64, [c_client, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_size_t, ctypes.c_uint64]),
        "allocd_record_state": (ctypes.c_int, [c_client] + [ctypes.c_void_p] * 4 +
                                [ctypes.c_size_t] + [ctypes.c_void_p] * 5 +
                                [ctypes.c_size_t]),
        "allocd_disconnect": (None, [c_client]),
        "allocd_session_id": (ctypes.c_uint64, [c_client]),
        "allocd_flush_telemetry": (ctypes.c_int, [c_client]),
        "allocd_poll": (ctypes.c_int, [c_client, ctypes.POINTER(Target)]),
        "allocd_mark_step": (ctypes.c_int, [c_client, ctypes.POINTER(Target)]),
        "allocd_wait_control": (ctypes.c_int, [c_client, ctypes.c_uint32]),
        "allocd_stop_waiting_control": (None, [c_client]),
        "allocd_session_stats": (ctypes.c_int64, [c_client, ctypes.c_char_p, ctypes.c_size_t]),
        "allocd_report_oom": (ctypes.c_int, [c_client, ctypes.c_uint64, ctypes.c_char_p]),
        "allocd_report_features": (ctypes.c_int, [c_client, ctypes.c_uint32]),
    }
    lib = load(path, signatures, mode=mode)
    lib.gil_held = load(path, {name: signatures[name] for name in GIL_HELD_CALLS}, mode=mode,
                        library=ctypes.PyDLL)
    return lib
