"""allocd's allocation-stream tracker (allocd/_tracker.py), built for real.

The package compiles allocd/_trace_tracker.cpp with this machine's C++
compiler against a model of PyTorch's allocator API (fake_torch/include,
with a libc10_cuda.so that calls the attached trackers for the events a test
makes), loads it and reads the events; the GPU validation does the same
against PyTorch's own headers and allocator.
Environment: ALLOCD_PYTHON_DIR, FAKE_TORCH_LIB, FAKE_TORCH_INCLUDE.
"""

import atexit
import ctypes
import os
import shutil
import sys
import tempfile
import threading
import time
import types
import unittest
import warnings

os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
import allocd  # noqa: E402
from allocd import _allocator_state, _event_stream, _history, _tracker  # noqa: E402

LIB = os.environ["FAKE_TORCH_LIB"]
# Built trackers go to a cache of this test's own.
CACHE = tempfile.mkdtemp(prefix="allocd_tracker_")
os.environ["ALLOCD_CACHE_DIR"] = CACHE
atexit.register(shutil.rmtree, CACHE, True)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC = 0, 1, 2, 3


class FakeCuda:
    """torch.cuda's lazy initialisation as PyTorch 2.11 has it: calls queued
    with _lazy_call run at init(), after the allocator is made (the fake
    allocator's fake_torch_init), or at once when it was."""

    def __init__(self):
        self.initialized = False
        self.queued = []

    def is_initialized(self):
        return self.initialized

    def _lazy_call(self, fn):
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def init(self):
        if not self.initialized:
            c10.fake_torch_init()
            self.initialized = True
            for fn in self.queued:
                fn()


FAKE_CUDA = FakeCuda()


def fake_torch(include=os.environ["FAKE_TORCH_INCLUDE"], version="2.11.0+fake"):
    """A torch whose headers are the model and whose lib/ holds the fakes;
    its CUDA is the one FAKE_CUDA, whose allocator is process-wide."""
    torch = types.ModuleType("torch")
    torch.__version__ = version
    torch.__file__ = os.path.join(os.path.dirname(LIB), "__init__.py")
    torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
    extension = types.SimpleNamespace(include_paths=lambda device_type="cpu": [include])
    torch.utils = types.SimpleNamespace(cpp_extension=extension)
    torch.cuda = FAKE_CUDA
    return torch


# The fake allocator: the same library the built tracker links.
c10 = ctypes.CDLL(os.path.join(LIB, "libc10_cuda.so"))
c10.fake_torch_emit.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                ctypes.c_uint64]
c10.fake_torch_emit_allocations.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
c10.fake_torch_trackers.restype = ctypes.c_size_t
c10.fake_torch_add_segment.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                       ctypes.c_uint64, ctypes.c_bool, ctypes.c_bool]
c10.fake_torch_add_block.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_bool,
                                     ctypes.c_bool]
c10.fake_torch_snapshot_fails.argtypes = [ctypes.c_bool]
c10.fake_torch_snapshot_takes_us.argtypes = [ctypes.c_int]
c10.fake_torch_last_snapshot_window.argtypes = [ctypes.POINTER(ctypes.c_double)] * 2
c10.fake_torch_history.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_uint64] + \
    [ctypes.c_void_p] * 2
c10.fake_torch_last_snapshot_whole_without_traces.restype = ctypes.c_bool


def fake_history():
    """The fake allocator's history as its last recordHistory left it."""
    recording, frames = ctypes.c_bool(), ctypes.c_bool()
    max_entries, entries, arms = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_int()
    skipped = ctypes.create_string_buffer(256)
    c10.fake_torch_history(ctypes.byref(recording), ctypes.byref(frames),
                           ctypes.byref(max_entries), skipped, len(skipped),
                           ctypes.byref(entries), ctypes.byref(arms))
    return types.SimpleNamespace(recording=recording.value, frames=frames.value,
                                 max_entries=max_entries.value,
                                 skipped=skipped.value.decode().rstrip(",").split(","),
                                 entries=entries.value, arms=arms.value)


def fake_segments(segments):
    """Puts `segments` in the fake allocator's snapshot and returns them as
    torch.cuda.memory_snapshot() reports them (PyTorch 2.11's
    torch/csrc/cuda/Module.cpp: a block's address is its segment's plus the
    sizes before it, a stream an int64, a state by name). Each segment:
    (device, address, stream, is_large, is_expandable, blocks), each block
    (size, requested_size, allocated, active)."""
    c10.fake_torch_clear_segments()
    reported = []
    for device, base, stream, large, expandable, blocks in segments:
        c10.fake_torch_add_segment(device, base, sum(b[0] for b in blocks), stream, large,
                                   expandable)
        address, dicts = base, []
        for size, requested, allocated, active in blocks:
            c10.fake_torch_add_block(size, requested, allocated, active)
            dicts.append({"address": address, "size": size, "requested_size": requested,
                          "state": "active_allocated" if allocated else
                          "active_pending_free" if active else "inactive"})
            address += size
        reported.append({"device": device, "address": base,
                         "total_size": sum(b[0] for b in blocks),
                         "stream": ctypes.c_int64(stream).value,
                         "segment_type": "large" if large else "small",
                         "is_expandable": expandable, "blocks": dicts})
    return reported


def setUpModule():
    """Before any test initialises the fake CUDA: a reader started before
    CUDA's lazy initialisation neither initialises it (a job may fork
    before it touches CUDA) nor attaches to nothing (PyTorch would give the
    tracker to no device allocator, as the fake does): it attaches at the
    initialisation."""
    reader = _tracker.TrackerReader.for_torch(fake_torch(), 0)
    reader.start()
    assert not FAKE_CUDA.initialized
    assert c10.fake_torch_trackers() == 0
    FAKE_CUDA.init()
    assert c10.fake_torch_trackers() == 1
    c10.fake_torch_emit(ALLOC, 0, 0x40, 512, 0)
    assert list(reader.read()[2]) == [0x40], "the tracker attached at initialisation reads"
    reader.stop()


class TrackerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = CACHE
        cls.path = _tracker.build(fake_torch())
        cls.reader = _tracker.TrackerReader.for_torch(fake_torch(), 0)

    def setUp(self):
        self.reader.capacity = 1 << 20
        self.reader.start()

    def tearDown(self):
        self.reader.stop()

    def test_is_built_once_per_pytorch_and_reused(self):
        self.assertTrue(self.path.startswith(self.cache))
        built_at = os.stat(self.path).st_mtime_ns
        self.assertEqual(_tracker.build(fake_torch()), self.path)
        self.assertEqual(os.stat(self.path).st_mtime_ns, built_at)
        # Nothing half-written is left next to it.
        self.assertEqual([f for f in os.listdir(self.cache) if f.endswith(".so")],
                         [os.path.basename(self.path)])

    def test_reads_the_devices_allocs_and_frees_in_order(self):
        c10.fake_torch_emit(ALLOC, 0, 0x1000, 512, 7)
        c10.fake_torch_emit(SEGMENT_ALLOC, 0, 0x1000, 2 << 20, 7)  # not the stream's
        c10.fake_torch_emit(ALLOC, 1, 0x9000, 64, 7)  # another device's
        c10.fake_torch_emit(ALLOC, 0, 0x2000, 4096, 9)
        c10.fake_torch_emit(FREE_REQUESTED, 0, 0x1000, 512, 7)
        c10.fake_torch_emit(FREE_COMPLETED, 0, 0x1000, 512, 7)
        ops, sizes, ids, streams, dropped = self.reader.read()
        self.assertEqual(list(ops), [0, 0, 1, 2])
        self.assertEqual(list(sizes), [512, 4096, 512, 512])
        self.assertEqual(list(ids), [0x1000, 0x2000, 0x1000, 0x1000])
        self.assertEqual(list(streams), [7, 9, 7, 7])
        self.assertEqual(dropped, 0)
        # Each event once.
        self.assertEqual([len(c) for c in self.reader.read()[:4]], [0, 0, 0, 0])

    def test_taken_while_two_threads_allocate_and_one_marks_steps_each_event_comes_once(self):
        # The advisor takes on a thread of its own while the job's threads
        # allocate and its optimizer marks steps: the tracker's lock must
        # lose, repeat and reorder nothing.
        n, marks = 50_000, 200
        first = {"a": 0x10_0000_0000, "b": 0x20_0000_0000}
        threads = [threading.Thread(target=c10.fake_torch_emit_allocations, args=(0, base, n))
                   for base in first.values()]
        threads.append(threading.Thread(
            target=lambda: [self.reader.mark_step() for _ in range(marks)]))
        for thread in threads:
            thread.start()
        ops, ids = [], []
        pending = self.reader._lib.allocd_tracker_pending
        while any(thread.is_alive() for thread in threads) or pending():
            taken_ops, _, taken_ids, _, dropped = self.reader.read()
            self.assertEqual(dropped, 0)
            ops.extend(taken_ops)
            ids.extend(taken_ids)
        for thread in threads:
            thread.join()
        self.assertEqual(ops.count(_history.STEP), marks)
        for name, base in first.items():
            # Each thread's events in the order it made them.
            own = [(op, i) for op, i in zip(ops, ids)
                   if op != _history.STEP and i >> 36 == base >> 36]
            self.assertEqual(len(own), 3 * n, name)
            self.assertEqual(own[:3], [(0, base), (1, base), (2, base)], name)
            self.assertEqual(own, [(k % 3, base + 512 * (k // 3)) for k in range(3 * n)], name)

    def test_keeps_every_bit_of_a_devices_sizes_addresses_and_streams(self):
        # The tracker packs an event's op into its size's top byte: a size
        # up to 2^56 bytes (beyond any device), a high address and a stream
        # handle's full width come out as they went in.
        size, address, stream = (1 << 55) + 512, 0x7FFF_FFFF_F000, 0xFFFF_8000_1234_5678
        c10.fake_torch_emit(ALLOC, 0, address, size, stream)
        c10.fake_torch_emit(FREE_COMPLETED, 0, address, size, stream)
        ops, sizes, ids, streams, _ = self.reader.read()
        self.assertEqual(list(ops), [0, 2])
        self.assertEqual(list(sizes), [size, size])
        self.assertEqual(list(ids), [address, address])
        self.assertEqual(list(streams), [stream, stream])

    def test_a_full_buffer_reports_its_gap_before_the_events_after_it(self):
        self.reader.capacity = 2
        self.reader.start()
        for addr in (1, 2, 3, 4):
            c10.fake_torch_emit(ALLOC, 0, addr, 8, 0)
        ops, _, ids, _, dropped = self.reader.read()
        self.assertEqual((list(ids), dropped), ([1, 2], 0))
        c10.fake_torch_emit(ALLOC, 0, 5, 8, 0)
        _, _, ids, _, dropped = self.reader.read()
        self.assertEqual((list(ids), dropped), ([5], 2))

    def take(self, most):
        """The tracker's own take of at most `most` events: (ids, dropped)."""
        columns = [(ctypes.c_uint8 * most)()] + [(ctypes.c_uint64 * most)() for _ in range(3)]
        dropped = ctypes.c_uint64(0)
        got = self.reader._lib.allocd_tracker_take(*(ctypes.addressof(c) for c in columns),
                                                   most, ctypes.byref(dropped))
        return list(columns[2])[:got], dropped.value

    def test_a_take_of_part_leaves_the_rest_first_and_the_gap_after_it(self):
        # The allocating side keeps filling while the takes drain what they
        # swapped out: the rest of it comes before anything newer, and the
        # events dropped behind it are reported with its last event.
        self.reader.capacity = 2
        self.reader.start()
        for addr in (1, 2, 3, 4):
            c10.fake_torch_emit(ALLOC, 0, addr, 8, 0)
        self.assertEqual(self.take(1), ([1], 0))
        c10.fake_torch_emit(ALLOC, 0, 5, 8, 0)
        self.assertEqual(self.reader._lib.allocd_tracker_pending(), 2)
        self.assertEqual(self.take(4), ([2], 2))
        c10.fake_torch_emit(ALLOC, 0, 6, 8, 0)
        self.assertEqual(self.take(4), ([5, 6], 0))
        self.assertEqual(self.take(4), ([], 0))

    def test_a_reader_stopped_before_cuda_initialises_is_not_started_by_it(self):
        # Its attach queued for the initialisation must not re-arm the
        # tracker after the stop.
        self.reader.stop()
        torch = fake_torch()
        torch.cuda = FakeCuda()
        late = _tracker.TrackerReader.for_torch(torch, 0)
        late.start()
        late.stop()
        torch.cuda.init()
        c10.fake_torch_emit(ALLOC, 0, 0x50, 512, 0)
        self.assertEqual(list(late.read()[2]), [])
        self.reader.start()  # as setUp left it, for tearDown

    def test_stopped_it_keeps_nothing_and_one_tracker_serves_every_start(self):
        self.reader.stop()
        c10.fake_torch_emit(ALLOC, 0, 1, 8, 0)
        self.reader.start()
        c10.fake_torch_emit(ALLOC, 0, 2, 8, 0)
        self.assertEqual(list(self.reader.read()[2]), [2])
        self.assertEqual(c10.fake_torch_trackers(), 1)

    def test_reads_the_allocators_state_as_memory_snapshot_does(self):
        mib = 1 << 20
        reported = fake_segments([
            (0, 0x7f0000000000, 0xffff800000001234, True, False, [
                (4 * mib, 4 * mib - 100, True, True),  # held
                (2 * mib, 0, False, False),  # cached: not the program's
                (6 * mib, 5 * mib, False, True),  # freed, waiting on a stream
                (8 * mib, 9 * mib, True, True),  # requested past its size: clamped
            ]),
            (1, 0x7e0000000000, 0, True, False, [(2 * mib, 2 * mib, True, True)]),  # device 1
            (0, 0x7d0000000000, 0, False, False, [(512, 500, True, True), (1536, 0, False, False)]),
            (0, 0x7c0000000000, 7, True, True, [(20 * mib, 20 * mib, True, True)]),
        ])
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory_snapshot=lambda: reported))
        ours = self.reader.read_state()
        self.assertTrue(c10.fake_torch_last_snapshot_whole_without_traces())
        self.assertEqual([c.tolist() for c in ours],
                         [c.tolist() for c in _allocator_state.read_state(torch, 0)])
        seg_addresses, _, seg_streams, seg_flags, ids, _, sizes, requested, flags = ours
        self.assertEqual(seg_addresses.tolist(), [0x7f0000000000, 0x7d0000000000, 0x7c0000000000])
        self.assertEqual(seg_streams.tolist(), [0xffff800000001234, 0, 7])
        self.assertEqual(seg_flags.tolist(), [0, _allocator_state.SEGMENT_SMALL,
                                              _allocator_state.SEGMENT_EXPANDABLE])
        self.assertEqual(ids.tolist(), [0x7f0000000000, 0x7f0000000000 + 6 * mib,
                                        0x7f0000000000 + 12 * mib, 0x7d0000000000, 0x7c0000000000])
        self.assertEqual(sizes.tolist(), [4 * mib, 6 * mib, 8 * mib, 512, 20 * mib])
        self.assertEqual(requested.tolist(), [4 * mib - 100, 5 * mib, 8 * mib, 500, 20 * mib])
        self.assertEqual(flags.tolist(), [0, _allocator_state.BLOCK_FREE_REQUESTED, 0, 0, 0])
        self.assertEqual([c.typecode for c in ours], ["Q", "Q", "Q", "I", "Q", "Q", "Q", "Q", "I"])

    def test_a_state_larger_than_a_state_holds_is_none(self):
        fake_segments([(0, (i + 1) << 21, 0, True, False, [(2 << 20, 0, False, False)])
                       for i in range(_allocator_state.MAX_SEGMENTS + 1)])
        self.assertIsNone(self.reader.read_state())
        fake_segments([(0, 1 << 40, 0, True, False,
                        [(512, 512, True, True)] * (_allocator_state.MAX_BLOCKS + 1))])
        self.assertIsNone(self.reader.read_state())
        fake_segments([(0, 1 << 40, 0, True, False, [(512, 512, True, True)] * 3)])
        self.assertEqual(len(self.reader.read_state()[4]), 3)
        fake_segments([])
        self.assertEqual([len(c) for c in self.reader.read_state()], [0] * 9)

    def test_an_allocator_without_a_snapshot_raises(self):
        c10.fake_torch_snapshot_fails(True)
        try:
            with self.assertRaises(RuntimeError):
                self.reader.read_state()
        finally:
            c10.fake_torch_snapshot_fails(False)

    def test_a_pytorch_it_does_not_compile_against_says_why(self):
        broken = tempfile.mkdtemp(prefix="allocd_headers_")
        os.makedirs(os.path.join(broken, "c10", "cuda"))
        with open(os.path.join(broken, "c10", "cuda", "CUDACachingAllocator.h"), "w") as f:
            f.write("#pragma once\nnamespace c10::cuda::CUDACachingAllocator {}\n")
        try:
            with self.assertRaises(_tracker.TrackerUnavailable) as caught:
                _tracker.build(fake_torch(include=broken, version="2.99.0+other"))
            self.assertIn("2.99.0+other", str(caught.exception))
            self.assertIn("TraceEntry", str(caught.exception))
        finally:
            shutil.rmtree(broken)

    def test_no_compiler_says_so(self):
        saved = os.environ.get("PATH"), os.environ.pop("CXX", None)
        os.environ["PATH"] = tempfile.gettempdir()
        try:
            with self.assertRaises(_tracker.TrackerUnavailable) as caught:
                _tracker.build(fake_torch(version="2.98.0"))
            self.assertIn("no C++ compiler", str(caught.exception))
        finally:
            os.environ["PATH"] = saved[0]
            if saved[1] is not None:
                os.environ["CXX"] = saved[1]


def started_reader(torch, before_start=None):
    """The advisor's reader for device 0, built and started, as advise() has it."""
    return _event_stream.start_reader(_event_stream.new_reader(torch, 0), torch, 0, before_start)


class NativeHistoryTest(unittest.TestCase):
    """PyTorch's history read through the tracker's library (a stream's first
    reader): the events of a snapshot taken in C++, the ring re-armed in the
    same call, PyTorch's counters read without memory_stats()."""

    def setUp(self):
        self.tracker = _tracker.TrackerReader.for_torch(fake_torch(), 0)
        self.reader = self.tracker.history_reader()

    def tearDown(self):
        self.reader.stop()

    def test_a_trackers_history_reader_arms_the_history_in_cpp_without_stack_frames(self):
        self.assertIsInstance(self.reader._access, _tracker.NativeHistory)
        self.reader.start()
        history = fake_history()
        self.assertTrue(history.recording)
        self.assertFalse(history.frames)
        self.assertEqual(history.max_entries, _history.RING)
        self.assertEqual(history.skipped, _history._SKIP)
        self.reader.stop()
        self.assertFalse(fake_history().recording)

    def test_reads_the_devices_allocs_and_frees_each_once_with_the_step_marks_in_place(self):
        self.reader.start()
        c10.fake_torch_emit(ALLOC, 0, 0x1000, 512, 7)
        c10.fake_torch_emit(SEGMENT_ALLOC, 0, 0x1000, 2 << 20, 7)  # skipped by the ring
        c10.fake_torch_emit(ALLOC, 1, 0x9000, 64, 7)  # another device's
        self.reader.mark_step()
        c10.fake_torch_emit(FREE_REQUESTED, 0, 0x1000, 512, 7)
        c10.fake_torch_emit(FREE_COMPLETED, 0, 0x1000, 512, 9)
        ops, sizes, ids, streams, dropped = self.reader.read()
        self.assertEqual(list(ops), [ALLOC, _history.STEP, FREE_REQUESTED, FREE_COMPLETED])
        self.assertEqual(list(sizes), [512, 0, 512, 512])
        self.assertEqual(list(ids), [0x1000, 0, 0x1000, 0x1000])
        self.assertEqual(list(streams), [7, 0, 7, 9])
        self.assertEqual(dropped, 0)
        # The ring was re-armed cleared: the next round has only what came since.
        self.assertEqual(fake_history().entries, 0)
        c10.fake_torch_emit(ALLOC, 0, 0x2000, 1 << 40, 1 << 63)
        ops, sizes, ids, streams, dropped = self.reader.read()
        self.assertEqual((list(ops), list(sizes), list(ids), list(streams), dropped),
                         ([ALLOC], [1 << 40], [0x2000], [1 << 63], 0))

    def test_no_python_thread_runs_between_a_rounds_snapshot_and_its_rearm(self):
        # What the job's Python threads allocate there is cleared with the
        # ring: the take holds the GIL (released, the H200 lost 192 of
        # 319,608 events under training).
        self.reader.start()
        ran, done = [], threading.Event()

        def job_thread():
            while not done.is_set():
                ran.append(time.monotonic())

        thread = threading.Thread(target=job_thread)
        c10.fake_torch_snapshot_takes_us(100_000)
        try:
            thread.start()
            while not ran:
                time.sleep(0.001)
            self.reader.read()
        finally:
            c10.fake_torch_snapshot_takes_us(0)
            done.set()
            thread.join()
        began, ended = ctypes.c_double(), ctypes.c_double()
        c10.fake_torch_last_snapshot_window(ctypes.byref(began), ctypes.byref(ended))
        self.assertGreaterEqual(ended.value - began.value, 0.1)
        self.assertGreater(ran[-1], ended.value)  # it ran after, and before
        self.assertLess(ran[0], began.value)
        self.assertEqual([t for t in ran if began.value < t < ended.value], [])

    def test_a_round_that_overflowed_the_ring_reports_what_it_lost(self):
        reader = _history.HistoryReader(fake_torch(), 0,
                                        access=_tracker.NativeHistory(self.tracker._lib, 0, 4))
        reader.start()
        try:
            c10.fake_torch_emit_allocations(0, 0x1000, 3)  # 9 events, the ring holds 4
            ops, _, ids, _, dropped = reader.read()
            self.assertEqual(dropped, 5)
            self.assertEqual(list(ops), [FREE_COMPLETED, ALLOC, FREE_REQUESTED, FREE_COMPLETED])
            self.assertEqual(list(ids), [0x1200, 0x1400, 0x1400, 0x1400])
        finally:
            reader.stop()

    def test_a_history_the_job_arms_itself_is_left_to_it(self):
        self.reader.start()
        c10.fake_torch_emit(ALLOC, 0, 0x1000, 512, 7)
        c10.fake_torch_job_records_history()  # the job's own, with stack frames
        c10.fake_torch_emit(ALLOC, 0, 0x2000, 512, 7)
        arms = fake_history().arms
        ops, _, ids, _, _ = self.reader.read()
        self.assertEqual(list(ids), [0x1000, 0x2000])  # what was recorded is read
        self.assertTrue(self.reader.job_records)
        history = fake_history()
        self.assertEqual(history.arms, arms)  # not re-armed over the job's settings
        self.assertTrue(history.frames)
        self.assertEqual(history.entries, 2)
        self.assertEqual(len(self.reader.read()[0]), 0)
        self.reader.stop()
        self.assertTrue(fake_history().recording)  # the job's history goes on

    def test_a_job_arming_it_mid_round_waits_for_the_take_and_its_settings_last(self):
        self.reader.start()
        c10.fake_torch_emit(ALLOC, 0, 0x1000, 512, 7)
        self.reader.hand_to_job(c10.fake_torch_job_records_history)
        c10.fake_torch_emit(ALLOC, 0, 0x2000, 512, 7)
        self.assertEqual(list(self.reader.read()[2]), [0x1000, 0x2000])
        self.assertTrue(fake_history().frames)  # the job's settings
        self.assertEqual(fake_history().entries, 2)


class EventSourceTest(unittest.TestCase):
    """Which reader the advisor gets: $ALLOCD_EVENT_SOURCE."""

    def setUp(self):
        self.saved = os.environ.get("ALLOCD_EVENT_SOURCE")

    def tearDown(self):
        if self.saved is None:
            os.environ.pop("ALLOCD_EVENT_SOURCE", None)
        else:
            os.environ["ALLOCD_EVENT_SOURCE"] = self.saved

    @staticmethod
    def with_history(torch):
        """`torch` with the history API the history reader starts with; what
        it was asked to record is in torch.recording."""
        torch.recording = []
        memory = types.SimpleNamespace(
            _record_memory_history=lambda enabled="all", **kw: torch.recording.append(enabled))
        torch.cuda = types.SimpleNamespace(memory=memory, memory_stats=lambda device: {})
        return torch

    def torch_without_extensions(self):
        torch = types.ModuleType("torch_without_extensions")
        torch.__version__ = "2.11.0"
        torch._C = types.SimpleNamespace()
        return self.with_history(torch)

    def test_auto_falls_back_to_the_history_and_says_why(self):
        os.environ["ALLOCD_EVENT_SOURCE"] = "auto"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.last_torch = self.torch_without_extensions()
            reader = started_reader(self.last_torch)
        self.assertIsInstance(reader, _history.HistoryReader)
        self.assertEqual(self.last_torch.recording, ["all"])  # started
        self.assertEqual(len(caught), 1)
        self.assertIn("cpp_extension", str(caught[0].message))
        self.assertIn("record_events=False", str(caught[0].message))

    def test_auto_takes_the_tracker_where_it_builds(self):
        os.environ["ALLOCD_EVENT_SOURCE"] = "auto"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reader = started_reader(fake_torch())
        self.assertIsInstance(reader, _tracker.TrackerReader)
        self.assertEqual(caught, [])
        reader.stop()

    def test_auto_reads_the_history_first_where_the_tracker_builds(self):
        # The history can stop once the daemon has decided (the tracker cannot
        # be detached).
        os.environ["ALLOCD_EVENT_SOURCE"] = "auto"
        torch = fake_torch()
        built = _event_stream.new_reader(torch, 0)
        self.assertIsInstance(built, _tracker.TrackerReader)
        first = _event_stream.first_reader(built, torch, 0)
        self.assertIsInstance(first, _history.HistoryReader)
        self.assertIsInstance(first._access, _tracker.NativeHistory)  # no dict per event
        os.environ["ALLOCD_HISTORY_FIRST_S"] = "0"
        try:
            self.assertIs(_event_stream.first_reader(built, torch, 0), built)
            os.environ["ALLOCD_HISTORY_FIRST_S"] = "soon"
            with self.assertRaises(ValueError):
                _event_stream.first_reader(built, torch, 0)
        finally:
            del os.environ["ALLOCD_HISTORY_FIRST_S"]
        os.environ["ALLOCD_EVENT_SOURCE"] = "tracker"
        self.assertIs(_event_stream.first_reader(built, torch, 0), built)

    def test_tracker_only_refuses_to_fall_back(self):
        os.environ["ALLOCD_EVENT_SOURCE"] = "tracker"
        with self.assertRaises(allocd.AllocdUnavailable):
            started_reader(self.torch_without_extensions())

    def test_before_start_comes_once_the_reader_is_built_and_before_it_records(self):
        # The advisor reads the allocator's state there: after the (first
        # time, slow) build of the tracker, before any event is recorded.
        os.environ["ALLOCD_EVENT_SOURCE"] = "history"
        torch = self.with_history(fake_torch())
        recording_then = []
        reader = started_reader(torch, lambda: recording_then.append(list(torch.recording)))
        self.assertEqual(recording_then, [[]])
        self.assertEqual(torch.recording, ["all"])
        reader.stop()

    def test_a_reader_built_records_nothing_until_it_starts(self):
        # A learned run builds its reader at the start (the tracker's build
        # is the slow part) and starts it only once it outgrows what was
        # learned.
        os.environ["ALLOCD_EVENT_SOURCE"] = "auto"
        torch = fake_torch()
        reader = _event_stream.new_reader(torch, 0)
        self.assertIsInstance(reader, _tracker.TrackerReader)
        c10.fake_torch_emit(ALLOC, 0, 0x1000, 512, 7)
        started = _event_stream.start_reader(reader, torch, 0)
        self.assertIs(started, reader)
        c10.fake_torch_emit(ALLOC, 0, 0x2000, 512, 7)
        self.assertEqual(list(reader.read()[2]), [0x2000])  # nothing from before the start
        reader.stop()

    def test_history_and_a_typo(self):
        os.environ["ALLOCD_EVENT_SOURCE"] = "history"
        torch = self.with_history(fake_torch())
        self.assertIsInstance(started_reader(torch), _history.HistoryReader)
        self.assertEqual(torch.recording, ["all"])
        os.environ["ALLOCD_EVENT_SOURCE"] = "histroy"
        with self.assertRaises(ValueError):
            started_reader(fake_torch())


if __name__ == "__main__":
    unittest.main()
