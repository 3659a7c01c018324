"""Transparent mode, the default managed mode: PyTorch's own caching
allocator runs unchanged on GPU memory from the daemon.

liballocd_interpose.so serves cudaMalloc/cudaFree and the VMM calls of
expandable segments under PyTorch's allocator, and opens the daemon session
itself when PyTorch first asks for memory. Python drives that session's
telemetry and configs with the advisor (_advisor.py), as advise() does.
"""

import ctypes
import json
import os
import subprocess
import sys
import warnings

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
        start_on_learned_config(path, socket, job)
    return path, lib


# The variables allocd_start_on_learned_config sets for PyTorch and the
# interposer, which read the C environment.
_LEARNED_START_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                            "ALLOCD_INITIAL_ALLOC_CONF", "ALLOCD_LEARNED_ALLOC_CONF",
                            "ALLOCD_START_CONFIG_SOURCE")

# The question, asked by a Python of its own: python -c ASK LIBRARY SOCKET JOB
# VARIABLE...; prints the variables the library set, as JSON ({} for no
# learned config or no daemon).
_ASK_LEARNED_CONFIG = """
import ctypes, json, sys
library, socket, job, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ask = ctypes.CDLL(library).allocd_start_on_learned_config
ask.restype = ctypes.c_int
ask.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
learned = ctypes.create_string_buffer(4096)
if ask(socket.encode(), job.encode(), learned, len(learned)) != 0 or not learned.value:
    print("{}")
    sys.exit(0)
getenv = ctypes.CDLL(None).getenv
getenv.restype, getenv.argtypes = ctypes.c_char_p, [ctypes.c_char_p]
print(json.dumps({name: getenv(name.encode()).decode() for name in names
                  if getenv(name.encode()) is not None}))
"""


def start_on_learned_config(library, socket, job):
    """Starts this process on the config the job learned in earlier runs, as
    `allocd run` does, before PyTorch reads its config: the variables that
    `library`'s allocd_start_on_learned_config sets, set here. Without a
    daemon nothing changes: the interposer's session says why, and a daemon
    that comes up hands the learned config at registration.

    The question is asked in a process of its own, as `allocd run` asks it
    before it starts the job: gRPC started in the job's process before
    PyTorch loads, even for one call, slowed a launch-bound step by 2-5% for
    the process's life (docs/results.md), where gRPC started after PyTorch
    (the interposer's session) costs nothing measurable."""
    try:
        if not sys.executable:  # an embedded Python names none
            raise OSError("this Python has no executable to ask from")
        asked = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _ASK_LEARNED_CONFIG, library, socket, job,
             *_LEARNED_START_VARIABLES],
            capture_output=True, text=True, timeout=60)
        if asked.returncode != 0:
            said = (asked.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
            raise OSError(f"exit status {asked.returncode}: {said}")
        learned = json.loads(asked.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        warnings.warn(f"allocd: the job's learned config could not be asked for ({e}); "
                      "the job starts on its own config", stacklevel=3)
        return
    # Python's os.environ sets the C environment too, which PyTorch and the
    # interposer read.
    os.environ.update(learned)


def open_session(lib, device):
    """The interposer's daemon session for CUDA device `device`, as the
    client the advisor drives. AllocdUnavailable when it has none."""
    client = lib.allocd_interpose_session(device)
    if not client:
        raise AllocdUnavailable(
            f"no daemon session for CUDA device {device} (the interposer said why on stderr); "
            "the job runs on PyTorch's own memory")
    return client
