"""What the training scripts do to the daemon mid-run: SIGKILL it after a
step and, if asked, start it again a second later."""
import os
import signal
import subprocess
import sys
import time


def kill_daemon(pid, restart_command, step):
    """SIGKILLs the daemon `pid`; runs the shell `restart_command` 1 s later
    (when not empty) in its own session with none of this process's pipes:
    a daemon holding them would keep `script | tee` (or torchrun's) open."""
    os.kill(pid, signal.SIGKILL)
    print(f"step {step}: killed the daemon (pid {pid})", file=sys.stderr)
    if restart_command:
        time.sleep(1.0)
        subprocess.Popen(restart_command, shell=True, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        print(f"step {step}: restarted it", file=sys.stderr)
