// The fake libc10_cuda.so: keeps the trackers attached and calls them for
// the events a test makes (fake_torch_emit), as PyTorch's allocator does
// for its own. As PyTorch's, it gives a tracker only to the device
// allocators that exist, none before CUDA's lazy initialisation
// (fake_torch_init, the fake torch.cuda.init). Its snapshot is the
// segments a test adds (fake_torch_add_segment, fake_torch_add_block), or an
// exception where a test makes it fail, as a pluggable allocator's does,
// with the history's ring where it records (recordHistory), which
// fake_torch_emit fills as PyTorch's record_trace does, and counts every
// event in getDeviceStats' counters.
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace c10::cuda::CUDACachingAllocator {
namespace {
std::vector<AllocatorTraceTracker>& Trackers() {
  static auto* trackers = new std::vector<AllocatorTraceTracker>;
  return *trackers;
}
bool initialized = false;

constexpr int kDevices = 2;

const char* ActionName(TraceEntry::Action action) {
  static const char* const names[] = {"alloc",         "free_requested", "free_completed",
                                      "segment_alloc", "segment_free",   "segment_map",
                                      "segment_unmap", "snapshot",       "oom"};
  return names[action];
}

class FakeAllocator : public CUDAAllocator {
 public:
  SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    if (fails) throw std::runtime_error("snapshot is not supported by this allocator");
    snapshot_began_s = MonotonicSeconds();
    std::this_thread::sleep_for(std::chrono::microseconds(snapshot_sleep_us));
    snapshot_ended_s = MonotonicSeconds();
    whole = mempool_id == MempoolId_t{0, 0};
    with_traces = include_traces;
    SnapshotInfo info{segments, {}};
    if (include_traces) {
      info.device_traces.resize(kDevices);
      for (const auto& entry : ring) info.device_traces[entry.device_].push_back(entry);
    }
    return info;
  }
  DeviceStats getDeviceStats(DeviceIndex device) override {
    if (device < 0 || device >= kDevices) throw std::runtime_error("invalid device");
    return stats[device];
  }
  // As PyTorch 2.11's DeviceCachingAllocator::recordHistory.
  void recordHistory(bool enabled, CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    if (when != RecordContext::NEVER && context_recorder == nullptr) {
      throw std::runtime_error("a context to record needs a recorder");
    }
    for (const auto& action : skip_actions) {
      if (!known_actions.count(action)) throw std::runtime_error("unknown action " + action);
    }
    recording = enabled;
    recorder = enabled ? context_recorder : nullptr;
    record_context = enabled ? when : RecordContext::NEVER;
    max_entries = std::max<size_t>(1, alloc_trace_max_entries);
    skipped = std::set<std::string>(skip_actions.begin(), skip_actions.end());
    if (!enabled || clearHistory) ring.clear();
    ++arms;
  }
  // record_trace's part for the history: an entry where it records.
  void Record(const TraceEntry& entry) {
    if (!recording || skipped.count(ActionName(entry.action_))) return;
    TraceEntry kept = entry;
    if (record_context >= RecordContext::ALLOC && recorder != nullptr) kept.context_ = recorder();
    if (ring.size() == max_entries) ring.erase(ring.begin());  // the oldest is overwritten
    ring.push_back(std::move(kept));
  }
  void Count(const TraceEntry& entry) {
    auto& device = stats[entry.device_];
    if (entry.action_ == TraceEntry::ALLOC) ++device.allocation[0].allocated;
    if (entry.action_ == TraceEntry::FREE_REQUESTED) ++device.allocation[0].freed;
    if (entry.action_ == TraceEntry::FREE_COMPLETED) ++device.active[0].freed;
  }

  static double MonotonicSeconds() {  // Python's time.monotonic()
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
  }

  std::vector<SegmentInfo> segments;
  bool fails = false;
  int snapshot_sleep_us = 0;  // how long a snapshot takes
  double snapshot_began_s = 0, snapshot_ended_s = 0;  // the last one's
  bool whole = false, with_traces = true;  // the last snapshot's asks
  std::array<DeviceStats, kDevices> stats{};
  bool recording = false;
  CreateContextFn recorder = nullptr;
  RecordContext record_context = RecordContext::NEVER;
  size_t max_entries = 1;
  std::set<std::string> skipped, known_actions{"segment_alloc", "segment_free", "snapshot"};
  std::vector<TraceEntry> ring;
  int arms = 0;
};

FakeAllocator& Allocator() {
  static auto* allocator = new FakeAllocator;
  return *allocator;
}
}  // namespace

void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  if (initialized) Trackers().push_back(std::move(tracker));
}

CUDAAllocator* get() { return &Allocator(); }

}  // namespace c10::cuda::CUDACachingAllocator

using c10::cuda::CUDACachingAllocator::TraceEntry;

namespace {
// c10::getApproximateTime: the cycle counter where there is one.
uint64_t ApproximateTime() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}
}  // namespace

// As PyTorch 2.11's record_trace (c10/cuda/CUDACachingAllocator.cpp): nothing
// without a tracker; else an entry built with the time and a compile
// context, and every tracker called with it.
extern "C" void fake_torch_emit(int action, int device, uint64_t addr,
                                uint64_t size, uint64_t stream) {
  auto& allocator = c10::cuda::CUDACachingAllocator::Allocator();
  const auto& trackers = c10::cuda::CUDACachingAllocator::Trackers();
  std::string compile_string = "N/A";
  const TraceEntry entry(static_cast<TraceEntry::Action>(action),
                         static_cast<c10::DeviceIndex>(device), addr, size,
                         reinterpret_cast<cudaStream_t>(stream), {0, 0},
                         ApproximateTime(), nullptr, compile_string);
  allocator.Count(entry);
  allocator.Record(entry);
  for (const auto& tracker : trackers) tracker(entry);
}

// `n` allocations of 512 bytes at first_addr, first_addr + 512, ..., each
// alloc, free_requested and free_completed in turn: a job's allocating
// thread, for tests that take events from another thread meanwhile.
extern "C" void fake_torch_emit_allocations(int device, uint64_t first_addr, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t addr = first_addr + 512 * i;
    for (int action : {0, 1, 2}) fake_torch_emit(action, device, addr, 512, 0);
  }
}

extern "C" void fake_torch_init() {
  c10::cuda::CUDACachingAllocator::initialized = true;
}

extern "C" size_t fake_torch_trackers() {
  return c10::cuda::CUDACachingAllocator::Trackers().size();
}

using c10::cuda::CUDACachingAllocator::Allocator;

extern "C" void fake_torch_add_segment(int device, uint64_t address, uint64_t size,
                                       uint64_t stream, bool is_large, bool is_expandable) {
  c10::cuda::CUDACachingAllocator::SegmentInfo segment;
  segment.device = static_cast<c10::DeviceIndex>(device);
  segment.address = address;
  segment.total_size = size;
  segment.stream = reinterpret_cast<cudaStream_t>(stream);
  segment.is_large = is_large;
  segment.is_expandable = is_expandable;
  Allocator().segments.push_back(segment);
}

// A block of the segment added last, after its blocks so far.
extern "C" void fake_torch_add_block(uint64_t size, uint64_t requested, bool allocated,
                                     bool active) {
  c10::cuda::CUDACachingAllocator::BlockInfo block;
  block.size = size;
  block.requested_size = requested;
  block.allocated = allocated;
  block.active = active;
  Allocator().segments.back().blocks.push_back(block);
}

extern "C" void fake_torch_clear_segments() { Allocator().segments.clear(); }

extern "C" void fake_torch_snapshot_fails(bool fails) { Allocator().fails = fails; }

// Whether the last snapshot asked for every pool's segments without traces.
extern "C" bool fake_torch_last_snapshot_whole_without_traces() {
  return Allocator().whole && !Allocator().with_traces;
}

namespace {
std::shared_ptr<c10::GatheredContext> StackFrames() {
  return std::make_shared<c10::GatheredContext>();
}
}  // namespace

// The job arms the history itself, with PyTorch's defaults (stack frames
// for every event; _record_memory_history()).
extern "C" void fake_torch_job_records_history() {
  Allocator().recordHistory(true, &StackFrames, 100000,
                            c10::cuda::CUDACachingAllocator::RecordContext::ALL, false, {});
}

// The history as the last recordHistory left it: recording, whether it
// records stack frames, its ring's bound, the actions it skips (a comma
// after each), entries in the ring, and how many times it was armed.
extern "C" void fake_torch_history(bool* recording, bool* frames, uint64_t* max_entries,
                                   char* skipped, uint64_t skipped_size, uint64_t* entries,
                                   int* arms) {
  const auto& allocator = Allocator();
  *recording = allocator.recording;
  *frames = allocator.record_context != c10::cuda::CUDACachingAllocator::RecordContext::NEVER;
  *max_entries = allocator.max_entries;
  std::string names;
  for (const auto& name : allocator.skipped) names += name + ",";
  snprintf(skipped, skipped_size, "%s", names.c_str());
  *entries = allocator.ring.size();
  *arms = allocator.arms;
}

// Each snapshot from now on takes `us` microseconds; when the last one began
// and ended, on time.monotonic()'s clock.
extern "C" void fake_torch_snapshot_takes_us(int us) { Allocator().snapshot_sleep_us = us; }
extern "C" void fake_torch_last_snapshot_window(double* began, double* ended) {
  *began = Allocator().snapshot_began_s;
  *ended = Allocator().snapshot_ended_s;
}
