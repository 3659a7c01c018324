// Replay throughput: trace events per second through the engine, on the
// shipped real traces, one core.
//   build/release/bench/replay_bench
#include <string>

#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "bench/shipped_traces.h"
#include "benchmark/benchmark.h"

namespace allocd {
namespace {

void BM_Replay(benchmark::State& state, const std::string& trace_name,
               const std::string& conf) {
  const Trace& trace = ShippedTrace(trace_name);
  const AllocatorConfig config = *ParseAllocatorConfig(conf);
  ReplayOptions options;
  options.capacity = 84465090560;
  for (auto _ : state) {
    absl::StatusOr<ReplayResult> r = Replay(trace, config, options);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() *
                          static_cast<int64_t>(trace.events.size()));
}

BENCHMARK_CAPTURE(BM_Replay, llama_lora_default, "llama_lora", "")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, llama_lora_expandable, "llama_lora",
                  "expandable_segments:True")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, llama_lora_max_split_128, "llama_lora",
                  "max_split_size_mb:128")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, gpt2_full_default, "gpt2_full", "")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, gpt2_full_max_split_128, "gpt2_full",
                  "max_split_size_mb:128")
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace allocd

BENCHMARK_MAIN();
