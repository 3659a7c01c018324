// Tuning cost: 120 candidate configs replayed on each shared trace, on one
// thread and on two; and a whole `Tune` as `allocd tune` runs it.
//   build/release/bench/tune_bench
// Read evaluations/s (items_per_second) and the 1-thread / 2-thread ratio.
#include <algorithm>
#include <string>

#include "bench/shipped_traces.h"
#include "benchmark/benchmark.h"
#include "tuner/evaluator.h"
#include "tuner/search_space.h"
#include "tuner/tuner.h"

namespace allocd {
namespace {

constexpr uint64_t kCapacity = 84465090560;     // free memory of an H100 80GB
constexpr uint64_t kTotalMemory = 85017493504;  // its total memory
constexpr size_t kCandidates = 120;

// kCandidates distinct points spread over the default grid.
std::vector<Candidate> SpreadCandidates(int64_t peak_allocated) {
  const SearchSpace space = DefaultSearchSpace();
  std::vector<Candidate> out;
  std::vector<std::string> keys;
  for (size_t i = 0; out.size() < kCandidates && i < space.GridSize(); i += 7) {
    size_t rest = i;
    SpacePoint p;
    for (int d = 0; d < kSpaceDimensions; ++d) {
      PointIndex(p, d) = rest % DimensionSize(space, d);
      rest /= DimensionSize(space, d);
    }
    Candidate c = MakeCandidate(space, p, peak_allocated, kTotalMemory);
    const std::string key = CandidateKey(c);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    out.push_back(std::move(c));
  }
  return out;
}

void BM_Evaluate(benchmark::State& state, const std::string& trace_name) {
  const Trace& trace = ShippedTrace(trace_name);
  const std::vector<Candidate> candidates = SpreadCandidates(4ll << 30);
  for (auto _ : state) {
    Evaluator evaluator(trace, EvaluatorOptions{kCapacity, kTotalMemory, false,
                                                static_cast<int>(state.range(0))});
    benchmark::DoNotOptimize(evaluator.Evaluate(candidates));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(candidates.size()));
  state.counters["candidates"] = static_cast<double>(candidates.size());
}

void BM_Tune(benchmark::State& state, const std::string& trace_name) {
  const Trace& trace = ShippedTrace(trace_name);
  TuneOptions options;
  options.capacity = kCapacity;
  options.total_memory = kTotalMemory;
  options.jobs = 2;
  size_t evaluations = 0;
  for (auto _ : state) {
    absl::StatusOr<TuneReport> report = Tune(trace, DefaultSearchSpace(), options);
    evaluations = report->evaluations;
  }
  state.counters["evaluations"] = static_cast<double>(evaluations);
}

BENCHMARK_CAPTURE(BM_Evaluate, llama_lora, "llama_lora")
    ->Arg(1)->Arg(2)->ArgName("jobs")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Evaluate, gpt2_full, "gpt2_full")
    ->Arg(1)->Arg(2)->ArgName("jobs")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Tune, llama_lora, "llama_lora")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Tune, gpt2_full, "gpt2_full")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace allocd

BENCHMARK_MAIN();
