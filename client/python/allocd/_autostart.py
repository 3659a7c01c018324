"""allocd in a job that ``allocd run`` started and that never imports allocd.

``allocd run`` preloads liballocd_interpose.so, which serves PyTorch's
memory from the daemon, and starts Python with allocd/_run/sitecustomize.py,
which calls ``start(torch)`` once the program has imported torch. From
there the job is tuned as with ``allocd.enable()``: its allocation stream
and telemetry reach the daemon, and the configs the daemon pushes (its
autotuner's, an admin's, the job's learned one) are applied.

The session starts where PyTorch first asks for memory, not at the import:
importing torch initialises no CUDA (a program that imports torch and never
uses a GPU, such as a DataLoader worker, runs as without allocd), and a
script that picks its GPU after CUDA starts (``torch.cuda.set_device`` with
its rank) is tuned on the GPU it uses. A thread waits, in the interposer and
without the GIL, for its first daemon session and enables allocd on that
session's device.
"""

import threading
import warnings

from ._bindings import AllocdUnavailable, load_client, loaded_interposer


def start(torch):
    """Tunes this process once PyTorch first asks the interposer for memory.
    AllocdUnavailable when the interposer is not loaded here."""
    path = loaded_interposer()
    if path is None:
        raise AllocdUnavailable(
            "liballocd_interpose.so is not loaded in this process (LD_PRELOAD was "
            "changed after allocd run set it)")
    lib = load_client(path)
    waiter = threading.Thread(target=_enable_on_first_session, args=(lib,),
                              name="allocd-autostart", daemon=True)
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is None:
        waiter.start()
        return

    def on_cuda_start():
        # An exception here would fail CUDA's initialisation, not allocd's.
        try:
            waiter.start()
        except RuntimeError as error:
            warnings.warn(f"allocd run: the job is not tuned: {error}", RuntimeWarning)

    # Only a process that starts CUDA waits for a session.
    lazy_call(on_cuda_start)


def _enable_on_first_session(lib):
    device = lib.allocd_interpose_wait_session()
    from . import enable

    try:
        enable(device=device, mode="transparent")
    except Exception as error:  # noqa: BLE001 (a thread of allocd's must not end the job)
        warnings.warn(f"allocd run: the job is not tuned: {error}", RuntimeWarning)
