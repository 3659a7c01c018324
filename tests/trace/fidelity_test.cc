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

INSTANTIATE_TEST_SUITE_P(GroundTruth, FidelityTest,
                         testing::ValuesIn(LoadRuns()), RunName);

}  // namespace
}  // namespace allocd
