"""`allocd run` tunes an unchanged script: a program with no `import allocd`
that imports torch gets allocd's transparent mode as with allocd.enable()
(allocd/_run/sitecustomize.py, allocd/_autostart.py), against a real
daemon; other programs run as they would.

No GPU here: a stand-in interposer (fake_interpose.cc: its session over
liballocd_client, connected at the first cudaMalloc) and a stand-in torch
(fake_torch/torch) play PyTorch's allocator on the daemon's memory.
Environment: ALLOCD_BINARY, ALLOCCTL_BINARY, ALLOCD_PYTHON_DIR,
FAKE_INTERPOSER, FAKE_TORCH_PYTHON.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import sim_daemon
from sim_daemon import wait_for

# A sanitizer runtime ctest preloads would come after the interposer that
# `allocd run` puts first, which the sanitizer refuses.
SANITIZED = "san" in os.environ.get("LD_PRELOAD", "")
os.environ.pop("LD_PRELOAD", None)

# Waits (bounded) until allocd is on in the program, without importing it.
WAIT_FOR_ALLOCD = """
import sys, time
def allocd_stats(seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        allocd = sys.modules.get("allocd")
        if allocd is not None and allocd.stats()["connected"]:
            return allocd.stats()
        time.sleep(0.02)
    return {"connected": False}
"""

# The unchanged training script: imports torch, allocates, never allocd.
TRAIN = WAIT_FOR_ALLOCD + """
import json
import torch

first = torch.malloc(1 << 20)  # CUDA starts; PyTorch's first cudaMalloc
stats = allocd_stats()
for _ in range(50):
    a, b = torch.malloc(1 << 20), torch.malloc(2 << 20)
    torch.free(a)
    torch.free(b)
print(json.dumps({k: stats.get(k) for k in ("connected", "mode", "managed_mode", "event_source")}),
      flush=True)
deadline = time.monotonic() + 30
while not torch.settings and time.monotonic() < deadline:  # the test pushes one
    time.sleep(0.02)
print(json.dumps({"settings": torch.settings, "empty_cache_calls": torch.empty_cache_calls}),
      flush=True)
"""


@unittest.skipIf(SANITIZED, "allocd run preloads the interposer before the sanitizer runtime")
class UnchangedScriptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocd_run_")
        # Cleanups run after tearDown: the daemon is gone by then.
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.socket = os.path.join(self.dir, "a.sock")
        self.daemon = sim_daemon.start(self.socket)
        self.assertIsNotNone(self.daemon, "allocd serve did not start")

    def tearDown(self):
        self.daemon.kill()
        self.daemon.wait()

    def allocctl(self, *args):
        out = subprocess.run([os.environ["ALLOCCTL_BINARY"], "--socket", self.socket,
                              "--json", *args], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    def script(self, text, name="script.py"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def environment(self, pythonpath=None, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ALLOCD_", "PYTORCH_")) or k == "ALLOCD_BINARY"}
        # The stand-in torch is importable, as PyTorch is in a job's environment.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath,
                                                          os.environ["FAKE_TORCH_PYTHON"]]))
        # The stand-in's history is the stream (test_tracker.py: the tracker).
        env["ALLOCD_EVENT_SOURCE"] = "history"
        env.update(extra)
        return env

    def start(self, command, job="unchanged", **popen):
        return subprocess.Popen(
            [os.environ["ALLOCD_BINARY"], "run", "--interposer", os.environ["FAKE_INTERPOSER"],
             "--socket", self.socket, "--job", job, "--", *command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)

    def run_allocd(self, command, **popen):
        process = self.start(command, **popen)
        out, err = process.communicate(timeout=60)
        return process.returncode, out, err

    def test_a_script_that_imports_torch_is_tuned_as_with_enable(self):
        process = self.start([sys.executable, self.script(TRAIN)], env=self.environment())
        try:
            line = process.stdout.readline()
            self.assertTrue(line, process.stderr.read() if process.poll() is not None else "")
            self.assertEqual(json.loads(line), {"connected": True, "mode": "managed",
                                                "managed_mode": "transparent",
                                                "event_source": "history"})
            # The daemon's session of the job, from the process allocd run became.
            sessions = self.allocctl("sessions")["sessions"]
            self.assertEqual([(s["job"], s["pid"]) for s in sessions],
                             [("unchanged", process.pid)])

            def window_events():
                jobs = self.allocctl("autotune", "status").get("jobs", [])
                return sum(int(j.get("window_events", 0)) for j in jobs
                           if j["job"] == "unchanged")

            # The allocation stream reaches the autotuner.
            self.assertTrue(wait_for(lambda: window_events() > 0))
            # A pushed config is applied with PyTorch's runtime API.
            self.allocctl("config", "set", "garbage_collection_threshold:0.6", "--job",
                          "unchanged")
            applied = json.loads(process.stdout.readline())
            self.assertEqual(len(applied["settings"]), 1, applied)
            self.assertIn("garbage_collection_threshold:0.6", applied["settings"][0])
            self.assertGreaterEqual(applied["empty_cache_calls"], 1)
            self.assertEqual(process.wait(timeout=30), 0, process.stderr.read())
        finally:
            process.kill()
            process.communicate()

    def test_importing_torch_starts_no_session(self):
        # A DataLoader worker, a CPU-only program: torch but no CUDA.
        code, out, err = self.run_allocd(
            [sys.executable, "-c", "import threading, torch; "
             "print(sorted(t.name for t in threading.enumerate()))"],
            env=self.environment())
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "['MainThread']")
        self.assertEqual(err, "")
        self.assertEqual(self.allocctl("sessions").get("sessions", []), [])

    def test_a_python_program_without_torch_runs_as_it_would(self):
        code, out, err = self.run_allocd(
            [sys.executable, "-c", "import json, sys; print(json.dumps("
             "{'allocd': 'allocd' in sys.modules, 'torch': 'torch' in sys.modules, "
             "'path': sys.path}))"],
            env=self.environment())
        self.assertEqual(code, 0, err)
        self.assertEqual(err, "")
        seen = json.loads(out)
        self.assertFalse(seen["allocd"])
        self.assertFalse(seen["torch"])
        # allocd's start leaves sys.path as it found it.
        self.assertFalse([p for p in seen["path"] if p.rstrip("/").endswith("allocd/_run")],
                         seen["path"])

    def test_a_command_that_is_not_python_runs_as_it_would(self):
        code, out, err = self.run_allocd(["sh", "-c", "echo ran; exit 3"],
                                         env=self.environment())
        self.assertEqual((code, out, err), (3, "ran\n", ""))

    def test_the_programs_own_sitecustomize_still_runs(self):
        own = os.path.join(self.dir, "own")
        os.mkdir(own)
        with open(os.path.join(own, "sitecustomize.py"), "w") as f:
            # It imports torch itself: allocd still sees it.
            f.write("import builtins, torch\nbuiltins.own_sitecustomize = __file__\n")
        script = self.script(WAIT_FOR_ALLOCD + """
import builtins, json, torch
torch.malloc(1 << 20)
print(json.dumps({"own": getattr(builtins, "own_sitecustomize", None),
                  "connected": allocd_stats()["connected"]}))
""")
        code, out, err = self.run_allocd([sys.executable, script],
                                         env=self.environment(pythonpath=own))
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out), {"own": os.path.join(own, "sitecustomize.py"),
                                           "connected": True})

    def test_allocd_autostart_0_leaves_the_script_alone(self):
        script = self.script(WAIT_FOR_ALLOCD + """
import sys, torch
torch.malloc(1 << 20)
print("allocd" in sys.modules)
""")
        code, out, err = self.run_allocd([sys.executable, script],
                                         env=self.environment(ALLOCD_AUTOSTART="0"))
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "False")


if __name__ == "__main__":
    unittest.main(verbosity=2)
