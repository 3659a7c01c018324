"""allocd.enable(mode="engine")'s routing of PyTorch's memory functions, with
stand-ins for torch and liballocd_torch.so.

FakeTorch's public memory functions reach torch._C the way PyTorch 2.11's do
(torch/cuda/memory.py, torch/accelerator/memory.py: each turns its device
argument into an index and calls one torch._C function when it runs), and
its torch._C functions refuse as CUDAPluggableAllocator does. FakeEngineLib
answers liballocd_torch's C functions from counters the test sets. So every
routed name is checked here without a GPU; bench/gpu/engine_compat.py checks
the same names under real PyTorch on the GPU machine.
Environment: ALLOCD_PYTHON_DIR.
"""

import collections
import ctypes
import json
import os
import pickle
import sys
import types
import unittest
import warnings

os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
import allocd  # noqa: E402
from allocd import _bindings, _engine  # noqa: E402

MANAGED = 0
OTHER = 1
REFUSED = "CUDAPluggableAllocator does not yet support"


def flat_stats(scale):
    """A memory_stats() dict with every key PyTorch's memory_summary reads."""
    stats = {}
    names = ["allocation", "segment", "active", "inactive_split", "allocated_bytes",
             "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"]
    for i, name in enumerate(names):
        for pool in ("all", "small_pool", "large_pool"):
            for j, metric in enumerate(("current", "peak", "allocated", "freed")):
                stats[f"{name}.{pool}.{metric}"] = scale * (100 * i + 10 * j + 1)
    for name in ("oversize_allocations", "oversize_segments"):
        for metric in ("current", "peak", "allocated", "freed"):
            stats[f"{name}.{metric}"] = scale
    stats.update(num_alloc_retries=2 * scale, num_ooms=3 * scale, num_sync_all_streams=0,
                 num_device_alloc=4 * scale, num_device_free=scale, max_split_size=-1)
    return stats


class FakeEngineLib:
    """liballocd_torch.so's C functions, over Python state."""

    def __init__(self):
        self.stats = flat_stats(1)
        self.history = []  # (enabled, max_entries, clear) per call
        self.peak_resets = 0
        self.accumulated_resets = 0
        self.torch_oom = 1

    @staticmethod
    def _out(data, buf, size):
        if len(data) < size:
            ctypes.memmove(buf, data + b"\0", len(data) + 1)
        return len(data)

    def allocd_torch_device(self):
        return MANAGED

    def allocd_torch_memory_stats_json(self, buf, size):
        return self._out(json.dumps(self.stats).encode(), buf, size)

    def allocd_torch_stats_json(self, buf, size):
        return self._out(json.dumps({**self.stats, "session_id": 7}).encode(), buf, size)

    def allocd_torch_snapshot_pickle(self, buf, size):
        snapshot = {"segments": [{"device": MANAGED, "address": 1 << 40,
                                  "total_size": 2 << 20, "blocks": []}],
                    "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 512}]]
                    if self.history and self.history[-1][0] else [[]]}
        # A large pickle exercises the caller's retry with a larger buffer.
        snapshot["padding"] = "x" * (1 << 17)
        return self._out(pickle.dumps(snapshot), buf, size)

    def allocd_torch_reset_peak_stats(self):
        self.peak_resets += 1
        for name in self.stats:
            if name.endswith(".peak"):
                self.stats[name] = self.stats[name.replace(".peak", ".current")]
        return 0

    def allocd_torch_reset_accumulated_stats(self):
        self.accumulated_resets += 1
        return 0

    def allocd_torch_record_history(self, enabled, max_entries, clear):
        self.history.append((enabled, max_entries, clear))
        return 0

    def allocd_torch_oom_is_torch_error(self):
        return self.torch_oom

    def allocd_torch_last_error(self):
        return b""


def make_fake_torch():
    """A torch module whose memory functions go through torch._C as PyTorch's do."""
    torch = types.ModuleType("torch")
    C = types.SimpleNamespace()
    calls = collections.Counter()
    torch.calls = calls

    def refuse(what):
        def refused(*args, **kwargs):
            calls[what] += 1
            raise RuntimeError(f"{REFUSED} {what}. If you need it, please file an issue")
        return refused

    C._cuda_memoryStats = refuse("getDeviceStats")
    C._cuda_resetPeakMemoryStats = refuse("resetPeakStats")
    C._cuda_resetAccumulatedMemoryStats = refuse("resetAccumulatedStats")
    C._accelerator_getDeviceStats = refuse("getDeviceStats")
    C._accelerator_resetPeakStats = refuse("resetPeakStats")
    C._accelerator_resetAccumulatedStats = refuse("resetAccumulatedStats")
    # As on PyTorch 2.11 under a pluggable allocator: torch.accelerator asks
    # the allocator registered for CUDA at load time, PyTorch's own, which
    # is never initialized; its empty_cache has nothing to empty.
    C._accelerator_isAllocatorInitialized = lambda: False
    C._accelerator_emptyCache = lambda: calls.update(["registered emptyCache"])
    C._cuda_emptyCache = lambda: calls.update(["current emptyCache"])
    C._cuda_memorySnapshot = refuse("snapshot")
    C._cuda_record_memory_history = refuse("recordHistory")
    C._cuda_record_memory_history_legacy = refuse("recordHistory")
    torch._C = C

    def index(device):
        if device is None:
            return MANAGED  # the current device
        if isinstance(device, str):
            return int(device.split(":")[1]) if ":" in device else MANAGED
        return int(device)

    def flatten(nested, prefix=""):
        out = []
        for key, value in nested.items():
            name = f"{prefix}.{key}" if prefix else key
            out.extend(flatten(value, name) if isinstance(value, dict) else [(name, value)])
        return out

    memory = types.ModuleType("torch.cuda.memory")

    def memory_stats_as_nested_dict(device=None):
        return torch._C._cuda_memoryStats(index(device))

    def memory_stats(device=None):
        return collections.OrderedDict(sorted(flatten(memory_stats_as_nested_dict(device))))

    def memory_summary(device=None, abbreviated=False):
        stats = memory_stats(device)
        rows = [f"{k}: {stats[k]}" for k in ("allocated_bytes.all.current",
                                             "reserved_bytes.all.peak", "num_ooms")]
        return "\n".join(rows)

    def _record_memory_history(enabled="all", context="all", stacks="all",
                               max_entries=sys.maxsize, device=None, clear_history=False):
        if isinstance(enabled, bool):
            return torch._C._cuda_record_memory_history_legacy(
                enabled, True, max_entries, False, False, clear_history, False, False, [])
        return torch._C._cuda_record_memory_history(
            enabled, context, stacks, max_entries, clear_history, False, False, [], False, True)

    def _snapshot(device=None):
        return torch._C._cuda_memorySnapshot(None)

    memory.memory_stats = memory_stats
    memory.memory_stats_as_nested_dict = memory_stats_as_nested_dict
    memory.memory_allocated = lambda device=None: memory_stats(device).get(
        "allocated_bytes.all.current", 0)
    memory.max_memory_allocated = lambda device=None: memory_stats(device).get(
        "allocated_bytes.all.peak", 0)
    memory.memory_reserved = lambda device=None: memory_stats(device).get(
        "reserved_bytes.all.current", 0)
    memory.max_memory_reserved = lambda device=None: memory_stats(device).get(
        "reserved_bytes.all.peak", 0)
    memory.reset_peak_memory_stats = lambda device=None: torch._C._cuda_resetPeakMemoryStats(
        index(device))
    memory.reset_accumulated_memory_stats = (
        lambda device=None: torch._C._cuda_resetAccumulatedMemoryStats(index(device)))
    memory.memory_summary = memory_summary
    memory._record_memory_history = _record_memory_history
    memory._snapshot = _snapshot
    def memory_snapshot(mempool_id=None, include_traces=True):  # 2.10+
        pool = (0, 0) if mempool_id is None else mempool_id
        return torch._C._cuda_memorySnapshot((pool[0], pool[1], include_traces))["segments"]

    memory.memory_snapshot = memory_snapshot

    cuda = types.ModuleType("torch.cuda")
    cuda.memory = memory
    cuda.current_device = lambda: MANAGED
    cuda.is_initialized = lambda: True
    for name in dir(memory):  # torch/cuda/__init__.py: from .memory import *
        if not name.startswith("_"):
            setattr(cuda, name, getattr(memory, name))
    torch.cuda = cuda

    accelerator = types.ModuleType("torch.accelerator")

    def acc_memory_stats(device_index=None, /):
        if not torch._C._accelerator_isAllocatorInitialized():
            return collections.OrderedDict()
        stats = torch._C._accelerator_getDeviceStats(index(device_index))
        return collections.OrderedDict(sorted(flatten(stats)))

    accelerator.memory_stats = acc_memory_stats

    def acc_empty_cache():
        if torch._C._accelerator_isAllocatorInitialized():
            torch._C._accelerator_emptyCache()

    accelerator.empty_cache = acc_empty_cache
    for name, key in (("memory_allocated", "allocated_bytes.all.current"),
                      ("max_memory_allocated", "allocated_bytes.all.peak"),
                      ("memory_reserved", "reserved_bytes.all.current"),
                      ("max_memory_reserved", "reserved_bytes.all.peak")):
        setattr(accelerator, name,
                lambda device_index=None, /, key=key: acc_memory_stats(device_index).get(key, 0))
    accelerator.reset_peak_memory_stats = (
        lambda device_index=None, /: torch._C._accelerator_resetPeakStats(index(device_index)))
    accelerator.reset_accumulated_memory_stats = (
        lambda device_index=None, /: torch._C._accelerator_resetAccumulatedStats(
            index(device_index)))
    torch.accelerator = accelerator
    return torch


# Every routed public name, and the memory_stats() key it returns (None: it
# returns the whole dict).
CUDA_READERS = {
    "memory_stats": None,
    "memory_allocated": "allocated_bytes.all.current",
    "max_memory_allocated": "allocated_bytes.all.peak",
    "memory_reserved": "reserved_bytes.all.current",
    "max_memory_reserved": "reserved_bytes.all.peak",
}
ACCELERATOR_READERS = dict(CUDA_READERS)


class EngineRoutingTest(unittest.TestCase):
    def setUp(self):
        self.torch = make_fake_torch()
        self.lib = FakeEngineLib()
        self.engine = _engine.Engine(self.lib, self.torch)
        self.engine.route()

    def tearDown(self):
        self.engine.unroute()

    def namespaces(self):
        return {"torch.cuda": self.torch.cuda, "torch.cuda.memory": self.torch.cuda.memory}

    def test_every_stats_name_returns_the_engines_numbers(self):
        for label, module in {**self.namespaces(), "torch.accelerator": self.torch.accelerator}.items():
            for name, key in CUDA_READERS.items():
                for args in ((), (MANAGED,), (f"cuda:{MANAGED}",)):
                    if label == "torch.accelerator" and args and isinstance(args[0], str):
                        continue
                    with self.subTest(name=f"{label}.{name}", args=args):
                        got = getattr(module, name)(*args)
                        want = dict(self.lib.stats) if key is None else self.lib.stats[key]
                        self.assertEqual(dict(got) if key is None else got, want)
        for label, module in self.namespaces().items():
            with self.subTest(name=f"{label}.memory_stats_as_nested_dict"):
                nested = module.memory_stats_as_nested_dict()
                self.assertEqual(nested["allocated_bytes"]["all"]["peak"],
                                 self.lib.stats["allocated_bytes.all.peak"])
                self.assertEqual(nested["num_ooms"], self.lib.stats["num_ooms"])
                self.assertEqual(nested["oversize_segments"]["current"],
                                 self.lib.stats["oversize_segments.current"])

    def test_numbers_are_read_at_each_call(self):
        self.lib.stats = flat_stats(5)
        self.assertEqual(self.torch.cuda.memory_allocated(),
                         flat_stats(5)["allocated_bytes.all.current"])
        self.assertEqual(self.torch.accelerator.max_memory_reserved(),
                         flat_stats(5)["reserved_bytes.all.peak"])

    def test_memory_summary_formats_the_engines_stats(self):
        for label, module in self.namespaces().items():
            with self.subTest(name=label):
                summary = module.memory_summary()
                self.assertIn(f"num_ooms: {self.lib.stats['num_ooms']}", summary)

    def test_reset_functions_call_through(self):
        before = self.lib.stats["allocated_bytes.all.peak"]
        self.assertNotEqual(before, self.lib.stats["allocated_bytes.all.current"])
        expected_peak, expected_acc = 0, 0
        for label, module in {**self.namespaces(), "torch.accelerator": self.torch.accelerator}.items():
            with self.subTest(name=label):
                module.reset_peak_memory_stats()
                expected_peak += 1
                module.reset_accumulated_memory_stats(MANAGED)
                expected_acc += 1
                self.assertEqual(self.lib.peak_resets, expected_peak)
                self.assertEqual(self.lib.accumulated_resets, expected_acc)
        self.assertEqual(self.torch.cuda.max_memory_allocated(),
                         self.lib.stats["allocated_bytes.all.current"])

    def test_other_devices_keep_pytorchs_functions(self):
        for call in (lambda: self.torch.cuda.memory_stats(OTHER),
                     lambda: self.torch.cuda.reset_peak_memory_stats(OTHER),
                     lambda: self.torch.accelerator.memory_allocated(OTHER),
                     lambda: self.torch.accelerator.reset_accumulated_memory_stats(OTHER)):
            with self.assertRaisesRegex(RuntimeError, REFUSED):
                call()
        self.assertEqual(self.lib.peak_resets + self.lib.accumulated_resets, 0)

    def test_snapshot_and_history_come_from_the_engine(self):
        memory = self.torch.cuda.memory
        snapshot = memory._snapshot()
        self.assertEqual(snapshot["segments"][0]["total_size"], 2 << 20)
        self.assertEqual(snapshot["device_traces"], [[]])
        self.assertEqual(memory.memory_snapshot(), snapshot["segments"])
        self.assertEqual(memory.memory_snapshot(include_traces=False), snapshot["segments"])
        with self.assertRaisesRegex(RuntimeError, REFUSED):  # a MemPool's: PyTorch's
            memory.memory_snapshot(mempool_id=(1, 2))

        memory._record_memory_history(max_entries=1000)
        self.assertEqual(self.lib.history[-1], (1, 1000, 0))
        self.assertEqual(memory._snapshot()["device_traces"][0][0]["action"], "alloc")
        memory._record_memory_history(enabled="state")
        self.assertEqual(self.lib.history[-1][0], 0)
        memory._record_memory_history(enabled=None)
        self.assertEqual(self.lib.history[-1][0], 0)
        memory._record_memory_history("all", clear_history=True)
        self.assertEqual(self.lib.history[-1], (1, sys.maxsize, 1))
        memory._record_memory_history(True, max_entries=50)  # the legacy form
        self.assertEqual(self.lib.history[-1], (1, 50, 0))

    def test_a_snapshot_without_traces_has_none(self):
        self.torch.cuda.memory._record_memory_history(max_entries=1000)
        self.assertEqual(self.torch._C._cuda_memorySnapshot((0, 0, True))["device_traces"][0][0]
                         ["action"], "alloc")
        self.assertEqual(self.torch._C._cuda_memorySnapshot((0, 0, False))["device_traces"],
                         [[]])

    def test_accelerator_empty_cache_empties_the_engine(self):
        self.torch.accelerator.empty_cache()
        self.assertEqual(self.torch.calls["current emptyCache"], 1)
        self.assertEqual(self.torch.calls["registered emptyCache"], 0)
        self.engine.unroute()
        self.torch.accelerator.empty_cache()  # PyTorch's own: nothing to empty
        self.assertEqual(self.torch.calls["current emptyCache"], 1)

    def test_functions_bound_before_routing_are_routed_too(self):
        self.engine.unroute()
        memory_allocated = self.torch.cuda.memory_allocated
        self.engine.route()
        self.assertEqual(memory_allocated(), self.lib.stats["allocated_bytes.all.current"])

    def test_unroute_restores_pytorchs_functions(self):
        routed = {name: getattr(self.torch._C, name) for name in self.engine._originals}
        self.engine.unroute()
        for name, function in routed.items():
            self.assertIsNot(getattr(self.torch._C, name), function)
        with self.assertRaisesRegex(RuntimeError, REFUSED):
            self.torch.cuda.memory_stats()
        with self.assertRaisesRegex(RuntimeError, REFUSED):
            self.torch.accelerator.reset_peak_memory_stats()
        self.assertEqual(self.torch.calls["getDeviceStats"], 1)

    def test_functions_this_pytorch_lacks_are_left_alone(self):
        self.engine.unroute()
        del self.torch._C._accelerator_getDeviceStats
        self.engine.route()
        self.assertFalse(hasattr(self.torch._C, "_accelerator_getDeviceStats"))
        self.assertEqual(self.torch.cuda.memory_allocated(),
                         self.lib.stats["allocated_bytes.all.current"])


@unittest.skipUnless(os.path.exists(os.path.join(os.environ["ALLOCD_PYTHON_DIR"], "allocd",
                                                 _engine._TORCH_LIBRARY)),
                     "liballocd_torch.so is built only with the CUDA toolkit")
class LibraryTest(unittest.TestCase):
    """The real liballocd_torch.so, before allocd_torch_configure (no GPU here)."""

    def setUp(self):
        self.lib = _bindings.load(_bindings.library_path(_engine._TORCH_LIBRARY),
                                  _engine._SIGNATURES)

    def test_every_function_the_engine_calls_is_exported(self):
        for name in _engine._SIGNATURES:
            self.assertTrue(hasattr(self.lib, name), name)
        for _, symbol in _engine._HOOKS:
            self.assertTrue(hasattr(self.lib, symbol), symbol)

    def test_calls_before_configure_fail_with_a_reason(self):
        self.assertEqual(self.lib.allocd_torch_device(), -1)
        buffer = ctypes.create_string_buffer(64)
        for name in ("allocd_torch_memory_stats_json", "allocd_torch_snapshot_pickle",
                     "allocd_torch_stats_json"):
            self.assertEqual(getattr(self.lib, name)(buffer, 64), -1, name)
        self.assertEqual(self.lib.allocd_torch_reset_peak_stats(), -1)
        self.assertEqual(self.lib.allocd_torch_record_history(1, 10, 0), -1)
        self.assertIn(b"not enabled", self.lib.allocd_torch_last_error())

    def test_without_pytorch_an_oom_would_be_a_runtime_error(self):
        self.assertEqual(self.lib.allocd_torch_oom_is_torch_error(), 0)


class EnableTest(unittest.TestCase):
    """enable()'s mode handling and the engine's lifetime in the package."""

    def setUp(self):
        self.torch = make_fake_torch()
        sys.modules["torch"] = self.torch
        self.lib = FakeEngineLib()
        self.saved = dict(allocd._MODES)

        def fake_enable(torch, socket, job, config, device, autotune=""):
            engine = _engine.Engine(self.lib, torch)
            engine.route()
            return engine

        # The engine mode's own checks around _engine.enable, on the fake.
        self.real_enable = _engine.enable
        _engine.enable = fake_enable

    def tearDown(self):
        allocd.shutdown()
        allocd._state.managed = None
        _engine.enable = self.real_enable
        allocd._MODES.clear()
        allocd._MODES.update(self.saved)
        sys.modules.pop("torch", None)

    def test_engine_mode_routes_and_shutdown_restores(self):
        self.assertTrue(allocd.enable(mode="engine"))
        self.assertEqual(self.torch.cuda.memory_reserved(),
                         self.lib.stats["reserved_bytes.all.current"])
        self.assertEqual(allocd.stats()["managed_mode"], "engine")
        self.assertEqual(allocd.stats()["session_id"], 7)
        self.assertTrue(allocd.enable(mode="engine"))  # a no-op
        allocd.shutdown()
        with self.assertRaisesRegex(RuntimeError, REFUSED):
            self.torch.cuda.memory_reserved()

    def test_allocd_mode_in_the_environment_picks_the_engine(self):
        os.environ["ALLOCD_MODE"] = "engine"
        try:
            self.assertTrue(allocd.enable())
        finally:
            del os.environ["ALLOCD_MODE"]
        self.assertEqual(allocd.stats()["managed_mode"], "engine")

    def test_an_unknown_mode_is_refused_before_anything_changes(self):
        with self.assertRaisesRegex(ValueError, "unknown mode 'fast'.*engine"):
            allocd.enable(mode="fast")
        self.assertIsNone(allocd._state.managed)

    def test_oom_without_pytorchs_error_type_warns(self):
        self.lib.torch_oom = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertTrue(allocd.enable(mode="engine"))
        self.assertIn("torch.OutOfMemoryError", str(caught[0].message))

    def test_oom_as_pytorchs_error_type_is_silent(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertTrue(allocd.enable(mode="engine"))
        self.assertEqual(caught, [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
