"""Transparent mode, the default managed mode: PyTorch's own caching
allocator runs unchanged on GPU memory from the daemon.

liballocd_interpose.so serves cudaMalloc/cudaFree and the VMM calls of
expandable segments under PyTorch's allocator, and opens the daemon session
itself when PyTorch first asks for memory. Python drives that session's
telemetry and configs with the advisor (_advisor.py), as advise() does.
"""

import ctypes
import os
import sys

from ._bindings import (INTERPOSE_LIBRARY, AllocdUnavailable, library_path, load_client,
                        loaded_interposer)


def load_interposer(socket, job, autotune):
    """liballocd_interpose.so, as (its path, its client functions), told the
    session's settings. The one `allocd run` preloaded, else loaded here
    with its symbols global, which works only before PyTorch initialises
    CUDA. AllocdUnavailable when CUDA is initialised already or the library
    is missing; OSError when it does not load."""
    path = preloaded = loaded_interposer()
    if path is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise AllocdUnavailable(
                "CUDA was initialised before allocd.enable(): start the job with "
                "`allocd run -- python ...`, or call allocd.enable() before importing torch")
        path = library_path(INTERPOSE_LIBRARY)
    # The interposer connects with these when PyTorch first asks for memory
    # ("": the default socket).
    os.environ["ALLOCD_SOCKET"], os.environ["ALLOCD_JOB"] = socket, job
    os.environ["ALLOCD_AUTOTUNE"] = autotune
    lib = load_client(path, mode=ctypes.RTLD_GLOBAL)
    if preloaded is None:  # `allocd run` did it before the program started
        start_on_learned_config(lib, socket, job)
    return path, lib


# The variables allocd_start_on_learned_config sets for PyTorch and the
# interposer, which read the C environment.
_LEARNED_START_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                            "ALLOCD_INITIAL_ALLOC_CONF", "ALLOCD_LEARNED_ALLOC_CONF",
                            "ALLOCD_START_CONFIG_SOURCE")


def start_on_learned_config(lib, socket, job):
    """Starts PyTorch on the config the job learned in earlier runs, as
    `allocd run` does, before PyTorch reads its config. Without a daemon
    nothing changes: the interposer's session says why, and a daemon that
    comes up hands the learned config at registration."""
    learned = ctypes.create_string_buffer(4096)
    if lib.allocd_start_on_learned_config(socket.encode(), job.encode(), learned,
                                          len(learned)) != 0 or not learned.value:
        return
    # Python's os.environ is its own copy: it is told what the library set.
    getenv = ctypes.CDLL(None).getenv
    getenv.restype, getenv.argtypes = ctypes.c_char_p, [ctypes.c_char_p]
    for name in _LEARNED_START_VARIABLES:
        value = getenv(name.encode())
        if value is not None:
            os.environ[name] = value.decode()


def open_session(lib, device):
    """The interposer's daemon session for CUDA device `device`, as the
    client the advisor drives. AllocdUnavailable when it has none."""
    client = lib.allocd_interpose_session(device)
    if not client:
        raise AllocdUnavailable(
            f"no daemon session for CUDA device {device} (the interposer said why on stderr); "
            "the job runs on PyTorch's own memory")
    return client
