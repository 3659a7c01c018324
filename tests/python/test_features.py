"""What a process does with its CUDA memory that a config must not break
(allocd/_features.py): the hooks on a stand-in for torch, alone, and end to
end through advise() to a sim daemon, whose autotuner then shows the job's
features (the protocol's JobFeatures, at registration and later).
Environment: ALLOCD_BINARY, ALLOCCTL_BINARY, ALLOCD_PYTHON_DIR.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest

# Sets up the package's path and the history event source, as for advise().
from test_advise import FakeTorch
import sim_daemon
from sim_daemon import wait_for

import allocd  # noqa: E402
from allocd import _features  # noqa: E402


def add_features(torch):
    """Gives the stand-in the parts of torch the feature hooks wrap, each
    recording its calls in torch.calls."""
    torch.calls = []

    class UntypedStorage:
        def _share_cuda_(self, *args):
            torch.calls.append(("_share_cuda_", args))
            return ("handle",)

    class CUDAGraph:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            torch.calls.append(("capture_begin", capture_error_mode))
            if capture_error_mode == "fail":
                raise RuntimeError("capture refused")

        def capture_end(self):
            torch.calls.append(("capture_end",))

    class MemPool:
        def __init__(self, allocator=None):
            torch.calls.append(("MemPool", allocator))

    class ProcessGroupNCCL:
        def register_mem_pool(self, pool):
            torch.calls.append(("register_mem_pool", pool))

    torch.UntypedStorage = UntypedStorage
    torch.cuda.graphs = types.SimpleNamespace(CUDAGraph=CUDAGraph)
    torch.cuda.memory.MemPool = MemPool
    torch.distributed = types.SimpleNamespace(ProcessGroupNCCL=ProcessGroupNCCL)
    return torch


class FeatureHooksTest(unittest.TestCase):
    def setUp(self):
        self.torch = add_features(FakeTorch())
        self.reported = []
        self.round_lock = threading.Lock()
        self.hooks = _features.FeatureHooks(self.torch, self.reported.append,
                                            self.round_lock).attach()
        self.addCleanup(self.hooks.remove)

    def test_sharing_a_cuda_tensor_is_reported_once_and_still_shares(self):
        storage = self.torch.UntypedStorage()
        self.assertEqual(storage._share_cuda_(), ("handle",))
        storage._share_cuda_(1)
        self.assertEqual(self.reported, [_features.CUDA_IPC])
        self.assertEqual([c[0] for c in self.torch.calls], ["_share_cuda_", "_share_cuda_"])

    def test_a_capture_holds_the_round_lock_until_it_ends(self):
        graph = self.torch.cuda.graphs.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        self.assertEqual(self.reported, [_features.CUDA_GRAPHS])
        self.assertTrue(self.hooks.capturing)
        # A round (a push's settings change and empty_cache) waits.
        self.assertFalse(self.round_lock.acquire(timeout=0.05))
        graph.capture_end()
        self.assertFalse(self.hooks.capturing)
        self.assertTrue(self.round_lock.acquire(timeout=1))
        self.round_lock.release()
        self.assertEqual(self.torch.calls,
                         [("capture_begin", "thread_local"), ("capture_end",)])

    def test_a_capture_waits_for_a_round_under_way(self):
        self.round_lock.acquire()
        graph = self.torch.cuda.graphs.CUDAGraph()
        started = threading.Thread(target=graph.capture_begin)
        started.start()
        started.join(0.05)
        self.assertTrue(started.is_alive())
        self.assertEqual(self.torch.calls, [])
        self.round_lock.release()
        started.join(1)
        self.assertFalse(started.is_alive())
        self.assertEqual(self.torch.calls, [("capture_begin", "global")])
        graph.capture_end()

    def test_a_capture_that_fails_to_begin_lets_rounds_go_on(self):
        graph = self.torch.cuda.graphs.CUDAGraph()
        with self.assertRaises(RuntimeError):
            graph.capture_begin(capture_error_mode="fail")
        self.assertFalse(self.hooks.capturing)
        self.assertTrue(self.round_lock.acquire(timeout=1))
        self.round_lock.release()

    def test_mem_pools_and_their_nccl_registration_are_reported(self):
        pool = self.torch.cuda.memory.MemPool("ncclMemAlloc")
        self.torch.distributed.ProcessGroupNCCL().register_mem_pool(pool)
        self.assertEqual(self.reported, [_features.MEM_POOL, _features.NCCL_REGISTRATION])
        self.assertEqual(self.torch.calls[0], ("MemPool", "ncclMemAlloc"))

    def test_remove_gives_pytorch_its_functions_back(self):
        self.hooks.remove()
        self.torch.UntypedStorage()._share_cuda_()
        self.torch.cuda.graphs.CUDAGraph().capture_begin()
        self.assertEqual(self.reported, [])
        self.assertTrue(self.round_lock.acquire(timeout=1))
        self.round_lock.release()

    def test_a_torch_without_the_hooked_parts_is_left_alone(self):
        bare = FakeTorch()
        hooks = _features.FeatureHooks(bare, self.reported.append, threading.Lock()).attach()
        hooks.remove()
        self.assertEqual(self.reported, [])


class FeaturesEndToEndTest(unittest.TestCase):
    """advise() on the stand-in against `allocd serve --backend sim`."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocd_features_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.socket = os.path.join(self.dir, "a.sock")
        self.daemon = sim_daemon.start(self.socket)
        self.assertIsNotNone(self.daemon, "allocd serve did not start")
        self.torch = add_features(FakeTorch())
        sys.modules["torch"] = self.torch

    def tearDown(self):
        allocd.shutdown()
        self.daemon.kill()
        self.daemon.wait()
        sys.modules.pop("torch", None)
        os.environ.pop("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", None)

    def job_features(self, job):
        out = subprocess.run([os.environ["ALLOCCTL_BINARY"], "--socket", self.socket, "--json",
                              "autotune", "status"], check=True, capture_output=True, text=True)
        for entry in json.loads(out.stdout).get("jobs", []):
            if entry.get("job") == job:
                return entry.get("features", {})
        return None

    def test_a_shared_cuda_tensor_reaches_the_daemons_autotuner(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="producer", period=0.05))
        self.assertTrue(wait_for(lambda: self.job_features("producer") is not None))
        self.assertEqual(self.job_features("producer"), {})
        self.torch.UntypedStorage()._share_cuda_()
        self.assertTrue(wait_for(lambda: self.job_features("producer").get("cuda_ipc")),
                        self.job_features("producer"))
        self.torch.cuda.graphs.CUDAGraph().capture_begin()
        self.torch.cuda.graphs.CUDAGraph().capture_end()
        self.assertTrue(wait_for(lambda: self.job_features("producer").get("cuda_graphs")),
                        self.job_features("producer"))
        self.assertTrue(self.job_features("producer")["cuda_ipc"])  # features only add up

    def test_nccls_register_hook_is_said_at_registration(self):
        os.environ["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
        self.assertTrue(allocd.advise(socket=self.socket, job="ddp", period=0.05))
        self.assertTrue(wait_for(
            lambda: (self.job_features("ddp") or {}).get("nccl_registration")),
            self.job_features("ddp"))


if __name__ == "__main__":
    unittest.main()
