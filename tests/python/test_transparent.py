"""Transparent managed mode without a GPU: allocd.enable()'s choices, the
learned config it starts on, and `allocd run`'s environment. The interposer
itself (PyTorch's allocator on daemon memory) runs on the GPU machine:
bench/gpu/transparent_compat.py.
Environment: ALLOCD_BINARY, ALLOCD_PYTHON_DIR.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
import warnings

import sim_daemon

# A sanitizer runtime ctest preloads: `allocd run` refuses it before its
# interposer, and a sanitized library in a child needs it.
SANITIZER_PRELOAD = os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
import allocd  # noqa: E402
from allocd import _bindings, _transparent  # noqa: E402


class InitialisedTorch(types.ModuleType):
    """A torch whose CUDA is already initialised."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(is_initialized=lambda: True)


class EnableTest(unittest.TestCase):
    def tearDown(self):
        sys.modules.pop("torch", None)

    def test_an_unknown_mode_is_refused(self):
        with self.assertRaisesRegex(ValueError, "transparent.*engine"):
            allocd.enable(mode="magic")

    def test_cuda_initialised_first_says_how_to_start(self):
        sys.modules["torch"] = InitialisedTorch()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertFalse(allocd.enable(socket="/nonexistent.sock"))
        self.assertIn("allocd run", str(caught[0].message))
        with self.assertRaisesRegex(allocd.AllocdUnavailable, "before importing torch"):
            allocd.enable(socket="/nonexistent.sock", required=True)
        self.assertEqual(allocd.stats(), {"connected": False})

    def test_no_interposer_in_this_process(self):
        self.assertIsNone(_bindings.loaded_interposer())


# Any library every process can load stands in for the interposer (which
# needs the CUDA toolkit to build and a GPU to act).
STAND_IN = "libz.so.1"


def c_getenv(name):
    """The C environment's `name` (what PyTorch and the interposer read)."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype, getenv.argtypes = ctypes.c_char_p, [ctypes.c_char_p]
    value = getenv(name.encode())
    return value.decode() if value is not None else None


def mapped(library):
    """Whether this process has a file named `library` mapped."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith("/" + library) for line in maps)


class LearnedStartTest(unittest.TestCase):
    """enable() starts PyTorch on the config the job learned, as `allocd run`
    does, asking the daemon from a process of its own (liballocd_client's
    functions stand in for the interposer's, which are the same code)."""

    LEARNED = "expandable_segments:True"

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        state_dir = os.path.join(self.dir, "state")
        os.makedirs(state_dir)
        with open(os.path.join(state_dir, "learned_configs.json"), "w") as f:
            json.dump({"format": 1, "jobs": [{
                "tenant": f"uid:{os.getuid()}", "job": "learned", "config": self.LEARNED,
                "from_config": "max_split_size_mb:64", "decision_id": 3,
                "learned_unix_micros": 0, "predicted_peak_current": 64 << 20,
                "predicted_peak_switched": 32 << 20, "predicted_peak_allocated": 16 << 20,
                "predicted_peak_requested": 16 << 20, "realized_peak": 40 << 20}]}, f)
        self.socket = os.path.join(self.dir, "allocd.sock")
        # No prior: a job without a learned config is handed nothing.
        daemon = sim_daemon.start(self.socket, "--autotune", "apply", "--state-dir", state_dir,
                                  "--autotune-prior", "off")
        self.assertIsNotNone(daemon)
        self.addCleanup(daemon.wait)
        self.addCleanup(daemon.kill)
        for name in _transparent._LEARNED_START_VARIABLES:
            self.addCleanup(os.environ.pop, name, None)
            os.environ.pop(name, None)
        if SANITIZER_PRELOAD:
            os.environ["LD_PRELOAD"] = SANITIZER_PRELOAD
            self.addCleanup(os.environ.pop, "LD_PRELOAD", None)
        self.library = _bindings.library_path()
        self.assertFalse(mapped(_bindings.CLIENT_LIBRARY))

    def start(self, job, socket=None, library=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _transparent.start_on_learned_config(library or self.library,
                                                 socket or self.socket, job)
        return [str(w.message) for w in caught]

    def test_the_learned_config_is_set_where_pytorch_reads_it(self):
        self.assertEqual(self.start("learned"), [])
        for name in ("PYTORCH_CUDA_ALLOC_CONF", "ALLOCD_LEARNED_ALLOC_CONF"):
            self.assertEqual(os.environ.get(name), self.LEARNED, name)
            self.assertEqual(c_getenv(name), self.LEARNED, name)
        self.assertEqual(os.environ.get("ALLOCD_START_CONFIG_SOURCE"), "learned")
        self.assertEqual(os.environ.get("ALLOCD_INITIAL_ALLOC_CONF"), "")

    def test_the_daemon_is_asked_from_another_process(self):
        # No gRPC in the job's process before PyTorch: the client library
        # that asks is never loaded here.
        self.start("learned")
        self.assertEqual(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), self.LEARNED)
        self.assertFalse(mapped(_bindings.CLIENT_LIBRARY))

    def test_a_job_that_learned_nothing_starts_on_its_own_config(self):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:256"
        self.assertEqual(self.start("never-ran"), [])
        self.assertEqual(os.environ["PYTORCH_CUDA_ALLOC_CONF"], "max_split_size_mb:256")
        self.assertNotIn("ALLOCD_START_CONFIG_SOURCE", os.environ)

    def test_no_daemon_changes_nothing_and_warns_nothing(self):
        self.assertEqual(self.start("learned", socket=os.path.join(self.dir, "none.sock")), [])
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)

    def test_an_embedded_python_says_why(self):
        executable, sys.executable = sys.executable, ""
        try:
            warned = self.start("learned")
        finally:
            sys.executable = executable
        self.assertEqual(len(warned), 1)
        self.assertIn("no executable to ask from", warned[0])
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)

    def test_a_question_that_fails_says_why(self):
        warned = self.start("learned", library=STAND_IN)
        self.assertEqual(len(warned), 1)
        self.assertIn("learned config could not be asked for", warned[0])
        self.assertIn("allocd_start_on_learned_config", warned[0])
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)


class RunTest(unittest.TestCase):
    def run_allocd(self, *args):
        env = {k: v for k, v in os.environ.items()
               if k not in ("ALLOCD_READ_AHEAD_MS", "ALLOCD_HANDOVER_MS", "ALLOCD_FEATURES")}
        return subprocess.run([os.environ["ALLOCD_BINARY"], "run", *args],
                              capture_output=True, text=True, timeout=30, env=env)

    def test_the_command_gets_the_interposer_and_the_session_settings(self):
        library = STAND_IN
        r = self.run_allocd("--interposer", library, "--socket", "/tmp/a.sock", "--job", "j1",
                            "--", "env")
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        self.assertEqual(env["LD_PRELOAD"].split(":")[0], library)
        self.assertEqual(env["ALLOCD_SOCKET"], "/tmp/a.sock")
        self.assertEqual(env["ALLOCD_JOB"], "j1")
        self.assertEqual(env["ALLOCD_MODE"], "transparent")
        self.assertNotIn("ALLOCD_READ_AHEAD_MS", env)
        self.assertNotIn("ALLOCD_HANDOVER_MS", env)

    def test_read_ahead_and_handover_reach_the_interposer(self):
        for option, variable in (("--read-ahead-ms", "ALLOCD_READ_AHEAD_MS"),
                                 ("--handover-ms", "ALLOCD_HANDOVER_MS")):
            with self.subTest(option):
                r = self.run_allocd("--interposer", STAND_IN, option, "200", "--", "env")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"{variable}=200", r.stdout.splitlines())
                refused = self.run_allocd("--interposer", STAND_IN, option, "-5", "--", "env")
                self.assertNotEqual(refused.returncode, 0)
                self.assertIn(option[2:], refused.stderr)

    def test_declared_features_reach_the_job_and_unknown_ones_are_refused(self):
        r = self.run_allocd("--interposer", STAND_IN, "--features", "cuda_ipc", "--", "env")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ALLOCD_FEATURES=cuda_ipc", r.stdout.splitlines())
        refused = self.run_allocd("--interposer", STAND_IN, "--features", "ipc", "--", "env")
        self.assertEqual(refused.returncode, 2)
        self.assertIn('ALLOCD_FEATURES names "ipc", which is not one of cuda_ipc',
                      refused.stderr)

    def test_options_after_the_command_are_the_commands(self):
        library = STAND_IN
        r = self.run_allocd("--interposer", library, "--", "echo", "--job", "x")
        self.assertEqual(r.stdout.strip(), "--job x")

    def test_a_command_that_cannot_run_says_so(self):
        library = STAND_IN
        r = self.run_allocd("--interposer", library, "--", "/nonexistent/program")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot run /nonexistent/program", r.stderr)

    def test_no_command_is_a_usage_error(self):
        self.assertNotEqual(self.run_allocd().returncode, 0)


if __name__ == "__main__":
    unittest.main()
