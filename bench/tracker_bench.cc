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
// - BM_TrackingTakenElsewhere: the same, taken by another thread every
//   500 us (about as many events a take as the advisor's rounds take from a
//   seq2seq job). When a take copied its events out under the tracker's
//   lock, the allocating thread waited for it: 61-79 ns an allocation
//   (median 70) against 50-54 taken on the same thread; swapping buffers
//   under the lock instead, 52-61 (median 53) (six interleaved runs of the
//   two builds, 2026-11-30, 2-core build machine).
// The spin lock and packed events that replaced a std::mutex and four
// arrays (2026-11-30) changed nothing here: BM_Tracking 51.6-52.5 ns an
// allocation before, 52.2-60.7 after, three interleaved runs. On the GPU
// host they halved the tracker's share of a seq2seq worker's CPU (its
// mutex's unlock had been the largest part of it).
// Here the caches stay warm from one event to the next; in a job, ~9 us of
// its own work runs between two events. The GPU measure of the same is
// bench/gpu/overhead.py's churn workload (modes native, attached, tracked).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
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

// Columns to take events into, as the advisor's reader has them.
struct Columns {
  std::vector<uint8_t> ops = std::vector<uint8_t>(kCapacity);
  std::vector<uint64_t> sizes = std::vector<uint64_t>(kCapacity),
                        ids = std::vector<uint64_t>(kCapacity),
                        streams = std::vector<uint64_t>(kCapacity);
  uint64_t Take() {
    uint64_t dropped = 0;
    return allocd_tracker_take(ops.data(), sizes.data(), ids.data(), streams.data(), kCapacity,
                               &dropped);
  }
};

void EmitAllocations(benchmark::State& state, bool take) {
  Columns columns;
  uint64_t address = 0x7f0000000000, since_take = 0;
  for (auto _ : state) {
    const uint64_t size = 512 << (address & 7);
    fake_torch_emit(kAlloc, 0, address, size, 0);
    fake_torch_emit(kFreeRequested, 0, address, size, 0);
    fake_torch_emit(kFreeCompleted, 0, address, size, 0);
    address += 512;
    if (take && (since_take += 3) >= kEventsPerStep) {
      benchmark::DoNotOptimize(columns.Take());
      since_take = 0;
    }
  }
  state.SetItemsProcessed(3 * state.iterations());
}

// Attaches the tracker (keeping device 0's events), as CUDA's initialisation
// lets it; false, with the benchmark skipped, where it is refused.
bool Attach(benchmark::State& state) {
  fake_torch_init();
  if (allocd_tracker_attach(0, kCapacity) == 0) return true;
  state.SkipWithError("the tracker was refused");
  return false;
}

void BM_NoTracker(benchmark::State& state) { EmitAllocations(state, false); }

void BM_TrackerStopped(benchmark::State& state) {
  if (!Attach(state)) return;
  allocd_tracker_stop();
  EmitAllocations(state, false);
}

void BM_Tracking(benchmark::State& state) {
  if (!Attach(state)) return;
  EmitAllocations(state, true);
  allocd_tracker_stop();
}

void BM_TrackingTakenElsewhere(benchmark::State& state) {
  if (!Attach(state)) return;
  std::atomic<bool> done{false};
  uint64_t taken = 0, takes = 0;
  std::thread taker([&] {
    Columns columns;
    while (!done.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      taken += columns.Take();
      ++takes;
    }
    taken += columns.Take();
  });
  EmitAllocations(state, false);
  done = true;
  taker.join();
  allocd_tracker_stop();
  state.counters["events_per_take"] = takes == 0 ? 0.0 : static_cast<double>(taken) / takes;
}

// Registered in the order they must run.
BENCHMARK(BM_NoTracker);
BENCHMARK(BM_TrackerStopped);
BENCHMARK(BM_Tracking);
BENCHMARK(BM_TrackingTakenElsewhere);

}  // namespace

BENCHMARK_MAIN();
