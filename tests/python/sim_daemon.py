"""What the Python tests share to run a real `allocd serve --backend sim`
(ALLOCD_BINARY) and to wait on what it does."""

import os
import socket
import subprocess
import time


def wait_for(predicate, seconds=10.0):
    """Polls `predicate` until it is true (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def answers(path):
    """Whether a daemon accepts on the Unix socket `path`. The socket's file
    appears at bind(), a moment before the daemon listens; the daemon opens
    its tenant socket last, so when it accepts, every socket does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def start(socket_path, *flags):
    """`allocd serve --backend sim --socket SOCKET_PATH --metrics-addr ''
    --capacity 1GiB FLAGS`, once it accepts; None when it does not within
    10 s (killed then)."""
    daemon = subprocess.Popen(
        [os.environ["ALLOCD_BINARY"], "serve", "--backend", "sim", "--socket", socket_path,
         "--metrics-addr", "", "--capacity", "1GiB", *flags],
        stderr=subprocess.DEVNULL)
    if wait_for(lambda: answers(socket_path)):
        return daemon
    daemon.kill()
    daemon.wait()
    return None
