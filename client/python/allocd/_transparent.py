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
    path = loaded_interposer()
    if path is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise AllocdUnavailable(
                "CUDA was initialised before allocd.enable(): start the job with "
                "`allocd run -- python ...`, or call allocd.enable() before importing torch")
        path = library_path(INTERPOSE_LIBRARY)
    # The interposer connects with these when PyTorch first asks for memory.
    os.environ["ALLOCD_SOCKET"], os.environ["ALLOCD_JOB"] = socket, job
    os.environ["ALLOCD_AUTOTUNE"] = autotune
    return path, load_client(path, mode=ctypes.RTLD_GLOBAL)


def open_session(lib, device):
    """The interposer's daemon session for CUDA device `device`, as the
    client the advisor drives. AllocdUnavailable when it has none."""
    client = lib.allocd_interpose_session(device)
    if not client:
        raise AllocdUnavailable(
            f"no daemon session for CUDA device {device} (the interposer said why on stderr); "
            "the job runs on PyTorch's own memory")
    return client
