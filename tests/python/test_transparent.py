"""Transparent managed mode without a GPU: allocd.enable()'s choices and
`allocd run`'s environment. The interposer itself (PyTorch's allocator on
daemon memory) runs on the GPU machine: bench/gpu/transparent_compat.py.
Environment: ALLOCD_BINARY, ALLOCD_PYTHON_DIR.
"""

import os
import subprocess
import sys
import types
import unittest
import warnings

os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
import allocd  # noqa: E402
from allocd import _bindings  # noqa: E402


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
