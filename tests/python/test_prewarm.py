"""The pre-warm of a recurring peak (allocd/_prewarm.py): its forecast and
the advisor's pre-warms on a fake clock, a stand-in for torch and for the
interposer's allocd_interpose_prewarm, and the allocation stream leaving the
pre-warm's events out (EventStream.hide).
Environment: ALLOCD_PYTHON_DIR.
"""

import array
import os
import sys
import types
import unittest

sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
from allocd import _advisor, _prewarm  # noqa: E402
from allocd._event_stream import EventStream  # noqa: E402
from allocd._holds import AllocatorHolds  # noqa: E402
from allocd._prewarm import (MAP_FAILED, MAPPED, PARKED, REFUSED, TAKEN,  # noqa: E402
                             PeakForecast, Prewarmer)  # noqa: E402

GIB = 1 << 30
CAPACITY = 139 * GIB
PEAK = 60 * GIB
PERIOD = 3.0


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class FakeTorch:
    """torch.cuda's caching_allocator_alloc/delete and default_stream, with
    what they were asked; `fail`: the allocation raises as an OOM would."""

    def __init__(self):
        self.calls = []
        self.fail = False
        torch = self

        class cuda:  # noqa: N801 (torch.cuda)
            @staticmethod
            def default_stream(device):
                return types.SimpleNamespace(cuda_stream=0)

            @staticmethod
            def caching_allocator_alloc(size, device, stream):
                torch.calls.append(("alloc", size, device, stream))
                if torch.fail:
                    raise RuntimeError("CUDA out of memory. Tried to allocate 60.00 GiB")
                return 0x7000

            @staticmethod
            def caching_allocator_delete(address):
                torch.calls.append(("delete", address))

        self.cuda = cuda


def session(segments=(), reclaims=0, config=""):
    """The session as allocd_session_stats names it: map_path's large segments
    as (seconds, bytes)."""
    return {"reclaims": reclaims, "config": config,
            "map_path": {"large_segments": [[int(at * 1e9), size] for at, size in segments]}}


class PeakForecastTest(unittest.TestCase):
    def contended(self, forecast, times, size=PEAK, first=0):
        """Occurrences at `times`, the job reclaimed before each (the
        first seen with `first` reclaims)."""
        for reclaims, at in enumerate(times, start=first):
            forecast.occurred(at, size, reclaims)

    def test_a_steady_contended_peak_is_prewarmed_a_lead_before_it_recurs(self):
        forecast = PeakForecast(CAPACITY)
        self.contended(forecast, [0.0, 3.0])
        self.assertIsNone(forecast.pattern(), "two occurrences are no pattern")
        self.contended(forecast, [6.01], first=2)
        period, size = forecast.pattern()
        self.assertAlmostEqual(period, 3.005)
        self.assertEqual(size, PEAK)
        self.assertAlmostEqual(forecast.due_at(), 9.015 - 0.3005)
        self.assertIsNone(forecast.take_due(8.5, reclaims=3), "before the lead")
        self.assertEqual(forecast.take_due(8.8, reclaims=3), ("prewarm", PEAK))
        self.assertIsNone(forecast.take_due(8.9, reclaims=3), "handled once")
        self.assertIsNone(forecast.due_at())

    def test_jitter_or_no_reclaim_or_a_small_peak_is_no_pattern(self):
        jittery = PeakForecast(CAPACITY)
        self.contended(jittery, [0.0, 3.0, 6.5])
        self.assertIsNone(jittery.pattern())
        self.assertIsNone(jittery.take_due(9.0, reclaims=3))

        uncontended = PeakForecast(CAPACITY)
        for at in (0.0, 3.0, 6.0):
            uncontended.occurred(at, PEAK, reclaims=1)
        self.assertIsNone(uncontended.pattern(), "never reclaimed: the cache keeps it")

        small = PeakForecast(CAPACITY)
        self.contended(small, [0.0, 3.0, 6.0], size=4 * GIB)
        self.assertIsNone(small.pattern(), "a request's KV cache is no peak")

        sizes = PeakForecast(CAPACITY)
        for reclaims, (at, size) in enumerate([(0.0, PEAK), (3.0, 30 * GIB), (6.0, PEAK)]):
            sizes.occurred(at, size, reclaims)
        self.assertIsNone(sizes.pattern(), "one size recurs, or none does")

    def test_not_reclaimed_since_the_last_occurrence_is_skipped(self):
        forecast = PeakForecast(CAPACITY)
        self.contended(forecast, [0.0, 3.0, 6.0])
        self.assertEqual(forecast.take_due(8.8, reclaims=2), ("skip", "not reclaimed"))

    def test_a_prewarmed_peak_is_confirmed_from_the_stream_and_the_pattern_goes_on(self):
        forecast = PeakForecast(CAPACITY)
        self.contended(forecast, [0.0, 3.0, 6.0])
        self.assertEqual(forecast.take_due(8.75, reclaims=3), ("prewarm", PEAK))
        # The batch hits the cache: no segment, its allocation in the stream.
        forecast.allocated(9.4, PEAK, reclaims=3)
        self.assertAlmostEqual(forecast.next_at(), 12.0)
        # Not reclaimed since: still cached, nothing to do.
        self.assertEqual(forecast.take_due(11.75, reclaims=3), ("skip", "not reclaimed"))
        forecast.allocated(12.2, PEAK, reclaims=4)
        self.assertEqual(forecast.take_due(14.75, reclaims=5), ("prewarm", PEAK))

    def test_a_peak_that_stops_coming_breaks_the_pattern(self):
        forecast = PeakForecast(CAPACITY)
        self.contended(forecast, [0.0, 3.0, 6.0])
        self.assertEqual(forecast.take_due(8.75, reclaims=3), ("prewarm", PEAK))
        self.assertIsNone(forecast.take_due(10.4, reclaims=3))
        self.assertIsNotNone(forecast.pattern())
        self.assertIsNone(forecast.take_due(10.6, reclaims=3), "half a period late: broken")
        self.assertIsNone(forecast.pattern())
        self.assertEqual(forecast.broken, 1)
        # A large allocation unawaited (no pattern) counts for nothing.
        forecast.allocated(11.0, PEAK, reclaims=3)
        self.assertIsNone(forecast.pattern())

    def test_a_late_round_skips(self):
        forecast = PeakForecast(CAPACITY)
        self.contended(forecast, [0.0, 3.0, 6.0])
        self.assertEqual(forecast.take_due(9.1, reclaims=3), ("skip", "late"))


class RecordingLock:
    """The advisor's round lock, saying whether it is held."""

    def __init__(self):
        self.held = False

    def __enter__(self):
        self.held = True

    def __exit__(self, *exc):
        self.held = False


class PrewarmerTest(unittest.TestCase):
    def setUp(self):
        self.clock = Clock(9.5)
        self.torch = FakeTorch()
        self.asked = []
        self.answer = PARKED
        self.map_answer = MAPPED
        self.mapped = []  # (size, whether the CUDA lock was held)
        self.logged = []
        self.hidden = []
        self.cuda_lock = RecordingLock()

        def prewarm_segment(size):
            self.asked.append((self.clock.now, size))
            return self.answer

        def map_segment(size):
            self.mapped.append((size, self.cuda_lock.held))
            return self.map_answer

        self.prewarmer = Prewarmer(self.torch, 0, prewarm_segment, map_segment,
                                   lambda: self.torch.calls.append(("unused",)), CAPACITY,
                                   clock=self.clock, log=self.logged.append)
        # Three contended batches, seen as their segments mapped.
        for reclaims, at in enumerate([0.0, 3.0, 6.0]):
            self.prewarmer.observe(session([(at, PEAK)], reclaims=reclaims), [])
        self.prewarmer.observe(session([(0.0, PEAK), (3.0, PEAK), (6.0, PEAK)], reclaims=3), [])

    def run_at(self, now, reclaims=3, config=""):
        self.clock.now = now
        self.prewarmer.run_due(reclaims, config, self.hidden.append, self.cuda_lock)

    def test_a_due_prewarm_is_parked_then_allocated_and_freed_into_the_cache(self):
        self.assertAlmostEqual(self.prewarmer.seconds_until_due(8.0), 0.7)
        self.run_at(8.5)
        self.assertEqual(self.asked, [], "not yet due")
        self.run_at(8.71)
        self.assertEqual(self.asked, [(8.71, PEAK)])
        self.assertEqual(self.mapped, [(PEAK, True)], "mapped under the CUDA lock")
        # What PyTorch's cudaMalloc did not take is given back at once.
        self.assertEqual(self.torch.calls,
                         [("alloc", PEAK, 0, 0), ("delete", 0x7000), ("unused",)])
        self.assertEqual(self.hidden, [0x7000], "its events are the advisor's")
        stats = self.prewarmer.stats()
        self.assertEqual(stats["prewarms_attempted"], 1)
        self.assertEqual(stats["prewarms_served"], 1)
        self.assertAlmostEqual(stats["peak_period_s"], 3.0)
        self.assertEqual(stats["peak_bytes"], PEAK)
        self.assertEqual(len(self.logged), 1)
        self.assertIn("pre-warm of the peak of 60.0 GiB recurring every 3.00 s: cached",
                      self.logged[0])
        # Its own segment, logged by the map path, is no occurrence of the peak.
        start, end = self.prewarmer._own[-1]
        own = session(reclaims=3)
        own["map_path"]["large_segments"] = [[(start + end) // 2, PEAK]]
        self.prewarmer.observe(own, [])
        self.assertAlmostEqual(self.prewarmer.forecast.next_at(), 9.0)
        # The batch, a cache hit, shows in the stream on the default stream.
        self.clock.now = 9.2
        self.prewarmer.observe(session(reclaims=3), [(PEAK, 0)])
        self.assertAlmostEqual(self.prewarmer.forecast.next_at(), 12.0)

    def test_the_prewarms_allocation_is_timed_as_a_hold_of_the_allocator(self):
        holds = AllocatorHolds(self.clock)
        self.prewarmer._holds = holds
        alloc = self.torch.cuda.caching_allocator_alloc

        def mapping(size, device, stream):
            self.assertTrue(self.cuda_lock.held, "PyTorch's allocation under the CUDA lock")
            self.clock.now += 0.015
            return alloc(size, device, stream)

        self.torch.cuda.caching_allocator_alloc = staticmethod(mapping)
        self.run_at(8.71)
        stats = holds.stats()
        self.assertEqual(len(stats["recent"]), 1)
        start, seconds, what = stats["recent"][0]
        self.assertEqual((start, what), (8.71, "prewarm"))
        self.assertAlmostEqual(seconds, 0.015)
        self.assertEqual(stats["count"], {"prewarm": 1})

    def test_a_refused_prewarm_leaves_the_cache_untouched(self):
        self.answer = REFUSED
        self.run_at(8.71)
        self.assertEqual(len(self.asked), 1)
        self.assertEqual(self.torch.calls, [], "PyTorch's allocator never asked")
        self.assertEqual(self.mapped, [], "no CUDA call")
        self.assertEqual(self.prewarmer._holds.stats()["recent"], [], "nor held")
        self.assertEqual(self.hidden, [])
        stats = self.prewarmer.stats()
        self.assertEqual((stats["prewarms_refused"], stats["prewarms_served"]), (1, 0))
        self.assertIn("could not give it", stats["last_prewarm"])
        # The batch then comes from the daemon: its segment is the occurrence.
        self.prewarmer.observe(session([(9.02, PEAK)], reclaims=3), [])
        self.assertAlmostEqual(self.prewarmer.forecast.next_at(), 12.03)

    def test_a_grant_the_peak_took_meanwhile_is_not_allocated_again(self):
        self.map_answer = TAKEN  # the daemon waited for a neighbour; the batch came
        self.run_at(8.71)
        self.assertEqual(self.torch.calls, [], "a second allocation would be a second peak")
        stats = self.prewarmer.stats()
        self.assertEqual((stats["prewarms_taken_by_peak"], stats["prewarms_served"]), (1, 0))
        self.assertIn("taken by the peak's own cudaMalloc", stats["last_prewarm"])

    def test_a_grant_that_could_not_be_mapped_is_a_failure_and_nothing_is_allocated(self):
        self.map_answer = MAP_FAILED
        self.run_at(8.71)
        self.assertEqual(self.torch.calls, [])
        stats = self.prewarmer.stats()
        self.assertEqual((stats["prewarms_failed"], stats["prewarms_refused"]), (1, 0))
        self.assertIn("mapping it failed", stats["last_prewarm"])

    def test_a_failed_allocation_is_counted_and_its_oom_is_the_prewarms(self):
        seen_active = []
        alloc = self.torch.cuda.caching_allocator_alloc

        def failing(size, device, stream):
            seen_active.append(self.prewarmer.active)
            return alloc(size, device, stream)

        self.torch.cuda.caching_allocator_alloc = staticmethod(failing)
        self.torch.fail = True
        self.run_at(8.71)
        self.assertEqual(seen_active, [True], "the OOM observer knows it is not the job's")
        self.assertFalse(self.prewarmer.active)
        self.assertEqual(self.prewarmer.stats()["prewarms_failed"], 1)
        self.assertEqual(self.torch.calls[-1], ("unused",), "the mapped segment went back")
        self.assertEqual(self.hidden, [])

    def test_expandable_segments_are_skipped(self):
        self.run_at(8.71, config="expandable_segments:True")
        self.assertEqual(self.asked, [])
        self.assertEqual(self.prewarmer.stats()["prewarms_skipped"],
                         {"expandable segments": 1})

    def test_off_by_environment(self):
        os.environ["ALLOCD_PREWARM"] = "0"
        try:
            self.assertFalse(_prewarm.enabled())
        finally:
            del os.environ["ALLOCD_PREWARM"]
        self.assertTrue(_prewarm.enabled())


class AllocatorHoldsTest(unittest.TestCase):
    def test_the_most_recent_windows_are_kept_and_every_one_is_totalled(self):
        clock = Clock(0.0)
        holds = AllocatorHolds(clock)
        for i in range(AllocatorHolds.KEEP + 3):
            with holds.hold("empty_cache" if i % 2 else "prewarm"):
                clock.now += 0.5
        stats = holds.stats()
        self.assertEqual(len(stats["recent"]), AllocatorHolds.KEEP)
        self.assertEqual(stats["recent"][0][0], 1.5, "the three oldest went")
        self.assertEqual(stats["count"], {"prewarm": 130, "empty_cache": 129})
        self.assertAlmostEqual(stats["seconds"]["prewarm"], 65.0)

    def test_a_hold_that_raises_is_timed_too(self):
        clock = Clock(0.0)
        holds = AllocatorHolds(clock)
        with self.assertRaises(RuntimeError):
            with holds.hold("empty_cache"):
                clock.now = 0.25
                raise RuntimeError("CUDA error")
        self.assertEqual(holds.stats()["recent"], [[0.0, 0.25, "empty_cache"]])


class StartTest(unittest.TestCase):
    """Where the advisor pre-warms, and why not elsewhere."""

    def torch(self, total_memory=CAPACITY):
        torch = FakeTorch()
        properties = types.SimpleNamespace(total_memory=total_memory)
        torch.cuda.get_device_properties = staticmethod(
            lambda device: properties if total_memory else types.SimpleNamespace())
        return torch

    def test_on_with_the_interposer_and_the_stream_else_why_not(self):
        asked = []

        def prewarm(device, size):
            asked.append((device, size))
            return PARKED

        unused, mapped = [], []
        lib = types.SimpleNamespace(
            allocd_interpose_prewarm=prewarm,
            allocd_interpose_prewarm_map=lambda d, size: mapped.append((d, size)),
            allocd_interpose_prewarm_unused=lambda d: unused.append(d))
        events = EventStream(FakeLib(), None, FakeReader([]))
        prewarmer = _advisor.start_prewarmer(lib, self.torch(), 1, events)
        self.assertIsInstance(prewarmer, Prewarmer)
        self.assertEqual(events.watch_bytes, CAPACITY // 10)
        self.assertEqual(prewarmer._prewarm_segment(PEAK), PARKED)
        self.assertEqual(asked, [(1, PEAK)])
        prewarmer._map_segment(PEAK)
        prewarmer._free_unused()
        self.assertEqual((mapped, unused), ([(1, PEAK)], [1]))

        self.assertIn("older build", _advisor.start_prewarmer(
            types.SimpleNamespace(allocd_interpose_prewarm=prewarm), self.torch(), 0, events))
        self.assertIn("no allocation stream", _advisor.start_prewarmer(
            lib, self.torch(), 0, None))
        self.assertIn("memory is unknown", _advisor.start_prewarmer(
            lib, self.torch(total_memory=0), 0, events))
        os.environ["ALLOCD_PREWARM"] = "0"
        try:
            self.assertIn("ALLOCD_PREWARM=0", _advisor.start_prewarmer(
                lib, self.torch(), 0, events))
        finally:
            del os.environ["ALLOCD_PREWARM"]


class DeferredStreamTest(unittest.TestCase):
    """A learned run's stream, left off (StreamControl.defer), and what
    starts it where a pre-warmer needs it."""

    def setUp(self):
        # The deferred reader here stands for the tracker, started as it is.
        os.environ["ALLOCD_HISTORY_FIRST_S"] = "0"
        self.addCleanup(os.environ.pop, "ALLOCD_HISTORY_FIRST_S", None)

    def advisor(self, prewarmer):
        events = EventStream(FakeLib(), None)
        advisor = _advisor.Advisor(FakeLib(), None, FakeTorch(), 0, 1.0, "", events, prewarmer)
        reader = FakeReader([])
        advisor.stream.defer(reader, 1 << 40)
        return advisor, events, reader

    def prewarmer(self):
        return Prewarmer(FakeTorch(), 0, lambda size: PARKED, lambda size: MAPPED,
                         lambda: None, CAPACITY)

    def test_a_neighbours_reclaim_starts_it_where_pre_warms_need_it(self):
        advisor, events, reader = self.advisor(self.prewarmer())
        advisor.stream.round({"reclaims": 0}, {})
        self.assertTrue(events.deferred)
        self.assertFalse(reader.started)
        advisor.stream.round({"reclaims": 1}, {})
        self.assertIs(events.reader, reader)
        self.assertTrue(reader.started)
        self.assertIn("a neighbour reclaimed its cache", advisor.stream.started)

    def test_without_pre_warms_a_reclaim_leaves_it_off(self):
        advisor, events, reader = self.advisor("off (transparent mode only)")
        advisor.stream.round({"reclaims": 5}, {})
        self.assertTrue(events.deferred)
        self.assertIsNone(advisor.stream.started)
        advisor.stream.round({"reclaims": 5}, {"reserved_bytes.all.peak": (1 << 40) + 1})
        self.assertIs(events.reader, reader)
        self.assertIn("passed the 1099511627776", advisor.stream.started)


class FakeReader:
    def __init__(self, events):
        self.events = events
        self.started = False

    def start(self):
        self.started = True

    def read(self):
        ops, sizes, ids = zip(*self.events) if self.events else ((), (), ())
        self.events = []
        return (array.array("B", ops), array.array("Q", sizes), array.array("Q", ids),
                array.array("Q", [0] * len(ops)), 0)


class FakeLib:
    def __init__(self):
        self.recorded = []

    def allocd_record_events(self, client, ops, sizes, ids, streams, n, dropped):
        self.recorded.append(n)
        return 0


class MayReachTest(unittest.TestCase):
    def test_false_only_when_no_size_reaches_the_threshold(self):
        from allocd._event_stream import may_reach
        small = array.array("Q", [4096, 2 << 20, (1 << 32) - 1] * 1000)
        self.assertFalse(may_reach(small, 14 * GIB))
        self.assertFalse(may_reach(array.array("Q"), 1))
        for size in (14 * GIB, PEAK, (1 << 64) - 1):
            with_one = array.array("Q", small)
            with_one[1234] = size
            self.assertTrue(may_reach(with_one, 14 * GIB), size)
        # A prefilter: a size below the threshold with a high byte set may
        # pass (the exact check follows), one that reaches it always does.
        self.assertTrue(may_reach(array.array("Q", [1 << 32]), 14 * GIB))
        for threshold in (1, 255, 256, 1 << 20, (1 << 40) + 7):
            self.assertTrue(may_reach(array.array("Q", [0, threshold, 0]), threshold), threshold)
            self.assertFalse(may_reach(array.array("Q", [0] * 5), threshold))


class HiddenEventsTest(unittest.TestCase):
    def test_the_prewarms_alloc_and_frees_leave_the_stream_and_the_jobs_stay(self):
        events = [(0, 4096, 0x100), (0, PEAK, 0x7000), (1, PEAK, 0x7000), (2, PEAK, 0x7000),
                  (0, PEAK, 0x7000), (1, PEAK, 0x7000), (2, PEAK, 0x7000)]
        lib = FakeLib()
        stream = EventStream(lib, None, FakeReader(events))
        stream.watch_bytes = PEAK // 2
        stream.hide(0x7000)
        large = stream.send()
        self.assertEqual(lib.recorded, [4], "the job's 4 events, not the pre-warm's 3")
        self.assertEqual(stream.events_sent, 4)
        self.assertEqual(large, [(PEAK, 0)], "the batch's allocation, once")
        stream.reader.events = [(0, PEAK, 0x7000)]
        self.assertEqual(stream.send(), [(PEAK, 0)])
        self.assertEqual(lib.recorded, [4, 1])

    def test_what_the_reader_dropped_is_not_looked_for_in_the_next_round(self):
        lib = FakeLib()
        stream = EventStream(lib, None, FakeReader([(0, 4096, 0x100)]))
        stream.hide(0x7000)  # its events lost to the reader's ring
        stream.send()
        stream.reader.events = [(0, PEAK, 0x7000), (1, PEAK, 0x7000)]
        stream.send()
        self.assertEqual(lib.recorded, [1, 2], "the job's own allocation there is sent")


if __name__ == "__main__":
    unittest.main()
