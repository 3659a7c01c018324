// Replays every real run in traces/ground_truth.json (PyTorch 2.11 on an
// H100, each config a separate process) and requires PyTorch's own numbers.
//
// Tolerances (issue #3): PyTorch breaks best-fit ties between equal-size
// free blocks by the address the CUDA driver gave each segment, which a
// replay can only model, so non-expandable runs must match peak reserved
// within the larger of 2 MiB and 0.1% and device allocs within 1%;
// expandable runs, and gpt2_full under max_split_size_mb:128 (which ran into
// the device's free memory, shrunk by the CUDA context as kernels load),
// within 1%; backend:cudaMallocAsync (the driver's pool) within 5%.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trace/recorded_address_backend.h"

namespace allocd {
namespace {

const std::string kTraceDir = std::string(ALLOCD_SOURCE_DIR) + "/traces/";

struct GroundTruthRun {
  std::string workload;
  std::string trace_file;
  nlohmann::json run;
  uint64_t free_at_start;
  uint64_t total_memory;
};

std::vector<GroundTruthRun> LoadRuns() {
  std::ifstream in(kTraceDir + "ground_truth.json");
  const nlohmann::json truth = nlohmann::json::parse(in);
  std::vector<GroundTruthRun> runs;
  for (const auto& [name, workload] : truth["workloads"].items()) {
    for (const auto& run : workload["runs"]) {
      runs.push_back({name, workload["trace"], run,
                      truth["device"]["free_at_start"],
                      truth["device"]["total_memory"]});
    }
  }
  return runs;
}

const Trace& CachedTrace(const std::string& file) {
  static auto* traces = new std::map<std::string, Trace>();
  auto it = traces->find(file);
  if (it == traces->end()) {
    absl::StatusOr<Trace> trace = ReadSnapshotFile(kTraceDir + file);
    EXPECT_TRUE(trace.ok()) << trace.status();
    it = traces->emplace(file, trace.ok() ? *std::move(trace) : Trace{}).first;
  }
  return it->second;
}

std::string RunName(const testing::TestParamInfo<GroundTruthRun>& info) {
  std::string name = info.param.workload + "_" +
                     (info.param.run["conf"].get<std::string>().empty()
                          ? "default"
                          : info.param.run["conf"].get<std::string>());
  if (info.param.run.contains("memory_fraction")) {
    name += "_fraction" + info.param.run["memory_fraction"].dump();
  }
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class FidelityTest : public testing::TestWithParam<GroundTruthRun> {};

TEST_P(FidelityTest, MatchesPyTorch) {
  const GroundTruthRun& p = GetParam();
  const std::string conf = p.run["conf"];
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(conf);

  if (p.run.contains("error")) {
    // PyTorch rejected this config; so must we, with its words.
    ASSERT_FALSE(config.ok()) << conf;
    std::string expected = p.run["error"];
    expected = expected.substr(expected.find(": ") + 2);
    EXPECT_THAT(std::string(config.status().message()),
                testing::HasSubstr(expected));
    return;
  }
  ASSERT_TRUE(config.ok()) << config.status();

  ReplayOptions options;
  options.capacity = p.free_at_start;
  if (p.run.contains("memory_fraction")) {
    options.capacity = p.total_memory;
    options.total_memory = p.total_memory;
    options.memory_fraction = p.run["memory_fraction"].get<double>();
  }
  const absl::StatusOr<ReplayResult> r =
      Replay(CachedTrace(p.trace_file), *config, options);
  ASSERT_TRUE(r.ok()) << r.status();

  const double want_peak = p.run["peak_reserved"];
  const int64_t want_allocs = p.run["num_device_alloc"];
  const bool ran_into_device_limit = want_peak > 0.99 * p.free_at_start;
  double tolerance = std::max(2.0 * (1 << 20), 0.001 * want_peak);
  if (config->backend == AllocatorBackend::kCudaMallocAsync) {
    tolerance = 0.05 * want_peak;
    EXPECT_TRUE(r->estimated);
  } else if (config->expandable_segments || ran_into_device_limit) {
    tolerance = 0.01 * want_peak;
  }
  EXPECT_NEAR(static_cast<double>(r->peak_reserved), want_peak, tolerance)
      << "peak reserved off by "
      << 100.0 * (static_cast<double>(r->peak_reserved) - want_peak) / want_peak
      << "%";
  EXPECT_NEAR(static_cast<double>(r->num_device_alloc),
              static_cast<double>(want_allocs),
              std::max(0.01 * static_cast<double>(want_allocs), 0.0));
  if (config->backend == AllocatorBackend::kNative) {
    // Allocated memory depends on which blocks were split, so also on ties.
    EXPECT_NEAR(static_cast<double>(r->peak_allocated),
                p.run["peak_allocated"].get<double>(),
                0.001 * p.run["peak_allocated"].get<double>());
  }
  EXPECT_EQ(r->num_alloc_retries, p.run["num_alloc_retries"].get<int64_t>());
  EXPECT_EQ(r->num_ooms, p.run["num_ooms"].get<int64_t>());
  EXPECT_EQ(r->num_sync_all_streams,
            p.run["num_sync_all_streams"].get<int64_t>());
}

// Where the tolerances above come from, and that nothing else hides behind
// them. PyTorch breaks best-fit ties by address, and the one device
// allocation the replay misses on llama_lora's default run is a 2 MiB
// small-pool segment that the driver's addresses decide (first at event
// 6047: at the real addresses no small segment has 256 KiB free, at the
// simulated ones one has). The addresses vary from run to run: two real runs
// of one effective config, max_split_size_mb:128 with and without
// garbage_collection_threshold:0.8 (inert without a fraction), made 338 and
// 339 device allocations. Only the recorded run's addresses are known, so
// the runs replayed at them must match PyTorch exactly, with no tolerance:
// the recorded run itself, and the runs under a memory fraction, whose small
// pool (no roundup divisions, no expandable segments) asks for the same
// segments in the same order. Those are where garbage_collection_threshold
// frees cached blocks by age and the retry path flushes the cache (issue
// #15: the GC path's rules and age counter are PyTorch's; a drift there
// fails here).
std::vector<GroundTruthRun> RunsWithTheRecordedSmallPool() {
  std::vector<GroundTruthRun> runs;
  for (const GroundTruthRun& run : LoadRuns()) {
    if (run.run.contains("error")) continue;
    absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(run.run["conf"].get<std::string>());
    const bool recorded_config = run.run["conf"].get<std::string>().empty() &&
                                 !run.run.contains("memory_fraction");
    if (!recorded_config && !run.run.contains("memory_fraction")) continue;
    if (!config.ok() || config->backend != AllocatorBackend::kNative ||
        config->expandable_segments ||
        std::any_of(config->roundup_power2_divisions.begin(),
                    config->roundup_power2_divisions.end(),
                    [](size_t d) { return d > 1; })) {
      continue;
    }
    runs.push_back(run);
  }
  return runs;
}

class ExactFidelityTest : public testing::TestWithParam<GroundTruthRun> {};

TEST_P(ExactFidelityTest, MatchesPyTorchExactlyAtTheDriversAddresses) {
  const GroundTruthRun& p = GetParam();
  const Trace& trace = CachedTrace(p.trace_file);
  ASSERT_EQ(trace.recorded_config, "");  // the shipped traces ran the defaults
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(p.run["conf"].get<std::string>());
  ASSERT_TRUE(config.ok()) << config.status();
  ReplayOptions options;
  size_t capacity = p.free_at_start;
  if (p.run.contains("memory_fraction")) {
    capacity = p.total_memory;
    options.memory_fraction = p.run["memory_fraction"].get<double>();
  }
  // The small pool's segments at the recorded run's addresses.
  RecordedAddressBackend backend(trace, capacity, p.total_memory, size_t{2} << 20);
  options.device = &backend;
  const absl::StatusOr<ReplayResult> r = Replay(trace, *config, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peak_reserved, p.run["peak_reserved"].get<int64_t>());
  EXPECT_EQ(r->peak_allocated, p.run["peak_allocated"].get<int64_t>());
  EXPECT_EQ(r->num_device_alloc, p.run["num_device_alloc"].get<int64_t>());
  EXPECT_EQ(r->num_device_free, p.run["num_device_free"].get<int64_t>());
  EXPECT_EQ(r->num_alloc_retries, p.run["num_alloc_retries"].get<int64_t>());
  EXPECT_EQ(r->num_ooms, p.run["num_ooms"].get<int64_t>());
  EXPECT_EQ(r->num_sync_all_streams, p.run["num_sync_all_streams"].get<int64_t>());
}

// The recorded run replayed at every one of its segments' addresses: each
// segment the replay asks for is the next one the run made, of that size.
TEST(ExactFidelityTest, TheRecordedRunsAtAllTheirAddresses) {
  for (const GroundTruthRun& p : LoadRuns()) {
    if (!p.run["conf"].get<std::string>().empty() || p.run.contains("memory_fraction")) continue;
    const Trace& trace = CachedTrace(p.trace_file);
    RecordedAddressBackend backend(trace, p.free_at_start, p.total_memory);
    ReplayOptions options;
    options.device = &backend;
    const absl::StatusOr<ReplayResult> r = Replay(trace, AllocatorConfig{}, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(backend.unmatched(), 0u) << p.workload;
    EXPECT_EQ(r->num_device_alloc, static_cast<int64_t>(trace.recorded_segments.size()));
    EXPECT_EQ(r->num_device_alloc, p.run["num_device_alloc"].get<int64_t>()) << p.workload;
    EXPECT_EQ(r->peak_reserved, p.run["peak_reserved"].get<int64_t>()) << p.workload;
    EXPECT_EQ(r->peak_allocated, p.run["peak_allocated"].get<int64_t>()) << p.workload;
  }
}

INSTANTIATE_TEST_SUITE_P(GroundTruth, ExactFidelityTest,
                         testing::ValuesIn(RunsWithTheRecordedSmallPool()), RunName);

INSTANTIATE_TEST_SUITE_P(GroundTruth, FidelityTest,
                         testing::ValuesIn(LoadRuns()), RunName);

}  // namespace
}  // namespace allocd
