"""allocd.advise() against a real daemon, with a stand-in for torch.

The stand-in records what the advisor asks of PyTorch (memory_stats,
_set_allocator_settings, empty_cache, the OOM observer), so every path of
the hook runs here without a GPU; the GPU validation runs the same hook
under real PyTorch.
Environment: ALLOCD_BINARY, ALLOCCTL_BINARY, ALLOCD_PYTHON_DIR.
"""

import array
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
import warnings

import sim_daemon
from sim_daemon import wait_for

# How long a test waits for the daemon's autotuner to decide: a replay of the
# window, which on a loaded CI machine (the suite runs tests side by side)
# can take many times what it takes alone. Waited for only as long as it takes.
DECISION_WAIT_S = 90

# In sanitized builds ctest preloads the sanitizer runtime for the library
# this interpreter loads; the daemon's binaries link their own.
os.environ.pop("LD_PRELOAD", None)
sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
# The stand-in's history is the stream here (test_tracker.py: the tracker).
os.environ["ALLOCD_EVENT_SOURCE"] = "history"
import allocd  # noqa: E402
from allocd import _advisor, _event_stream, _history, _stream_control  # noqa: E402


class FakeHistory:
    """PyTorch's allocator history as _record_memory_history/_snapshot expose it.

    A ring of at most max_entries trace entries (the oldest overwritten),
    counters of the alloc/free_requested/free_completed events that ever
    happened (as memory_stats counts them), and `racing`: events another
    thread makes between a snapshot and the clear that follows it.
    """

    def __init__(self, knows_skip_actions=True):
        self.knows_skip_actions = knows_skip_actions
        self.ring = []
        self.max_entries = None
        self.enabled = False
        self.skipped = []
        self.counts = {"allocation.all.allocated": 0, "allocation.all.freed": 0,
                       "active.all.freed": 0}
        self.racing = []
        self.calls = []
        self.context = None
        self.next_addr = 1 << 20

    def event(self, action, addr, size, stream=7):
        counter = {"alloc": "allocation.all.allocated",
                   "free_requested": "allocation.all.freed",
                   "free_completed": "active.all.freed"}.get(action)
        if counter:
            self.counts[counter] += 1
        if not self.enabled or action in self.skipped:
            return
        # Stack frames with each event unless recorded with context=None.
        frames = [{"filename": "train.py", "line": 7}] if self.context else []
        self.ring.append({"action": action, "addr": addr, "size": size, "stream": stream,
                          "frames": frames})
        if len(self.ring) > self.max_entries:
            del self.ring[0]

    def step(self, sizes):
        """One training step: every size allocated, then freed in order."""
        addrs = []
        for size in sizes:
            addrs.append(self.next_addr)
            self.event("alloc", self.next_addr, size)
            self.next_addr += size
        for addr, size in zip(addrs, sizes):
            self.event("free_requested", addr, size)
            self.event("free_completed", addr, size)

    def record(self, enabled="all", context="all", stacks="all", max_entries=None,
               clear_history=False, skip_actions=None, **kwargs):
        if skip_actions is not None and not self.knows_skip_actions:
            raise TypeError("unexpected keyword argument 'skip_actions'")
        self.calls.append(dict(enabled=enabled, context=context, stacks=stacks,
                               max_entries=max_entries, clear_history=clear_history,
                               skip_actions=skip_actions))
        for action, addr, size in self.racing:
            self.event(action, addr, size)
        self.racing = []
        self.enabled = enabled is not None
        self.context = context
        self.max_entries = sys.maxsize if max_entries is None else max_entries
        self.skipped = list(skip_actions or [])
        if clear_history or enabled is None:
            self.ring = []

    def snapshot(self):
        return {"segments": [], "device_traces": [list(self.ring)]}


class FakeTorch(types.ModuleType):
    """The parts of torch that allocd.advise uses."""

    def __init__(self, history=None):
        super().__init__("torch")
        self.history = history or FakeHistory()
        self.__version__ = "2.11.0+fake"
        self.settings = []
        self.settings_threads = []  # the thread that made each of settings
        self.empty_cache_calls = 0
        self.memory_stats_calls = 0
        self.reserved = 4 << 20  # what memory_stats reports reserved
        self.reject = None
        self.oom_observers = []
        # torch.optim.optimizer's global step hooks; step() calls them.
        self.step_hooks = []
        # What str(torch.cuda.get_device_properties(d).uuid) gives; None:
        # a torch without it.
        self.device_uuid = None
        fake = self

        class Memory:
            @staticmethod
            def _set_allocator_settings(update):
                if fake.reject and fake.reject in update:
                    raise RuntimeError(f"refused: {update}")
                fake.settings.append(update)
                fake.settings_threads.append(threading.current_thread())

            @staticmethod
            def _record_memory_history(enabled="all", **kwargs):
                fake.history.record(enabled, **kwargs)

            @staticmethod
            def _snapshot():
                return fake.history.snapshot()

        class Cuda:
            memory = Memory

            @staticmethod
            def memory_stats(device):
                fake.memory_stats_calls += 1
                return {"reserved_bytes.all.current": fake.reserved,
                        "allocated_bytes.all.current": 1 << 20,
                        "num_alloc_retries": 0, **fake.history.counts}

            @staticmethod
            def empty_cache():
                fake.empty_cache_calls += 1

            @staticmethod
            def current_device():
                return 0

            @staticmethod
            def get_device_properties(device):
                if fake.device_uuid is None:
                    raise AttributeError("uuid")
                return types.SimpleNamespace(uuid=fake.device_uuid)

        class C:
            @staticmethod
            def _cuda_attach_out_of_memory_observer(observer):
                fake.oom_observers.append(observer)

            @staticmethod
            def _cuda_isHistoryEnabled():
                return fake.history.enabled

        # What torch.cuda.memory_snapshot() reports: set by a test.
        self.segments = []
        Cuda.memory_snapshot = staticmethod(lambda: fake.segments)
        self.cuda = Cuda
        self._C = C

        class Handle:
            def __init__(self, hook):
                self.hook = hook

            def remove(self):
                fake.step_hooks.remove(self.hook)

        class Optimizer:
            @staticmethod
            def register_optimizer_step_post_hook(hook):
                fake.step_hooks.append(hook)
                return Handle(hook)

        # As in PyTorch: the module is reached by its import path, not as an
        # attribute of torch.optim, which does not keep the name.
        self.optim = types.SimpleNamespace()
        sys.modules["torch.optim.optimizer"] = Optimizer

    def step(self, optimizer):
        """`optimizer` stepped: PyTorch calls the global post hooks."""
        for hook in list(self.step_hooks):
            hook(optimizer, (), {})


class HistoryReaderTest(unittest.TestCase):
    """allocd's incremental reader of PyTorch's allocator history, alone."""

    def reader(self, history, ring=1 << 17):
        torch = FakeTorch(history)
        reader = _history.HistoryReader(torch, 0, ring=ring)
        reader.start()
        return reader

    def test_records_without_stacks_and_reads_each_event_once(self):
        history = FakeHistory()
        reader = self.reader(history)
        first = history.calls[0]
        self.assertEqual((first["enabled"], first["context"]), ("all", None))
        self.assertTrue(first["clear_history"])
        self.assertIn("segment_alloc", first["skip_actions"])
        history.step([512, 4096])
        ops, sizes, ids, streams, dropped = reader.read()
        self.assertEqual(list(ops), [0, 0, 1, 2, 1, 2])
        self.assertEqual(list(sizes), [512, 4096, 512, 512, 4096, 4096])
        self.assertEqual(ids[0], ids[2])
        self.assertEqual(set(streams), {7})
        self.assertEqual(dropped, 0)
        # The ring was cleared when it was read: the next round holds only
        # what happened since.
        self.assertEqual(history.ring, [])
        history.step([1 << 20])
        ops, sizes, *_ = reader.read()
        self.assertEqual(list(sizes), [1 << 20] * 3)

    def test_events_lost_between_snapshot_and_clear_are_dropped_before_the_next(self):
        history = FakeHistory()
        reader = self.reader(history)
        history.step([256])
        # Another thread allocates and frees while the reader is between
        # its snapshot and the clear: PyTorch counts them, the ring loses them.
        history.racing = [("alloc", 99, 64), ("free_requested", 99, 64),
                          ("free_completed", 99, 64)]
        ops, *_, dropped = reader.read()
        self.assertEqual((len(ops), dropped), (3, 0))
        history.step([128])
        ops, *_, dropped = reader.read()
        self.assertEqual((len(ops), dropped), (3, 3))
        # Counted once only.
        history.step([128])
        self.assertEqual(reader.read()[4], 0)

    def test_a_round_that_overflows_the_ring_counts_the_oldest_as_dropped(self):
        history = FakeHistory()
        reader = self.reader(history, ring=4)
        history.step([1, 2, 3])  # 9 events; the ring keeps the newest 4
        ops, sizes, *_, dropped = reader.read()
        self.assertEqual((len(ops), dropped), (4, 5))

    def test_a_step_mark_falls_where_the_optimizer_stepped(self):
        history = FakeHistory()
        reader = self.reader(history)
        history.step([512])
        reader.mark_step()
        history.step([4096])
        ops, sizes, ids, streams, dropped = reader.read()
        self.assertEqual(list(ops), [0, 1, 2, _history.STEP, 0, 1, 2])
        self.assertEqual((sizes[3], ids[3], streams[3]), (0, 0, 0))
        # A mark after the last event read comes with this round, not the next.
        history.step([64])
        reader.mark_step()
        self.assertEqual(list(reader.read()[0]), [0, 1, 2, _history.STEP])
        self.assertEqual(list(reader.read()[0]), [])

    def test_a_history_the_job_arms_itself_is_left_to_it(self):
        # The job calls _record_memory_history (PyTorch's defaults: stack
        # frames with each event) to dump a memory snapshot: the reader stops
        # reading and re-arming it, and stopping leaves it recording.
        torch = FakeTorch()
        reader = _history.HistoryReader(torch, 0)
        reader.start()
        torch.history.step([4096])
        self.assertEqual(len(reader.read()[0]), 3)
        torch.cuda.memory._record_memory_history()
        torch.history.step([8192])
        calls = len(torch.history.calls)
        self.assertEqual(len(reader.read()[0]), 3)  # its events, as it armed it
        self.assertTrue(reader.job_records)
        self.assertEqual(len(torch.history.calls), calls)  # not re-armed
        torch.history.step([8192])
        self.assertEqual(len(reader.read()[0]), 0)
        reader.stop()
        self.assertTrue(torch.history.enabled)
        self.assertEqual(len(torch.history.ring), 6)
        # A job recording its own history, even before its first allocation,
        # is read by the tracker, not the history.
        os.environ["ALLOCD_EVENT_SOURCE"] = "auto"
        try:
            fresh = FakeTorch()
            # A tracker reads the history first through its own library.
            tracker = types.SimpleNamespace(history_reader=lambda: _history.HistoryReader(fresh, 0))
            self.assertIs(_event_stream.first_reader(tracker, torch, 0), tracker)
            self.assertIsInstance(_event_stream.first_reader(tracker, fresh, 0),
                                  _history.HistoryReader)
            self.assertIs(_event_stream.first_reader(tracker, fresh, 0, job_records=True),
                          tracker)
            fresh.cuda.memory._record_memory_history()
            self.assertEqual(fresh.history.ring, [])
            self.assertIs(_event_stream.first_reader(tracker, fresh, 0), tracker)
        finally:
            os.environ["ALLOCD_EVENT_SOURCE"] = "history"

    def test_before_cuda_is_up_it_records_from_cudas_initialisation(self):
        # Recording the history would start CUDA (transparent enable() runs
        # before the job touches it): it starts at CUDA's lazy initialisation,
        # and nothing is read or marked until then.
        torch = FakeTorch()
        up, queued = [False], []
        torch.cuda.is_initialized = staticmethod(lambda: up[0])
        torch.cuda._lazy_call = staticmethod(queued.append)
        reader = _history.HistoryReader(torch, 0)
        reader.start()
        self.assertEqual(torch.history.calls, [])
        reader.mark_step()
        self.assertEqual(reader.read(), (array.array("B"), *(array.array("Q"),) * 3, 0))
        self.assertEqual(len(queued), 1)
        up[0] = True
        queued.pop()()
        self.assertTrue(torch.history.enabled)
        torch.history.step([4096])
        self.assertEqual(list(reader.read()[0]), [0, 1, 2])
        reader.stop()
        self.assertFalse(torch.history.enabled)
        # Stopped before CUDA came up: its queued start is void.
        late = _history.HistoryReader(torch, 0)
        up[0] = False
        late.start()
        late.stop()
        up[0] = True
        queued.pop()()
        self.assertFalse(torch.history.enabled)

    def test_a_pytorch_without_skip_actions_records_everything(self):
        history = FakeHistory(knows_skip_actions=False)
        reader = self.reader(history)
        self.assertIsNone(history.calls[-1]["skip_actions"])
        history.event("segment_alloc", 0, 2 << 20)
        history.step([8])
        ops, *_ = reader.read()
        self.assertEqual(list(ops), [0, 1, 2])  # segment actions are not events


class RoundPacingTest(unittest.TestCase):
    """The advisor's rounds come before the stream's reader fills: a job that
    marks no step (generation, a server) gets rounds at the period, and
    past the reader's bound its events are lost."""

    class Clock:
        def __init__(self):
            self.now = 100.0

        def __call__(self):
            return self.now

    def stream(self, history, ring):
        clock = self.Clock()
        reader = _history.HistoryReader(FakeTorch(history), 0, ring=ring)
        reader.start()
        lib = types.SimpleNamespace(allocd_record_events=lambda *args: 0)
        return _event_stream.EventStream(lib, None, reader, clock=clock), clock

    def test_the_next_read_is_due_before_the_ring_is_half_full_at_the_last_rounds_rate(self):
        history = FakeHistory()
        stream, clock = self.stream(history, ring=6000)
        self.assertEqual(stream.reader.capacity, 6000)
        self.assertIsNone(stream.read_within(), "no rate before a round")
        history.step([512] * 100)  # 300 events
        stream.send()
        self.assertIsNone(stream.read_within(), "a rate takes two reads")
        clock.now += 0.5
        history.step([512] * 500)  # 1,500 events in 0.5 s: 3,000 a second
        stream.send()
        self.assertAlmostEqual(stream.read_within(), 1.0)  # 3,000 more fill half
        clock.now += 0.25
        self.assertAlmostEqual(stream.read_within(), 0.75)
        clock.now += 10
        self.assertEqual(stream.read_within(), stream.MIN_READ_WITHIN_S)

    def test_dropped_events_count_toward_the_rate(self):
        history = FakeHistory()
        stream, clock = self.stream(history, ring=60)
        stream.send()
        clock.now += 1.0
        history.step([512] * 40)  # 120 events, 60 of them lost
        stream.send()
        self.assertAlmostEqual(stream.read_within(), 0.25)  # 30 at 120 a second

    def test_a_stream_off_or_restarted_sets_no_bound_until_it_has_a_rate(self):
        history = FakeHistory()
        stream, clock = self.stream(history, ring=6000)
        stream.send()
        clock.now += 1.0
        history.step([512] * 10)
        stream.send()
        self.assertIsNotNone(stream.read_within())
        reader = stream.reader
        stream.pause()
        self.assertIsNone(stream.read_within())
        stream.begin(reader)
        self.assertIsNone(stream.read_within())

    def test_the_advisor_waits_the_least_of_its_period_and_the_streams_bound(self):
        history = FakeHistory()
        stream, clock = self.stream(history, ring=6000)
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "", events=stream)
        self.assertEqual(advisor.next_wait(), 1.0)
        stream.send()
        clock.now += 0.5
        history.step([512] * 1000)  # 6,000 events a second: half the ring in 0.5 s
        stream.send()
        self.assertAlmostEqual(advisor.next_wait(), 0.5)
        clock.now += 1.0
        history.step([512])  # 3 events a second
        stream.send()
        self.assertEqual(advisor.next_wait(), 1.0)


class RestateAfterLossTest(unittest.TestCase):
    """A stream that lost events and sent no allocator state since restarts
    with one: the daemon's autotuner skips a window holding the gap until a
    state after it, and a job that marks no step sends none otherwise."""

    def setUp(self):
        self.history = FakeHistory()
        self.torch = FakeTorch(self.history)
        self.torch.segments = [AdviseTest.weights_segment(AdviseTest)]
        self.clock = RoundPacingTest.Clock()
        self.states = []
        lib = types.SimpleNamespace(
            allocd_record_events=lambda *args: 0,
            allocd_record_state=lambda client, *columns: self.states.append(columns) or 0)
        reader = _history.HistoryReader(self.torch, 0, ring=60)
        reader.start()
        self.stream = _event_stream.EventStream(lib, None, reader, clock=self.clock)
        self.control = _stream_control.StreamControl(self.torch, 0, self.stream)

    def lose_events(self):
        self.history.step([512] * 40)  # 120 events, 60 of them lost
        self.stream.send()

    def round_at(self, seconds_after_loss):
        self.clock.now = self.lost_at + seconds_after_loss
        self.control.round({}, {})

    def test_a_loss_with_no_state_after_it_restarts_the_stream_with_one(self):
        self.lose_events()
        self.lost_at = self.clock.now
        self.assertEqual(self.stream.unstated_loss, self.lost_at)
        self.round_at(3.9)
        self.assertEqual((self.control.restated, len(self.states)), (0, 0))
        self.round_at(4.0)
        self.assertEqual((self.control.restated, len(self.states)), (1, 1))
        self.assertIsNone(self.stream.unstated_loss)
        self.assertIs(self.stream.reader.__class__, _history.HistoryReader)
        self.assertTrue(self.history.enabled, "the history records again")
        self.assertEqual(self.control.stats()["stream_restated"], 1)
        # Losing again: the wait has doubled.
        self.lose_events()
        self.lost_at = self.clock.now
        self.round_at(7.9)
        self.assertEqual(self.control.restated, 1)
        self.round_at(8.0)
        self.assertEqual((self.control.restated, len(self.states)), (2, 2))

    def test_a_state_sent_after_the_loss_leaves_the_stream_as_it_is(self):
        self.lose_events()
        self.lost_at = self.clock.now
        # A step mark's state, as a training job sends every period.
        self.assertTrue(self.stream.send_state(_event_stream.start_state(self.torch, 0)))
        self.assertIsNone(self.stream.unstated_loss)
        reader = self.stream.reader
        self.round_at(60)
        self.assertEqual(self.control.restated, 0)
        self.assertIs(self.stream.reader, reader)

    def test_with_states_off_a_loss_restarts_nothing(self):
        os.environ["ALLOCD_STATE_PERIOD_S"] = "-1"
        self.addCleanup(os.environ.pop, "ALLOCD_STATE_PERIOD_S")
        self.lose_events()
        self.lost_at = self.clock.now
        self.round_at(600)
        self.assertEqual((self.control.restated, len(self.states)), (0, 0))


class AdviseTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="allocd_py_")
        # Cleanups run after tearDown: the daemon is gone by then.
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.socket = os.path.join(self.dir, "a.sock")
        self.daemon = sim_daemon.start(self.socket, "--sim-devices", "2")
        self.assertIsNotNone(self.daemon, "allocd serve did not start")
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

    def test_the_session_is_on_the_gpu_whose_uuid_torch_reports(self):
        self.torch.device_uuid = "SIM-GPU-1"
        self.assertTrue(allocd.advise(socket=self.socket, job="llama", period=0.05))
        self.assertTrue(wait_for(lambda: self.allocctl("sessions").get("sessions")))
        session = self.allocctl("sessions")["sessions"][0]
        self.assertEqual(session["gpu_uuid"], "SIM-GPU-1")
        self.assertEqual(session["node_device"], 1)

    def test_without_a_uuid_from_torch_the_session_is_on_the_first_gpu(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="llama", period=0.05))
        self.assertTrue(wait_for(lambda: self.allocctl("sessions").get("sessions")))
        self.assertEqual(self.allocctl("sessions")["sessions"][0]["gpu_uuid"], "SIM-GPU-0")

    def test_pytorchs_bare_uuid_is_written_as_nvidia_smi_does(self):
        self.torch.device_uuid = "8f6e1d2c-0b1a-4c3d-9e8f-7a6b5c4d3e2f"
        self.assertEqual(_advisor.gpu_uuid(self.torch, 0),
                         "GPU-8f6e1d2c-0b1a-4c3d-9e8f-7a6b5c4d3e2f")

    def test_rounds_are_short_from_the_first_mark_until_a_config_is_applied_or_the_start_is_over(self):
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "")
        quick = _advisor.Advisor.QUICK_PERIOD_S
        now = time.monotonic()
        # A job that has marked no step (a server, or a model being built)
        # is read at the period asked.
        self.assertEqual(advisor.round_period(now=now), 1.0)
        advisor.at_step_mark(now=now)
        self.assertEqual(advisor.round_period(now=now + 1), quick)
        later = now + _advisor.Advisor.QUICK_START_S + 1
        self.assertEqual(advisor.round_period(now=later), 1.0)
        advisor.at_step_mark(now=later)
        advisor.applied = 1
        self.assertEqual(advisor.round_period(now=later + 1), 1.0)
        # A period shorter than the quick one stays as asked.
        self.assertEqual(_advisor.Advisor(None, None, None, 0, 0.05, "").round_period(), 0.05)

    def test_rounds_are_at_the_period_while_the_stream_is_off(self):
        # The daemon decided and stopped the stream: nothing it reads comes
        # sooner with quick rounds, which hold the GIL the job waits for.
        stream = _event_stream.EventStream(None, None)  # deferred: no reader
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "", events=stream)
        now = time.monotonic()
        advisor.at_step_mark(now=now)
        self.assertEqual(advisor.round_period(now=now + 1), 1.0)
        stream.begin(types.SimpleNamespace())  # the stream starts again (the job grew)
        self.assertEqual(advisor.round_period(now=now + 1), _advisor.Advisor.QUICK_PERIOD_S)

    def test_each_first_step_mark_after_a_long_pause_makes_the_rounds_short_again(self):
        # A job that compiled before its first step, and again before its third.
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "")
        quick_s, quick = _advisor.Advisor.QUICK_START_S, _advisor.Advisor.QUICK_PERIOD_S
        now = time.monotonic() + quick_s + 10
        self.assertEqual(advisor.round_period(now=now), 1.0)
        for _ in range(_advisor.Advisor.WAKING_MARKS):
            advisor.at_step_mark(now=now)
            self.assertEqual(advisor.round_period(now=now + 1), quick)
            now += quick_s + 10
            self.assertEqual(advisor.round_period(now=now), 1.0)
        # Later marks do not.
        advisor.at_step_mark(now=now)
        self.assertEqual(advisor.round_period(now=now + 1), 1.0)

    def test_the_first_step_marks_wake_a_round_at_once_until_a_config_is_applied(self):
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "")
        woken = []
        for _ in range(_advisor.Advisor.WAKING_MARKS + 1):
            advisor._wake.clear()
            advisor.at_step_mark()
            woken.append(advisor._wake.is_set())
        self.assertEqual(woken, [True] * _advisor.Advisor.WAKING_MARKS + [False])
        self.assertEqual(advisor.steps_marked, _advisor.Advisor.WAKING_MARKS + 1)
        applied = _advisor.Advisor(None, None, None, 0, 1.0, "")
        applied.applied = 1
        applied.at_step_mark()
        self.assertFalse(applied._wake.is_set())

    def test_the_marks_after_a_config_is_applied_wake_a_round_at_once(self):
        # Long after the start: only the apply makes marks wake rounds.
        advisor = _advisor.Advisor(None, None, None, 0, 1.0, "")
        for _ in range(_advisor.Advisor.WAKING_MARKS):
            advisor.at_step_mark()
        advisor.saw_applied(1)
        woken = []
        for _ in range(_advisor.Advisor.MARKS_AFTER_APPLY + 1):
            advisor._wake.clear()
            advisor.at_step_mark()
            woken.append(advisor._wake.is_set())
        self.assertEqual(woken, [True] * _advisor.Advisor.MARKS_AFTER_APPLY + [False])
        # The same count again is no new apply; the next config is.
        advisor.saw_applied(1)
        advisor._wake.clear()
        advisor.at_step_mark()
        self.assertFalse(advisor._wake.is_set())
        advisor.saw_applied(2)
        advisor.at_step_mark()
        self.assertTrue(advisor._wake.is_set())

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
        # The push took effect for the next peak: the cache was emptied,
        # and the job says what it runs and why.
        self.assertGreaterEqual(self.torch.empty_cache_calls, 1)
        # ... which held PyTorch's allocator: the job's allocations waited.
        holds = allocd.stats()["allocator_holds"]
        self.assertEqual(holds["count"]["empty_cache"], self.torch.empty_cache_calls)
        self.assertEqual([what for _, _, what in holds["recent"]],
                         ["empty_cache"] * self.torch.empty_cache_calls)
        self.assertIn("garbage_collection_threshold:0.6", allocd.stats()["config"])
        self.assertIn("set by", allocd.stats()["config_reason"])

    def test_settings_go_to_the_accelerator_setter_where_pytorch_has_it(self):
        # PyTorch >= 2.9 warns on every call of torch.cuda.memory's.
        def accelerator(update):
            return update

        def cuda_setter(update):
            return update

        cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
            _set_allocator_settings=cuda_setter))
        newer = types.SimpleNamespace(
            _C=types.SimpleNamespace(_accelerator_setAllocatorSettings=accelerator), cuda=cuda)
        older = types.SimpleNamespace(_C=types.SimpleNamespace(), cuda=cuda)
        self.assertIs(_advisor.allocator_settings_setter(newer), accelerator)
        self.assertIs(_advisor.allocator_settings_setter(older), cuda_setter)

    def test_a_push_is_applied_as_it_arrives_not_at_the_next_round(self):
        # Rounds a minute apart, and no quick start: only the control
        # watcher can apply the push within the wait.
        quick_start = _advisor.Advisor.QUICK_START_S
        _advisor.Advisor.QUICK_START_S = 0
        self.addCleanup(setattr, _advisor.Advisor, "QUICK_START_S", quick_start)
        self.assertTrue(allocd.advise(socket=self.socket, job="slow", period=60))
        self.assertTrue(wait_for(lambda: self.allocctl("sessions").get("sessions")))
        pushed = time.monotonic()
        self.allocctl("config", "set", "garbage_collection_threshold:0.6", "--job", "slow")
        self.assertTrue(wait_for(lambda: self.torch.settings, seconds=5))
        self.assertLess(time.monotonic() - pushed, 5)
        self.assertEqual(allocd.stats()["configs_applied"], 1)
        # stop() does not wait for the minute's round to end.
        stopped = time.monotonic()
        allocd.shutdown()
        self.assertLess(time.monotonic() - stopped, 5)

    def test_the_allocation_stream_reaches_the_daemons_autotuner(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="tuned", period=0.05,
                                      pinned_keys=["expandable_segments"]))
        # Under the advisor's lock, as PyTorch's allocator lock keeps a real
        # job's events out of the reader's snapshot-to-clear gap here.
        with allocd._state.advisor._lock:
            for _ in range(50):
                self.torch.history.step([1 << 20, 2 << 20, 512])

        def job():
            jobs = self.allocctl("autotune", "status").get("jobs", [])
            return next((j for j in jobs if j["job"] == "tuned"), None)

        self.assertTrue(wait_for(lambda: job() and int(job().get("window_events", 0)) >= 450))
        self.assertEqual(job()["pinned_keys"], ["expandable_segments"])
        self.assertEqual(allocd.stats()["events_sent"], 450)  # 50 steps of 3 allocs, 6 frees
        self.assertEqual(allocd.stats()["events_dropped"], 0)
        self.assertEqual(allocd.stats()["event_source"], "history")
        # What reading it cost the job, as time the advisor thread was busy,
        # and where it went.
        self.assertGreater(allocd.stats()["advisor_seconds"], 0)
        self.assertGreater(allocd.stats()["advisor_rounds"], 0)
        self.assertGreater(allocd.stats()["advisor_seconds_by_part"]["events"], 0)

    def test_a_round_of_more_events_than_the_client_holds_between_sends_loses_none(self):
        # The client holds 65,536 events between two sends to the daemon; a
        # round takes everything since the last one, a second of a job of
        # 100,000 events a second. The advisor waits for them to be sent.
        self.assertTrue(allocd.advise(socket=self.socket, job="busy", period=0.05))
        with allocd._state.advisor._lock:
            for _ in range(10_000):
                self.torch.history.step([1 << 20, 2 << 20, 512])
        self.assertTrue(wait_for(lambda: allocd.stats()["events_sent"] >= 90_000, seconds=30))
        self.assertEqual(allocd.stats()["events_dropped"], 0)

    def test_memory_stats_are_read_once_a_period_and_again_after_the_allocator_changed(self):
        period = _advisor.Advisor.STATS_PERIOD_S
        _advisor.Advisor.STATS_PERIOD_S = 3600
        self.addCleanup(setattr, _advisor.Advisor, "STATS_PERIOD_S", period)
        # No allocation stream: its history reader asks memory_stats() too.
        self.assertTrue(allocd.advise(socket=self.socket, job="stats", period=0.02,
                                      record_events=False))
        self.assertTrue(wait_for(lambda: allocd.stats()["advisor_rounds"] >= 10))
        # Every round publishes, but PyTorch was asked once.
        self.assertEqual(self.torch.memory_stats_calls, 1)
        self.torch.reserved = 8 << 20
        self.allocctl("config", "set", "garbage_collection_threshold:0.6", "--job", "stats")
        self.assertTrue(wait_for(lambda: any(e["event"] == "ack" for e in self.history())))
        # The push emptied the cache: what the daemon sees next is read anew.
        self.assertTrue(wait_for(lambda: self.allocctl("sessions")["sessions"][0]
                                 .get("stats", {}).get("reserved_bytes.all.current")
                                 == str(8 << 20)))

    def test_optimizer_steps_are_marked_and_the_daemon_decides_on_them(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="marked", period=0.05))
        class Optimizer:  # weakly referable, as torch.optim's are
            pass

        adam, discriminator = Optimizer(), Optimizer()
        with allocd._state.advisor._lock:
            for _ in range(5):
                for _ in range(50):
                    self.torch.history.step([1 << 20, 2 << 20, 512])
                self.torch.step(adam)
                # A second optimizer (a GAN's) steps in the same step: one mark.
                self.torch.step(discriminator)
        self.assertEqual(allocd._state.advisor.steps_marked, 5)

        def decisions():
            return self.allocctl("autotune", "history", "--job", "marked").get("decisions", [])

        # Marked steps are no allocations: the window holds the 2250 events,
        # and the marks decide the first pass.
        self.assertTrue(wait_for(decisions, seconds=DECISION_WAIT_S),
                        (self.allocctl("autotune", "status"), allocd.stats()))
        self.assertIn("the job marked", decisions()[0]["why"])
        self.assertEqual(allocd.stats()["events_dropped"], 0)
        allocd.shutdown()
        self.assertEqual(self.torch.step_hooks, [])

    def test_only_the_marks_the_session_needs_cross_into_the_client_library(self):
        # The first mark tells the session the job marks steps, and the
        # marks after a config is applied make the second release; any other
        # would release the GIL on the job's thread every step for nothing.
        self.assertTrue(allocd.advise(socket=self.socket, job="marks", period=0.05))
        advisor = allocd._state.advisor
        # Those that do, as the rounds' calls, keep the GIL (a PyDLL's calls).
        lib, crossed = advisor._held, []
        self.assertIsInstance(lib, ctypes.PyDLL)

        class CountingMarks:
            def __getattr__(self, name):
                if name == "allocd_mark_step":
                    crossed.append(advisor.steps_marked + 1)
                return getattr(lib, name)

        advisor._held = CountingMarks()

        class Optimizer:
            pass

        adam = Optimizer()
        for _ in range(6):
            self.torch.step(adam)
        self.assertEqual(crossed, [1])
        self.allocctl("config", "set", "garbage_collection_threshold:0.6", "--job", "marks")
        self.assertTrue(wait_for(lambda: allocd.stats()["configs_applied"] == 1))
        released = self.torch.empty_cache_calls
        for _ in range(_advisor.Advisor.MARKS_AFTER_APPLY + 2):
            self.torch.step(adam)
        self.assertEqual(crossed, [1, 7, 8, 9])
        # The first of them released the cache once more (1 MiB was live at
        # the switch), and only it.
        self.assertEqual(self.torch.empty_cache_calls, released + 1)

    def test_reading_the_session_while_a_round_runs_python_does_not_deadlock(self):
        # A round's allocd_poll holds the client's poll lock while it runs
        # Python (the allocator's stats), which hands the GIL over at the
        # switch interval: a thread that then reads the session waits for
        # that lock, and must not hold the GIL while it does.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        self.addCleanup(sys.setswitchinterval, interval)
        period = _advisor.Advisor.STATS_PERIOD_S
        _advisor.Advisor.STATS_PERIOD_S = 0
        self.addCleanup(setattr, _advisor.Advisor, "STATS_PERIOD_S", period)
        self.assertTrue(allocd.advise(socket=self.socket, job="busy", period=0.001,
                                      record_events=False))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            allocd.stats()
        self.assertGreater(self.torch.memory_stats_calls, 2)

    WEIGHTS = 0x7F0000000000

    def weights_segment(self):
        """PyTorch's snapshot of a 64 MiB segment whose first 48 MiB hold
        weights allocated before the stream was recorded."""
        return {"device": 0, "address": self.WEIGHTS, "total_size": 64 << 20, "stream": 7,
                "segment_type": "large", "is_expandable": False,
                "blocks": [{"address": self.WEIGHTS, "size": 48 << 20,
                            "requested_size": 48 << 20, "state": "active_allocated"}]}

    def test_a_state_read_at_a_mark_is_what_the_decision_replays_from(self):
        # The weights, the rest of their segment cached, and a 20 MiB cached
        # segment the program left.
        weights = self.WEIGHTS
        segment = self.weights_segment()
        segment["blocks"].append({"address": weights + (48 << 20), "size": 16 << 20,
                                  "requested_size": 0, "state": "inactive"})
        self.torch.segments = [
            segment,
            {"device": 0, "address": weights + (64 << 20), "total_size": 20 << 20,
             "stream": 7, "segment_type": "large", "is_expandable": False,
             "blocks": [{"address": weights + (64 << 20), "size": 20 << 20,
                         "requested_size": 0, "state": "inactive"}]},
            {"device": 1, "address": 1 << 40, "total_size": 2 << 20, "blocks": []}]
        os.environ["ALLOCD_STATE_PERIOD_S"] = "0"
        try:
            self.assertTrue(allocd.advise(socket=self.socket, job="stated", period=0.05))
        finally:
            del os.environ["ALLOCD_STATE_PERIOD_S"]

        class Optimizer:
            pass

        adam = Optimizer()
        with allocd._state.advisor._lock:
            for _ in range(4):
                for _ in range(250):
                    self.torch.history.step([1 << 20, 2 << 20, 512])
                self.torch.step(adam)

        def decisions():
            return self.allocctl("autotune", "history", "--job", "stated").get("decisions", [])

        self.assertTrue(wait_for(decisions, seconds=DECISION_WAIT_S),
                        (self.allocctl("autotune", "status"), allocd.stats()))
        self.assertEqual(allocd.stats()["states_sent"], 5)  # where the stream began, 4 marks
        # The job's thread's time in the step hook, reading the 4 states in it.
        parts = allocd.stats()["advisor_seconds_by_part"]
        self.assertGreater(parts["state"], 0)
        self.assertGreaterEqual(parts["step_hook"], parts["state"])
        why = decisions()[0]["why"]
        # Switched from the newest state with two steps after it,
        # with the 64 MiB segment the weights hold (and device 1's left out).
        self.assertIn("real state the client sent there (2 segments, 1 blocks held)", why)
        self.assertIn("the prediction covers the 4500 events after event 0", why)

    def test_a_job_without_marks_is_replayed_from_the_state_where_its_stream_began(self):
        # advise() called once the model was built: 48 MiB of weights the
        # stream never allocates, and no optimizer (generation).
        self.torch.segments = [self.weights_segment()]
        self.assertTrue(allocd.advise(socket=self.socket, job="generating", period=0.05))
        self.assertEqual(allocd.stats()["states_sent"], 1)
        # Past the daemon's aperiodic_after_events (65536) with no mark.
        with allocd._state.advisor._lock:
            for _ in range(7400):
                self.torch.history.step([1 << 20, 2 << 20, 512])

        def decisions():
            return self.allocctl("autotune", "history", "--job", "generating").get(
                "decisions", [])

        self.assertTrue(wait_for(decisions, seconds=DECISION_WAIT_S),
                        (self.allocctl("autotune", "status"), allocd.stats()))
        why = decisions()[0]["why"]
        self.assertIn("its client marks optimizer steps and it marked none", why,
                      decisions())
        self.assertIn("replayed from the allocator's real state the client sent there "
                      "(1 segments, 1 blocks held)", why)
        self.assertIn("(the job's largest request so far)", why)
        # The weights are in what the job needs.
        self.assertGreaterEqual(int(decisions()[0]["predicted_peak_requested"]), 48 << 20)

    def start_on_a_harmful_config(self):
        """The daemon again, in apply mode (a fresh node: the seed prior), and
        the job's PYTORCH_CUDA_ALLOC_CONF max_split_size_mb:64, which the
        daemon replaces at registration."""
        self.daemon.kill()
        self.daemon.wait()
        self.daemon = sim_daemon.start(self.socket, "--sim-devices", "2", "--autotune", "apply")
        self.assertIsNotNone(self.daemon)
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:64"
        self.addCleanup(os.environ.pop, "PYTORCH_CUDA_ALLOC_CONF", None)

    def test_a_harmful_start_config_is_replaced_before_advise_returns(self):
        # A daemon in apply mode replaces max_split_size_mb:64 at registration
        # (a fresh node: by the seed prior); the job's next allocation, right
        # after advise(), is made under that.
        self.start_on_a_harmful_config()
        self.assertTrue(allocd.advise(socket=self.socket, job="harmful", period=5.0))
        self.assertEqual(len(self.torch.settings), 1)
        self.assertIn("expandable_segments:True", self.torch.settings[0])
        self.assertIs(self.torch.settings_threads[0], threading.current_thread())
        self.assertEqual(allocd.stats()["start_config_source"], "prior")

    def step_until_paused(self, optimizer, job):
        """Steps `job` until the daemon paused its stream; allocd.stats() then."""
        deadline = time.monotonic() + DECISION_WAIT_S
        while allocd.stats()["event_source"] != "deferred" and time.monotonic() < deadline:
            with allocd._state.advisor._lock:
                self.torch.history.step([1 << 20, 2 << 20, 512])
                self.torch.step(optimizer)
            time.sleep(0.02)
        stats = allocd.stats()
        self.assertEqual(stats["event_source"], "deferred",
                         (stats, self.allocctl("autotune", "history", "--job", job)))
        return stats

    def test_a_stream_pauses_once_the_daemon_learns_the_config_the_run_runs(self):
        # A first run replaced at registration (the seed prior's config), whose
        # review then keeps that config on the job's own events: the daemon
        # learns it, and tells the running session it has nothing to decide
        # until it outgrows it. Its history stops (PyTorch records nothing
        # more), and starts again, with the allocator's state, past the peak.
        self.start_on_a_harmful_config()
        self.torch.reserved = 1 << 20
        self.assertTrue(allocd.advise(socket=self.socket, job="reviewed", period=0.05))
        self.assertEqual(allocd.stats()["event_source"], "history")

        class Optimizer:
            pass

        optimizer = Optimizer()
        stats = self.step_until_paused(optimizer, "reviewed")
        # The review's learned config, then the first pass's keep of it: the
        # stream pauses at whichever comes first, and the later one, to a
        # stream already off, only moves its threshold.
        self.assertGreaterEqual(stats["stream_demands"], 1)
        for said in (stats["stream_paused"], stats["stream_demand_reason"]):
            self.assertIn("nothing to decide until its reserved memory passes", said)
        self.assertTrue(stats["stream_paused"].startswith(('job "reviewed" learned', "decision ")),
                        stats["stream_paused"])
        until = stats["stream_deferred_until_reserved"]
        self.assertEqual(until, stats["stream_demanded_from_reserved"])
        self.assertGreater(until, 0)
        self.assertFalse(self.torch.history.enabled)
        # Every event PyTorch recorded before the pause reached the daemon.
        self.assertEqual(stats["events_dropped"], 0)
        self.assertGreater(stats["events_sent"], 0)
        sent, calls = stats["events_sent"], len(self.torch.history.calls)
        for _ in range(10):
            self.torch.history.step([1 << 20, 2 << 20, 512])
            self.torch.step(optimizer)
        rounds = allocd.stats()["advisor_rounds"]
        self.assertTrue(wait_for(lambda: allocd.stats()["advisor_rounds"] >= rounds + 5))
        self.assertEqual(allocd.stats()["events_sent"], sent)
        self.assertEqual(len(self.torch.history.calls), calls)

        self.torch.reserved = until + 1
        self.assertTrue(wait_for(lambda: allocd.stats()["event_source"] == "history"))
        self.assertIn(f"passed the {until}", allocd.stats()["stream_started"])
        self.assertTrue(self.torch.history.enabled)

    def test_a_stream_pauses_once_a_decision_keeps_the_config_the_run_runs(self):
        # Recommend mode: the first pass finds nothing better than what the
        # job runs, and settles it there.
        self.torch.reserved = 1 << 20
        self.assertTrue(allocd.advise(socket=self.socket, job="kept", period=0.05))

        class Optimizer:
            pass

        stats = self.step_until_paused(Optimizer(), "kept")
        self.assertEqual(stats["stream_demands"], 1)
        decisions = self.allocctl("autotune", "history", "--job", "kept")["decisions"]
        self.assertEqual([d["result"] for d in decisions], ["kept"])
        self.assertIn(f"decision {decisions[0]['id']} keeps", stats["stream_paused"])
        # The peak it predicted under the job's config, and the growth margin.
        self.assertEqual(stats["stream_demanded_from_reserved"],
                         int(1.1 * int(decisions[0]["predicted_peak_current"])))

    def assert_stream_stays_off(self, from_reserved):
        """The stream is off until the reserved memory passes `from_reserved`,
        and stays off: allocations over five rounds record nothing in
        PyTorch's history and send the daemon no event."""
        stats = allocd.stats()
        self.assertEqual(stats["event_source"], "deferred")
        self.assertEqual(stats["stream_from_reserved"], from_reserved)
        calls = len(self.torch.history.calls)
        for _ in range(5):
            self.torch.history.step([1 << 20, 2 << 20, 512])
        rounds = stats["advisor_rounds"]
        self.assertTrue(wait_for(lambda: allocd.stats()["advisor_rounds"] >= rounds + 5))
        self.assertEqual(len(self.torch.history.calls), calls)
        self.assertEqual(allocd.stats()["events_sent"], 0)

    def test_the_next_run_of_a_job_a_decision_kept_starts_with_its_stream_off(self):
        # A first pass kept the job's config; the run ends and the job's next
        # run (or the same process, advising again) registers while the
        # daemon still knows the job: it has nothing to decide below what
        # the job settled at, so its stream starts off, recording nothing.
        self.torch.reserved = 1 << 20
        self.assertTrue(allocd.advise(socket=self.socket, job="next-run", period=0.05))

        class Optimizer:
            pass

        optimizer = Optimizer()
        settled = self.step_until_paused(optimizer, "next-run")["stream_demanded_from_reserved"]
        allocd.shutdown()
        self.assertTrue(allocd.advise(socket=self.socket, job="next-run", period=0.05))
        self.assert_stream_stays_off(from_reserved=settled)
        # Past it, the stream starts.
        self.torch.reserved = settled + 1
        self.assertTrue(wait_for(lambda: allocd.stats()["event_source"] == "history"))

    def test_a_job_that_turns_autotune_off_records_no_stream(self):
        # Nothing reads the stream of a job whose autotune mode is off: it
        # starts off, and PyTorch records nothing for it.
        self.assertTrue(allocd.advise(socket=self.socket, job="untuned", period=0.05,
                                      autotune_mode="off"))
        self.assert_stream_stays_off(from_reserved=(1 << 64) - 1)

    def test_only_the_session_its_job_is_decided_on_streams(self):
        # Another session of the job registered first: the daemon decides on
        # that one's stream, and this one's stays off (nothing recorded)
        # until that session ends; then it starts, the allocator's state first.
        lib, first = _advisor.connect(self.torch, self.socket, "pair", "", 0, "")
        try:
            self.assertTrue(allocd.advise(socket=self.socket, job="pair", period=0.05))
            self.assert_stream_stays_off(from_reserved=(1 << 64) - 1)
        finally:
            lib.allocd_disconnect(first)
        self.assertTrue(wait_for(lambda: allocd.stats()["event_source"] == "history"))
        stats = allocd.stats()
        self.assertIn("whose stream its job was decided on, ended", stats["stream_started"])
        self.assertEqual(stats["stream_demanded_from_reserved"], 0)
        self.assertEqual(stats["states_sent"], 1)

    def test_a_tracker_stream_stays_on_when_the_daemon_needs_none(self):
        # The tracker cannot be detached from PyTorch's allocator: the
        # daemon's demand is answered with why it was not followed.
        self.torch.reserved = 1 << 20
        self.assertTrue(allocd.advise(socket=self.socket, job="tracked", period=0.05))
        advisor = allocd._state.advisor
        with advisor._lock:
            history = advisor._events.reader
            advisor._events.reader = types.SimpleNamespace(
                read=history.read, stop=history.stop, mark_step=history.mark_step,
                read_state=history.read_state)

        class Optimizer:
            pass

        optimizer = Optimizer()
        deadline = time.monotonic() + DECISION_WAIT_S
        while allocd.stats()["stream_paused"] is None and time.monotonic() < deadline:
            with advisor._lock:
                self.torch.history.step([1 << 20, 2 << 20, 512])
                self.torch.step(optimizer)
            time.sleep(0.02)
        stats = allocd.stats()
        self.assertEqual(stats["stream_demands"], 1)
        self.assertIn("the tracker cannot be detached", stats["stream_paused"])
        self.assertEqual(stats["event_source"], "tracker")
        self.assertTrue(self.torch.history.enabled)

    def test_a_stream_the_daemon_does_not_pause_moves_from_the_history_to_the_tracker(self):
        # Read from PyTorch's history first, with the tracker kept: once the
        # history ran its time without the daemon pausing it, the tracker,
        # which costs less while it runs, takes over, the allocator's state
        # first; every event the history read before reached the daemon.
        self.torch.segments = [self.weights_segment()]
        self.assertTrue(allocd.advise(socket=self.socket, job="switched", period=0.05))
        advisor = allocd._state.advisor

        class Tracker:
            started = False

            def start(self):
                self.started = True

            def read(self):
                return (array.array("B"), *(array.array("Q") for _ in range(3)), 0)

            def read_state(self):
                return None

            def mark_step(self):
                pass

            def stop(self):
                pass

        tracker = Tracker()
        with advisor._lock:
            advisor.stream.started_on(advisor._events.reader, tracker)
            for _ in range(3):
                self.torch.history.step([1 << 20, 2 << 20, 512])
        self.assertIsNone(allocd.stats()["stream_switched"])
        states = allocd.stats()["states_sent"]
        advisor.stream._history_until = 0
        self.assertTrue(wait_for(lambda: allocd.stats()["stream_switched"] is not None))
        stats = allocd.stats()
        self.assertIn("to the tracker after 120 s on PyTorch's history", stats["stream_switched"])
        self.assertEqual(stats["event_source"], "tracker")
        self.assertTrue(tracker.started)
        self.assertFalse(self.torch.history.enabled)
        self.assertEqual(stats["events_sent"], 27)
        self.assertEqual(stats["states_sent"], states + 1)

    def test_a_job_that_arms_the_history_itself_moves_its_stream_to_the_tracker(self):
        self.assertTrue(allocd.advise(socket=self.socket, job="own-history", period=0.05))
        advisor = allocd._state.advisor
        tracker = types.SimpleNamespace(
            started=False, read=lambda: (array.array("B"), *(array.array("Q"),) * 3, 0),
            read_state=lambda: None, mark_step=lambda: None, stop=lambda: None)
        tracker.start = lambda: setattr(tracker, "started", True)
        with advisor._lock:
            advisor.stream.started_on(advisor._events.reader, tracker)
            self.torch.cuda.memory._record_memory_history()  # the job's own, for a snapshot
            self.torch.history.step([1 << 20])
        self.assertTrue(wait_for(lambda: allocd.stats()["stream_switched"] is not None))
        self.assertIn("the job records PyTorch's history itself",
                      allocd.stats()["stream_switched"])
        self.assertTrue(tracker.started)
        self.assertTrue(self.torch.history.enabled)  # still the job's
        self.assertEqual(self.torch.history.calls[-1]["context"], "all")
        # Its history holds what it recorded since, never cleared by allocd.
        self.torch.history.step([4096])
        rounds = allocd.stats()["advisor_rounds"]
        self.assertTrue(wait_for(lambda: allocd.stats()["advisor_rounds"] >= rounds + 3))
        self.assertEqual([e["action"] for e in self.torch.history.ring][-3:],
                         ["alloc", "free_requested", "free_completed"])
        self.assertEqual(len(self.torch.history.ring), 6)
        # allocd's own calls go past the watch, and shutdown takes it away.
        allocd.shutdown()
        self.assertFalse(hasattr(self.torch.cuda.memory._record_memory_history,
                                 "allocd_unwatched"))

    def start_learned_run(self, realized_peak=40 << 20, config="expandable_segments:True"):
        """A daemon in apply mode that learned `config` for job "learned" (this
        uid's), with the job peaking at `realized_peak` reserved under it
        then; advise() of that job's next run, whose model is already built
        (the weights' segment)."""
        self.daemon.kill()
        self.daemon.wait()
        state_dir = os.path.join(self.dir, "state")
        os.makedirs(state_dir)
        with open(os.path.join(state_dir, "learned_configs.json"), "w") as f:
            json.dump({"format": 1, "jobs": [{
                "tenant": f"uid:{os.getuid()}", "job": "learned",
                "config": config, "from_config": "max_split_size_mb:64", "decision_id": 3,
                "learned_unix_micros": 0, "predicted_peak_current": 64 << 20,
                "predicted_peak_switched": 32 << 20, "predicted_peak_allocated": 16 << 20,
                "predicted_peak_requested": 16 << 20, "realized_peak": realized_peak}]}, f)
        self.daemon = sim_daemon.start(self.socket, "--sim-devices", "2", "--autotune",
                                       "apply", "--state-dir", state_dir)
        self.assertIsNotNone(self.daemon)
        self.torch.segments = [self.weights_segment()]
        self.assertTrue(allocd.advise(socket=self.socket, job="learned", period=0.05))

    def test_a_learned_run_streams_only_once_it_outgrows_what_was_learned(self):
        self.start_learned_run()
        stats = allocd.stats()
        self.assertEqual(stats["start_config_source"], "learned")
        self.assertEqual(len(self.torch.settings), 1)
        self.assertIn("expandable_segments:True", self.torch.settings[0])
        # The 40 MiB it reached under the config, and the growth margin (10%).
        self.assertEqual(stats["stream_deferred_until_reserved"], int(1.1 * (40 << 20)))
        self.assertEqual(stats["event_source"], "deferred")
        self.assertEqual(stats["states_sent"], 0)

        class Optimizer:
            pass

        optimizer = Optimizer()
        # Steps within what was learned: PyTorch records nothing for allocd
        # (no history, no tracker), and nothing reaches the daemon.
        rounds = allocd.stats()["advisor_rounds"]
        for _ in range(20):
            self.torch.history.step([1 << 20, 2 << 20, 512])
            self.torch.step(optimizer)
        self.assertTrue(wait_for(lambda: allocd.stats()["advisor_rounds"] >= rounds + 5))
        self.assertEqual(self.torch.history.calls, [])
        stats = allocd.stats()
        self.assertEqual((stats["events_sent"], stats["states_sent"]), (0, 0))
        self.assertEqual(stats["steps_marked"], 20)
        self.assertIsNone(stats["stream_started"])

        # Past it: the next round starts the stream, with the allocator's
        # state first (the weights it never saw allocated), then its events
        # and step marks.
        self.torch.reserved = 48 << 20
        self.assertTrue(wait_for(lambda: allocd.stats()["event_source"] == "history"))
        self.assertIn("passed the 46137344 below which the daemon had nothing to decide",
                      allocd.stats()["stream_started"])
        self.assertEqual(allocd.stats()["states_sent"], 1)
        with allocd._state.advisor._lock:
            for _ in range(5):
                self.torch.history.step([1 << 20, 2 << 20, 512])
                self.torch.step(optimizer)
        self.assertTrue(wait_for(lambda: allocd.stats()["events_sent"] == 5 * 9 + 5))
        self.assertEqual(allocd.stats()["events_dropped"], 0)
        # The state read at the first mark in the stream went with it: the
        # 20 marks made before the stream are in no stream.
        self.assertEqual(allocd.stats()["states_sent"], 2)

    def test_a_learned_run_that_runs_out_of_memory_starts_its_stream(self):
        self.start_learned_run()
        self.assertEqual(allocd.stats()["event_source"], "deferred")
        self.torch.oom_observers[0](0, 2 << 20, 1 << 30, 0)
        self.assertTrue(wait_for(lambda: allocd.stats()["event_source"] == "history"))
        self.assertEqual(allocd.stats()["stream_started"], "the job ran out of memory")
        self.assertEqual(allocd.stats()["states_sent"], 1)

    def test_a_run_that_learned_pytorchs_defaults_runs_them_and_defers_its_stream(self):
        self.start_learned_run(config="")
        self.assertEqual(self.torch.settings, [])  # it runs them already
        self.assertEqual(allocd.stats()["start_config_source"], "learned")
        self.assertEqual(allocd.stats()["event_source"], "deferred")

    def test_a_learned_run_streams_from_the_start_when_told_to(self):
        os.environ["ALLOCD_DEFER_STREAM"] = "0"
        self.addCleanup(os.environ.pop, "ALLOCD_DEFER_STREAM", None)
        self.start_learned_run()
        self.assertEqual(allocd.stats()["event_source"], "history")
        self.assertEqual(allocd.stats()["states_sent"], 1)
        self.assertIsNone(allocd.stats()["stream_started"])

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
