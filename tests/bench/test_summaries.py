"""The GPU benchmarks' summaries, which CI can check without a GPU:
bench/gpu/summarize_packing.py's server runs over interleaved repeats
(packing.sh SERVER_REPEATS), on made-up results whose figures are known, and
a shipped record's tables made again from its JSON; overhead_toggle.py
--pool on a shipped record's cycles; pool_process_sets.py on made-up sets
and on a shipped record's.
"""

import contextlib
import gzip
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
import overhead  # noqa: E402
import overhead_job  # noqa: E402
import overhead_toggle  # noqa: E402
import pool_process_sets  # noqa: E402
import syscall_counts  # noqa: E402
import summarize_packing  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "gpu", "results", "packing")
RECORD = os.path.join(RESULTS, "run_1130h_server_repeats")
# The advisor-mode ResNet-50 runs that run_1202b_advisor_sets pooled with its
# own, as (record, folders): every later pool of advisor mode starts here.
ADVISOR_SETS_BEFORE_1202B = [("run_1201b_layouts", ("1_resnet_k3", "2_resnet_k3b")),
                             ("run_1201c_lookup", ("5_resnet",)),
                             ("run_1202_prewarm_unlocked", ("4_resnet50", "5_resnet50"))]


def server(latencies_ms):
    """A server's result as packing_job.py writes it, as far as the pooled
    tables read it: one request a second from the start."""
    return {"kind": "server", "index": 0,
            "requests_at": [[i, ms] for i, ms in enumerate(latencies_ms)],
            "latency_ms_p99": summarize_packing.percentile(latencies_ms, 99)}


def write_call(folder, runs):
    """`runs`: {file part ("server.2"...): latencies}, as packing.sh names a
    repeat's files."""
    os.makedirs(os.path.join(folder, "packing"))
    for part, latencies in runs.items():
        run = part.partition(".")[0]
        n = 1 if run == "server-alone" else 2
        mode = "transparent" if run == "server" else "native"
        jobs = [server(latencies)] + ([{"kind": "trainer", "index": 1}] if n == 2 else [])
        for job in jobs:
            path = os.path.join(folder, "packing", f"{part}-N{n}-{mode}-{job['index']}.json.gz")
            with gzip.open(path, "wt") as out:
                json.dump(job, out)


def printed(function, *args):
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        function(*args)
    return text.getvalue()


class SplitRepeatTest(unittest.TestCase):
    def test_the_first_repeat_has_no_suffix_and_later_ones_their_number(self):
        self.assertEqual(summarize_packing.split_repeat("server"), ("server", 1))
        self.assertEqual(summarize_packing.split_repeat("server-floor.3"), ("server-floor", 3))


class PooledRepeatsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # Call 1, two repeats; call 2, one. 100 requests a run, the slowest
        # two alike, so that a run's p99 is theirs whatever the rank's
        # rounding.
        self.calls = [os.path.join(self.dir.name, "1"), os.path.join(self.dir.name, "2")]
        write_call(self.calls[0], {
            "server": [1.0] * 98 + [2.2, 2.2], "server-alone": [1.0] * 98 + [2.0, 2.0],
            "server-floor": [1.0] * 98 + [1.1, 1.1],
            "server.2": [1.0] * 98 + [1.8, 1.8], "server-alone.2": [1.0] * 98 + [2.0, 2.0],
            "server-floor.2": [1.0] * 98 + [2.0, 2.0]})
        write_call(self.calls[1], {
            "server": [1.0] * 98 + [3.0, 3.0], "server-alone": [1.0] * 98 + [1.5, 1.5],
            "server-floor": [1.0] * 98 + [3.0, 3.0]})

    def tearDown(self):
        self.dir.cleanup()

    def rows(self, text):
        return [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]

    def test_each_repeat_is_compared_with_the_references_of_its_own_repeat(self):
        text = printed(summarize_packing.across, self.calls)
        by_reference = {row[1]: row for row in self.rows(text) if row[0] == "| transparent"}
        # Beside: 2.2, 1.8 (call 1), 3.0 (call 2); alone: 2.0, 2.0, 1.5.
        self.assertEqual(by_reference["alone"][6], "1.100, 0.900, 2.000 |")
        self.assertEqual(by_reference["alone"][3], "1.100x")
        self.assertEqual(by_reference["alone"][5], "1")  # 0.9 only
        # Floor: 1.1, 2.0, 3.0.
        self.assertEqual(by_reference["floor"][6], "2.000, 0.900, 1.000 |")

    def test_every_request_of_a_runs_repeats_is_pooled(self):
        text = printed(summarize_packing.across, self.calls)
        pooled = {row[0]: row for row in self.rows(text) if row[1] in ("transparent", "native")}
        beside = pooled["| beside a trainer"]
        self.assertEqual(beside[2], "300")
        # 300 requests: above 294 of 1.0 come 1.8, 1.8, 2.2, 2.2, 3.0,
        # 3.0; the p99 (the 297th or 298th smallest) is 2.2.
        self.assertEqual(beside[4], "2.20")
        # The alone runs' pooled p99: 2.0 (of 1.5, 1.5 and 2.0 four times).
        self.assertEqual(beside[5], "1.100x")
        self.assertEqual(pooled["| alone"][2], "300")


class RecordTest(unittest.TestCase):
    def test_the_shipped_records_tables_are_what_its_json_makes(self):
        for name in sorted(os.listdir(RECORD)):
            folder = os.path.join(RECORD, name)
            if not os.path.isdir(folder):
                continue
            with self.subTest(folder=name), open(os.path.join(folder, "packing.md")) as md:
                self.assertEqual(printed(summarize_packing.summary, folder), md.read())


class TogglePoolTest(unittest.TestCase):
    def test_a_runs_cycles_give_the_ratios_its_record_reports(self):
        # run_1130e_history_cpp's call 6, seq2seq: its README's table.
        text = printed(overhead_toggle.pool, [os.path.join(
            RESULTS, "run_1130e_history_cpp", "6_toggle", "toggle-seq2seq.json.gz")])
        self.assertIn("seq2seq advise over 90 cycles of 1 runs: 1.0170x, 95% 0.9946-1.0364", text)
        self.assertIn("seq2seq native-b over 90 cycles of 1 runs: 1.0175x, 95% 0.9731-1.0422",
                      text)
        self.assertIn("seq2seq advise/both over 90 cycles of 1 runs: 1.0091x, 95% 0.9847-1.0325",
                      text)
        self.assertIn("median step: native 141.52 ms, advise 140.90 ms, native-b 141.42 ms", text)

    def test_several_runs_pool_their_cycles(self):
        calls = [os.path.join(RESULTS, "run_1130i_toggle_generate", call, "toggle-generate.json.gz")
                 for call in ("call_1", "call_2")]
        self.assertIn("generate advise over 80 cycles of 2 runs:",
                      printed(overhead_toggle.pool, calls))

    def test_runs_of_different_workloads_are_refused(self):
        with self.assertRaises(SystemExit):
            overhead_toggle.pool([
                os.path.join(RESULTS, "run_1130e_history_cpp", "6_toggle", f"toggle-{w}.json.gz")
                for w in ("seq2seq", "resnet50")])




class JobThreadCountersTest(unittest.TestCase):
    def test_the_job_threads_faults_show_memory_it_touched_first(self):
        before = overhead_job.job_thread_counters([0])
        touched = bytearray(64 << 20)  # zeroed pages: the kernel faults them in
        after = overhead_job.job_thread_counters([0])
        counts = overhead_job.counters_between(before, after)
        del touched
        self.assertGreaterEqual(counts["minflt"], (64 << 20) // (2 << 20))
        self.assertLessEqual({"utime_ticks", "stime_ticks", "runqueue_wait_ns",
                              "nonvoluntary_ctxt_switches"}, set(counts))
        self.assertTrue(any(k.startswith("irq:") for k in counts))

    def test_counts_are_summed_over_turns_per_step(self):
        turns = [{"job_kernel_counts": {"minflt": 20}},
                 {"job_kernel_counts": {"minflt": 40, "irq:TLB": 3}},
                 {"job_kernel_counts": None}]
        self.assertEqual(overhead.per_step(turns, "job_kernel_counts", 30),
                         {"irq:TLB": 0.1, "minflt": 2.0})


STRACE_TABLE = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 55.35    0.004830           4      1000           newfstatat
 43.12    0.003763           3      1000        12 futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.008593           4      2000        12 total
"""


class SyscallCountsTest(unittest.TestCase):
    def test_the_calling_threads_calls_are_counted_while_the_block_runs(self):
        if shutil.which(os.environ.get("ALLOCD_STRACE", "strace")) is None:
            self.skipTest("no strace (scripts/install-deps installs it)")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "syscalls.txt")
            try:
                with overhead_job.syscalls_counted(path):
                    for _ in range(500):
                        os.getppid()
            except RuntimeError as refused:
                if "not permitted" in str(refused):
                    self.skipTest(f"this sandbox forbids ptrace: {refused}")
                raise
            os.getppid()  # after the block: not counted
            with open(path) as f:
                calls, seconds = syscall_counts.parse_table(f.read())["getppid"]
        self.assertEqual(calls, 500)
        self.assertGreater(seconds, 0)

    def test_each_modes_processes_are_pooled_per_step(self):
        with tempfile.TemporaryDirectory() as folder:
            for name, futexes in (("native", 10), ("paused-0", 30), ("paused-1", 50),
                                  ("native-b", 10)):
                with open(os.path.join(folder, f"syscalls-resnet50-{name}.txt"), "w") as f:
                    f.write(STRACE_TABLE.replace("1000        12 futex", f"{futexes}        12 futex"))
            paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
            modes = syscall_counts.per_step(paths, "resnet50", 10)
        self.assertEqual(sorted(modes), ["native", "native-b", "paused"])
        self.assertAlmostEqual(modes["paused"]["futex"][0], (30 + 50) / 2 / 10)
        self.assertAlmostEqual(modes["native"]["newfstatat"][1], 4830 / 10)
        table = syscall_counts.report(modes, top=5).splitlines()
        self.assertTrue(table[0].startswith("| syscall | native: "))
        self.assertEqual(table[-1].split("|")[1].strip(), "total")

    def test_a_table_without_its_total_row(self):
        self.assertEqual(syscall_counts.parse_table(STRACE_TABLE),
                         {"newfstatat": (1000, 0.004830), "futex": (1000, 0.003763)})


class PoolProcessSetsTest(unittest.TestCase):
    @staticmethod
    def result(by_process):
        """overhead.py's JSON for resnet50, as far as the pooling reads it."""
        return {"resnet50": {"summary": {m: {"by_process": ratios}
                                         for m, ratios in by_process.items()}}}

    def test_each_mode_is_pooled_over_every_set_that_ran_it(self):
        sets = (pool_process_sets.sets_of(self.result({"native-b": [0.99, 1.01],
                                                       "transparent": [1.02, 1.04]}), "resnet50")
                + pool_process_sets.sets_of(self.result({"native-b": [1.00, 1.00]}), "resnet50"))
        modes, _ = pool_process_sets.pool(sets)
        self.assertEqual(modes["native-b"]["n"], 4)
        self.assertAlmostEqual(modes["native-b"]["mean"], 1.0)
        self.assertEqual(modes["transparent"]["n"], 2)
        self.assertAlmostEqual(modes["transparent"]["mean"], 1.03)
        # sd 0.01 x sqrt(2) over 2 sets: half-width t(1) x sd / sqrt(2) = 12.706 x 0.01.
        low, high = modes["transparent"]["ci95"]
        self.assertAlmostEqual(high - 1.03, 12.706 * 0.01, places=4)
        self.assertAlmostEqual(1.03 - low, high - 1.03)

    def test_a_pair_is_differenced_within_each_set_that_ran_both(self):
        sets = pool_process_sets.sets_of(self.result({
            "a": [1.03, 1.00, 0.98], "b": [1.01, 0.98, 0.97]}), "resnet50")
        sets += pool_process_sets.sets_of(self.result({"a": [1.5, 1.6]}), "resnet50")
        _, pairs = pool_process_sets.pool(sets, [("a", "b")])
        pair = pairs[("a", "b")]
        self.assertEqual((pair["n"], pair["above"]), (3, 3))
        self.assertAlmostEqual(pair["mean"], (0.02 + 0.02 + 0.01) / 3)

    @staticmethod
    def record_runs(record, folders):
        """The runs of `record` in the folders whose names start with one of
        `folders`, in order."""
        record = os.path.join(RESULTS, record)
        return sorted(os.path.join(record, d, "overhead.json.gz") for d in os.listdir(record)
                      if d.startswith(folders) and os.path.isdir(os.path.join(record, d)))

    def assert_record_pools(self, record, table, workload, pairs, folders, earlier=(),
                            modes=""):
        """`table` in `record` is pool_process_sets' output for `workload`,
        `pairs` and `modes`, over the runs of `earlier` ((record, folders)
        each), then those in `record`'s folders whose names start with one
        of `folders`."""
        runs = [run for r, f in earlier for run in self.record_runs(r, f)]
        runs += self.record_runs(record, folders)
        self.assertTrue(runs)
        with open(os.path.join(RESULTS, record, table)) as md:
            expected = md.read()
        self.assertEqual(printed(pool_process_sets.main,
                                 ["--workload", workload, "--pairs", pairs, "--modes", modes]
                                 + runs), expected)

    def test_the_records_pooled_table_is_what_its_runs_make(self):
        self.assert_record_pools(
            "run_1201b_layouts", "pooled.md", "resnet50",
            "transparent-paused:preload-paused,transparent-paused:run-paused,"
            "transparent-paused:native-b,preload-paused:native-b,run-paused:native-b,"
            "loaded-first:native-b,native-padded:native-b,"
            "transparent-paused-padded:transparent-paused,"
            "transparent-paused-padded-after:transparent-paused",
            tuple("123458"))

    def test_the_learned_config_records_tables_are_what_its_runs_make(self):
        record = "run_1201c_lookup"
        after_the_fix = ("2_", "3_", "4_", "5_")
        self.assert_record_pools(
            record, "pooled_resnet50.md", "resnet50",
            "transparent-paused-lookup-here:transparent-paused,"
            "transparent-paused:run-paused,transparent-paused:native-b,run-paused:native-b,"
            "transparent-paused:preload-paused,preload-paused:native-b,paused:native-b",
            tuple(f + "resnet" for f in after_the_fix))
        for workload in ("seq2seq", "generate"):
            self.assert_record_pools(
                record, f"pooled_{workload}.md", workload,
                "transparent-paused:native-b,run-paused:native-b,transparent-paused:run-paused",
                tuple(f + workload for f in after_the_fix))
        self.assert_record_pools(
            record, "diagnosis.md", "resnet50",
            "transparent-paused:transparent-paused-nolookup,preload-paused-lookup:preload-paused,"
            "transparent-paused:preload-paused,loaded-first-lookup:native-b", ("1_diag_a",))

    def test_modes_left_out_leave_their_sets_and_pairs(self):
        sets = pool_process_sets.sets_of(self.result({
            "a": [1.03, 1.00], "b": [1.01, 0.98], "c": [1.2, 1.3]}), "resnet50")
        sets += pool_process_sets.sets_of(self.result({"c": [1.1, 1.4]}), "resnet50")
        kept = pool_process_sets.only(sets, ["a", "b"])
        self.assertEqual(len(kept), 2)
        modes, pairs = pool_process_sets.pool(kept, [("a", "b"), ("c", "b")])
        self.assertEqual(sorted(modes), ["a", "b"])
        self.assertEqual(list(pairs), [("a", "b")])
        self.assertEqual(pool_process_sets.only(sets, []), sets)

    def test_the_unlocked_prewarm_records_tables_pool_both_records(self):
        record = "run_1202_prewarm_unlocked"
        after_the_fix = ("2_", "3_", "4_", "5_")
        pairs = "transparent-paused:native-b,run-paused:native-b,transparent-paused:run-paused"
        for workload in ("seq2seq", "generate"):
            self.assert_record_pools(
                record, f"pooled_{workload}.md", workload, pairs,
                tuple(f"{n}_{workload}" for n in "345"),
                earlier=[("run_1201c_lookup", tuple(f + workload for f in after_the_fix))])
        self.assert_record_pools(
            record, "pooled_resnet50.md", "resnet50",
            pairs + ",paused:native-b,paused:transparent-paused", ("4_resnet50", "5_resnet50"),
            earlier=[("run_1201c_lookup", tuple(f + "resnet" for f in after_the_fix))],
            modes="native-b,transparent-paused,run-paused,paused")
        self.assert_record_pools(
            record, "pooled_advisor.md", "resnet50", "paused:native-b",
            ("4_resnet50", "5_resnet50"),
            earlier=[("run_1201b_layouts", ("1_resnet_k3", "2_resnet_k3b")),
                     ("run_1201c_lookup", ("5_resnet",))],
            modes="native-b,paused")

    def test_the_advisor_records_tables_pool_it_alone_and_with_the_earlier_ones(self):
        record = "run_1202b_advisor_sets"
        self.assert_record_pools(record, "pooled_resnet50.md", "resnet50", "paused:native-b",
                                 ("1_resnet50",), modes="native-b,paused")
        self.assert_record_pools(
            record, "pooled_advisor.md", "resnet50", "paused:native-b", ("1_resnet50",),
            earlier=ADVISOR_SETS_BEFORE_1202B, modes="native-b,paused")
        for workload in ("seq2seq", "generate"):
            self.assert_record_pools(record, f"pooled_{workload}.md", workload,
                                     "paused:native-b", (f"2_{workload}",),
                                     modes="native-b,paused")

    def test_the_advisor_parts_records_tables_pool_each_group(self):
        record = "run_1202d_advisor_parts"
        self.assert_record_pools(
            record, "pooled_parts.md", "resnet50",
            "paused:native-b,paused-nohook:native-b,paused-norounds:native-b,"
            "paused-quiet:native-b,paused-quiet:paused", ("1_parts",),
            modes="native-b,paused,paused-nohook,paused-norounds,paused-quiet")
        self.assert_record_pools(record, "pooled_resnet50.md", "resnet50", "paused:native-b",
                                 ("2_resnet50",), modes="native-b,paused")
        self.assert_record_pools(
            record, "pooled_advisor.md", "resnet50", "paused:native-b", ("2_resnet50",),
            earlier=ADVISOR_SETS_BEFORE_1202B + [("run_1202b_advisor_sets", ("1_resnet50",))],
            modes="native-b,paused")

    def test_the_advisor_gil_records_tables_pool_each_group_and_both(self):
        record = "run_1202e_advisor_gil"
        self.assert_record_pools(
            record, "pooled_quiet.md", "resnet50",
            "paused:native-b,paused-quiet:native-b,paused:paused-quiet", ("1_quiet",),
            modes="native-b,paused,paused-quiet")
        self.assert_record_pools(record, "pooled_resnet50.md", "resnet50", "paused:native-b",
                                 ("2_resnet50",), modes="native-b,paused")
        self.assert_record_pools(record, "pooled_advisor.md", "resnet50", "paused:native-b",
                                 ("1_quiet", "2_resnet50"), modes="native-b,paused")

    def test_the_job_thread_records_tables_pool_each_group(self):
        record = "run_1202c_job_thread"
        self.assert_record_pools(record, "pooled_before.md", "resnet50",
                                 "paused:native-b,loaded:native-b,paused:loaded", ("1_before",),
                                 modes="native-b,paused,loaded")
        self.assert_record_pools(record, "pooled_after.md", "resnet50", "paused:native-b",
                                 ("2_after",), modes="native-b,paused")

    def test_results_without_process_sets_are_refused(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "overhead.json")
            with open(path, "w") as f:
                json.dump({"resnet50": {"summary": {"advise": {"host": {}}}}}, f)
            with self.assertRaises(SystemExit):
                pool_process_sets.main(["--workload", "resnet50", path])


if __name__ == "__main__":
    unittest.main()
