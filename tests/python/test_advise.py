"""allocd.advise() against a real daemon, with a stand-in for torch.

The stand-in records what the advisor asks of PyTorch (memory_stats,
_set_allocator_settings, empty_cache, the OOM observer), so every path of
the hook runs here without a GPU; the GPU validation runs the same hook
under real PyTorch.
Environment: ALLOCD_BINARY, ALLOCCTL_BINARY, ALLOCD_PYTHON_DIR.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import types
import unittest
import warnings

# In sanitized builds ctest preloads the sanitizer runtime for the library
# this interpreter loads; the daemon's binaries link their own.
os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
import allocd  # noqa: E402


class FakeTorch(types.ModuleType):
    """The parts of torch that allocd.advise uses."""

    def __init__(self):
        super().__init__("torch")
        self.__version__ = "2.11.0+fake"
        self.settings = []
        self.empty_cache_calls = 0
        self.reject = None
        self.oom_observers = []
        fake = self

        class Memory:
            @staticmethod
            def _set_allocator_settings(update):
                if fake.reject and fake.reject in update:
                    raise RuntimeError(f"refused: {update}")
                fake.settings.append(update)

        class Cuda:
            memory = Memory

            @staticmethod
            def memory_stats(device):
                return {"reserved_bytes.all.current": 4 << 20,
                        "allocated_bytes.all.current": 1 << 20,
                        "num_alloc_retries": 0}

            @staticmethod
            def empty_cache():
                fake.empty_cache_calls += 1

            @staticmethod
            def current_device():
                return 0

        class C:
            @staticmethod
            def _cuda_attach_out_of_memory_observer(observer):
                fake.oom_observers.append(observer)

        self.cuda = Cuda
        self._C = C


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


class AdviseTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocd_py_")
        self.socket = os.path.join(self.dir, "a.sock")
        self.daemon = subprocess.Popen(
            [os.environ["ALLOCD_BINARY"], "serve", "--socket", self.socket,
             "--metrics-addr", "", "--capacity", "1GiB"], stderr=subprocess.DEVNULL)
        self.assertTrue(wait_for(lambda: os.path.exists(self.socket)))
        self.torch = FakeTorch()
        sys.modules["torch"] = self.torch

    def tearDown(self):
        allocd.shutdown()
        self.daemon.kill()
        self.daemon.wait()
        sys.modules.pop("torch", None)

    def allocctl(self, *args):
        out = subprocess.run([os.environ["ALLOCCTL_BINARY"], "--socket", self.socket,
                              "--json", *args], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    def history(self):
        return self.allocctl("config", "history").get("entries", [])

    def test_pushed_configs_are_applied_with_pytorchs_runtime_api_and_acked(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="llama", period=0.05))
        self.assertTrue(wait_for(lambda: self.allocctl("sessions").get("sessions")))
        session = self.allocctl("sessions")["sessions"][0]
        self.assertEqual(session["job"], "llama")
        self.assertEqual(session["pid"], os.getpid())

        self.allocctl("config", "set", "garbage_collection_threshold:0.6", "--job", "llama")
        self.assertTrue(wait_for(lambda: self.torch.settings))
        # The update names every persistent key, so the process ends up with
        # exactly the pushed config whatever it had before.
        self.assertIn("garbage_collection_threshold:0.6", self.torch.settings[0])
        self.assertIn("expandable_segments:False", self.torch.settings[0])
        self.assertTrue(wait_for(lambda: any(e["event"] == "ack" for e in self.history())))
        # Telemetry arrives with PyTorch's names.
        self.assertTrue(wait_for(lambda: self.allocctl("sessions")["sessions"][0]
                                 .get("stats", {}).get("reserved_bytes.all.current")
                                 == str(4 << 20)))
        self.assertEqual(allocd.stats()["configs_applied"], 1)

    def test_a_config_pytorch_refuses_is_nacked_with_its_error(self):
        self.torch.reject = "max_split_size_mb"
        allocd.advise(socket=self.socket, job="j", period=0.05)
        self.allocctl("config", "set", "max_split_size_mb:256", "--job", "j")
        self.assertTrue(wait_for(lambda: any(e["event"] == "nack" for e in self.history())))
        nack = next(e for e in self.history() if e["event"] == "nack")
        self.assertIn("refused", nack["detail"])
        self.assertEqual(allocd.stats()["configs_rejected"], 1)

    def test_an_oom_after_a_push_rolls_back(self):
        allocd.advise(socket=self.socket, job="r", period=0.05)
        self.allocctl("config", "set", "max_split_size_mb:64", "--job", "r")
        self.assertTrue(wait_for(lambda: len(self.torch.settings) == 1))
        self.assertTrue(wait_for(lambda: any(e["event"] == "ack" for e in self.history())))
        self.assertEqual(len(self.torch.oom_observers), 1)
        self.torch.oom_observers[0](0, 2 << 20, 1 << 30, 0)
        # The rollback (to the job's initial, default config) is applied too.
        self.assertTrue(wait_for(lambda: len(self.torch.settings) == 2))
        self.assertNotIn("max_split_size_mb:64", self.torch.settings[1])
        self.assertTrue(any(e["event"] == "rollback" for e in self.history()))

    def test_no_daemon_warns_and_goes_on_unless_required(self):
        missing = os.path.join(self.dir, "missing.sock")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertFalse(allocd.advise(socket=missing))
        self.assertIn("not connected", str(caught[0].message))
        self.assertIn(missing, str(caught[0].message))
        with self.assertRaises(allocd.AllocdUnavailable):
            allocd.advise(socket=missing, required=True)
        self.assertEqual(allocd.stats(), {"connected": False})


if __name__ == "__main__":
    unittest.main(verbosity=2)
