"""A reclaim's partial give-back in transparent mode (allocd/_spares.py): the
SpareKeeper's calls of the interposer around PyTorch's empty_cache(), and
the advisor's allocator target, on stand-ins for torch, the interposer and
the client library (the daemon-side give-back: DaemonTest's
AReclaimGivesBackTheLargestFreedSegmentsAndKeepsTheRestMapped).
Environment: ALLOCD_PYTHON_DIR.
"""

import ctypes
import os
import sys
import types
import unittest

sys.path.insert(0, os.environ["ALLOCD_PYTHON_DIR"])
from allocd import _advisor  # noqa: E402
from allocd._spares import SpareKeeper, start_spare_keeper  # noqa: E402

GIB = 1 << 30


class FakeInterposer:
    """The interposer's spare functions for one device, with the calls in
    order; release gives back `given` bytes."""

    def __init__(self, given=60 * GIB):
        self.calls = []
        self.given = given

    def keeper(self):
        return SpareKeeper(lambda on: self.calls.append(("keep_freed", on)),
                           self.release, self.release_old, keep_s=30)

    def release(self, bytes_asked):
        self.calls.append(("release", bytes_asked))
        return self.given

    def release_old(self, keep_ms):
        self.calls.append(("release_old", keep_ms))
        return 0


class SpareKeeperTest(unittest.TestCase):
    def test_a_partial_release_keeps_what_empty_cache_frees_then_gives_the_ask(self):
        interposer = FakeInterposer()
        keeper = interposer.keeper()
        given = keeper.release_cached(lambda: interposer.calls.append(("empty_cache",)),
                                      41 * GIB)
        self.assertEqual(given, 60 * GIB)
        # The unmaps come after PyTorch's lock is let go.
        self.assertEqual(interposer.calls, [("keep_freed", 1), ("empty_cache",),
                                            ("keep_freed", 0), ("release", 41 * GIB)])
        self.assertEqual(keeper.stats(), {"partial_releases": 1, "full_releases": 0,
                                          "bytes_given": 60 * GIB, "keep_s": 30.0})

    def test_keeping_stops_even_when_empty_cache_raises(self):
        interposer = FakeInterposer()

        def failing():
            raise RuntimeError("CUDA error")
        with self.assertRaises(RuntimeError):
            interposer.keeper().release_cached(failing, GIB)
        self.assertEqual(interposer.calls, [("keep_freed", 1), ("keep_freed", 0)])

    def test_a_full_release_keeps_too_then_gives_every_spare_and_old_ones_go_after_keep(self):
        interposer = FakeInterposer(given=3 * GIB)
        keeper = interposer.keeper()
        self.assertEqual(keeper.release_cached(lambda: interposer.calls.append(("empty_cache",))),
                         3 * GIB)
        self.assertEqual(keeper.release_old(), 0)
        # Every spare goes (0), and only after PyTorch's lock is let go.
        self.assertEqual(interposer.calls, [("keep_freed", 1), ("empty_cache",),
                                            ("keep_freed", 0), ("release", 0),
                                            ("release_old", 30000)])
        self.assertEqual(keeper.stats(), {"partial_releases": 0, "full_releases": 1,
                                          "bytes_given": 3 * GIB, "keep_s": 30.0})

    def test_no_session_for_the_device_counts_as_nothing_given(self):
        interposer = FakeInterposer(given=-1)
        keeper = interposer.keeper()
        self.assertEqual(keeper.release_cached(lambda: None, GIB), 0)
        self.assertEqual(keeper.stats()["bytes_given"], 0)


class StartSpareKeeperTest(unittest.TestCase):
    def test_bound_to_the_device_where_the_interposer_has_the_functions(self):
        calls = []
        lib = types.SimpleNamespace(
            allocd_interpose_keep_freed=lambda d, on: calls.append(("keep", d, on)),
            allocd_interpose_release_spares=lambda d, n: calls.append(("release", d, n)) or 0,
            allocd_interpose_release_old_spares=lambda d, ms: calls.append(("old", d, ms)) or 0)
        keeper = start_spare_keeper(lib, 1)
        keeper.release_cached(lambda: None, GIB)
        keeper.release_old()
        self.assertEqual(calls, [("keep", 1, 1), ("keep", 1, 0), ("release", 1, GIB),
                                 ("old", 1, 30000)])

    def test_none_from_an_older_interposer(self):
        lib = types.SimpleNamespace(allocd_interpose_keep_freed=lambda d, on: 0)
        self.assertIsNone(start_spare_keeper(lib, 0))

    def test_none_when_turned_off(self):
        lib = types.SimpleNamespace(allocd_interpose_keep_freed=lambda d, on: 0,
                                    allocd_interpose_release_spares=lambda d, n: 0,
                                    allocd_interpose_release_old_spares=lambda d, ms: 0)
        self.assertIsNotNone(start_spare_keeper(lib, 0))
        os.environ["ALLOCD_PARTIAL_RECLAIM"] = "0"
        try:
            self.assertIsNone(start_spare_keeper(lib, 0))
        finally:
            del os.environ["ALLOCD_PARTIAL_RECLAIM"]


class FakeTorch:
    def __init__(self, calls):
        self.cuda = types.SimpleNamespace(
            empty_cache=lambda: calls.append(("empty_cache",)),
            memory_stats=lambda device: {})


class FakeClientLib:
    """allocd_poll calls the target's functions as a reclaim of `asked` bytes
    would (0: the daemon asks everything, empty_cache serves)."""

    def __init__(self):
        self.asked = None

    def allocd_poll(self, client, target_ref):
        target = target_ref._obj
        if self.asked:
            if target.release_cached:
                target.release_cached(self.asked, None)
            else:
                target.empty_cache(None)
        elif self.asked == 0:
            target.empty_cache(None)
        return 0

    def allocd_session_stats(self, client, buffer, size):
        text = b'{"configs_applied": 0}'
        ctypes.memmove(buffer, text + b"\0", len(text) + 1)
        return len(text)


class AdvisorTargetTest(unittest.TestCase):
    def advisor(self, lib, calls, spares):
        return _advisor.Advisor(lib, None, FakeTorch(calls), 0, 1.0, "", spares=spares)

    def test_a_reclaim_of_part_of_the_cache_is_a_partial_release(self):
        interposer, lib = FakeInterposer(), FakeClientLib()
        advisor = self.advisor(lib, interposer.calls, interposer.keeper())
        lib.asked = 41 * GIB
        advisor.step()
        self.assertEqual(interposer.calls, [
            ("keep_freed", 1), ("empty_cache",), ("keep_freed", 0), ("release", 41 * GIB),
            ("release_old", 30000)])
        self.assertEqual(advisor.stats()["spares"]["partial_releases"], 1)
        # Only PyTorch's empty_cache() held its allocator.
        self.assertEqual(advisor.holds.stats()["count"], {"empty_cache": 1})

    def test_a_reclaim_of_everything_unmaps_after_the_hold_too(self):
        # The daemon asks everything (0) where the asker's peak is not known;
        # a config applied empties the cache the same way.
        interposer, lib = FakeInterposer(), FakeClientLib()
        advisor = self.advisor(lib, interposer.calls, interposer.keeper())
        lib.asked = 0
        advisor.step()
        self.assertEqual(interposer.calls, [
            ("keep_freed", 1), ("empty_cache",), ("keep_freed", 0), ("release", 0),
            ("release_old", 30000)])
        self.assertEqual(advisor.stats()["spares"]["full_releases"], 1)
        self.assertEqual(advisor.holds.stats()["count"], {"empty_cache": 1})

    def test_without_spares_a_reclaim_empties_the_cache(self):
        calls, lib = [], FakeClientLib()
        advisor = self.advisor(lib, calls, None)
        lib.asked = 41 * GIB
        advisor.step()
        self.assertEqual(calls, [("empty_cache",)])
        self.assertIn("off", advisor.stats()["spares"])


if __name__ == "__main__":
    unittest.main()
