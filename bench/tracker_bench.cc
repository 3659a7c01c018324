// What the allocation-stream tracker (client/python/allocd/_trace_tracker.cpp)
// adds to each of PyTorch's allocator events, on the CPU: the tracker as the
// package compiles it, against the model of PyTorch 2.11's allocator API in
// tests/python/fake_torch (its fake_torch_emit builds and hands out each
// event as PyTorch's record_trace does).
//
//   build/release/bench/tracker_bench   # a few seconds
//
// Each iteration is one allocation's three events (alloc, free_requested,
// free_completed); items_per_second counts events. In the order they run
// (PyTorch cannot detach a tracker, so no benchmark after the first is
// without one):
// - BM_NoTracker: PyTorch's path with no tracker attached, which builds
//   nothing (the native job).
// - BM_TrackerStopped: attached and stopped: PyTorch builds every event and
//   calls the tracker, which drops it at once (PyTorch's part alone).
// - BM_Tracking: attached and keeping the events, taken every 13,869
//   events (a T5-base fine-tune's step, batch 16, on the H200) on this
//   thread, as the advisor takes them on its own (PyTorch's part and the
//   tracker's).
// Here the caches stay warm from one event to the next; in a job, ~9 us of
// its own work runs between two events. The GPU measure of the same is
// bench/gpu/overhead.py's churn workload (modes native, attached, tracked).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

extern "C" {
void fake_torch_init();
void fake_torch_emit(int action, int device, uint64_t addr, uint64_t size, uint64_t stream);
int allocd_tracker_attach(int device, uint64_t capacity);
void allocd_tracker_stop();
uint64_t allocd_tracker_take(uint8_t* ops, uint64_t* sizes, uint64_t* ids, uint64_t* streams,
                             uint64_t max, uint64_t* dropped);
}

namespace {

// PyTorch's TraceEntry::Action values the tracker keeps.
constexpr int kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2;
constexpr uint64_t kEventsPerStep = 13'869;
constexpr uint64_t kCapacity = 1 << 20;  // allocd/_tracker.py's default

void EmitAllocations(benchmark::State& state, bool take) {
  std::vector<uint8_t> ops(kCapacity);
  std::vector<uint64_t> sizes(kCapacity), ids(kCapacity), streams(kCapacity);
  uint64_t address = 0x7f0000000000, since_take = 0;
  for (auto _ : state) {
    const uint64_t size = 512 << (address & 7);
    fake_torch_emit(kAlloc, 0, address, size, 0);
    fake_torch_emit(kFreeRequested, 0, address, size, 0);
    fake_torch_emit(kFreeCompleted, 0, address, size, 0);
    address += 512;
    if (take && (since_take += 3) >= kEventsPerStep) {
      uint64_t dropped = 0;
      benchmark::DoNotOptimize(allocd_tracker_take(ops.data(), sizes.data(), ids.data(),
                                                   streams.data(), kCapacity, &dropped));
      since_take = 0;
    }
  }
  state.SetItemsProcessed(3 * state.iterations());
}

void BM_NoTracker(benchmark::State& state) { EmitAllocations(state, false); }

void BM_TrackerStopped(benchmark::State& state) {
  fake_torch_init();
  if (allocd_tracker_attach(0, kCapacity) != 0) {
    state.SkipWithError("the tracker was refused");
    return;
  }
  allocd_tracker_stop();
  EmitAllocations(state, false);
}

void BM_Tracking(benchmark::State& state) {
  fake_torch_init();
  if (allocd_tracker_attach(0, kCapacity) != 0) {
    state.SkipWithError("the tracker was refused");
    return;
  }
  EmitAllocations(state, true);
  allocd_tracker_stop();
}

// Registered in the order they must run.
BENCHMARK(BM_NoTracker);
BENCHMARK(BM_TrackerStopped);
BENCHMARK(BM_Tracking);

}  // namespace

BENCHMARK_MAIN();
