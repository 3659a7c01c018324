// The fake libc10_cuda.so: keeps the trackers attached and calls them for
// the events a test makes (fake_torch_emit), as PyTorch's allocator does
// for its own. As PyTorch's, it gives a tracker only to the device
// allocators that exist, none before CUDA's lazy initialisation
// (fake_torch_init, the fake torch.cuda.init). Its snapshot is the
// segments a test adds (fake_torch_add_segment, fake_torch_add_block), or an
// exception where a test makes it fail, as a pluggable allocator's does.
#include <c10/cuda/CUDACachingAllocator.h>

#include <chrono>
#include <stdexcept>
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

class FakeAllocator : public CUDAAllocator {
 public:
  SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    if (fails) throw std::runtime_error("snapshot is not supported by this allocator");
    whole = mempool_id == MempoolId_t{0, 0};
    with_traces = include_traces;
    return SnapshotInfo{segments, {}};
  }
  std::vector<SegmentInfo> segments;
  bool fails = false;
  bool whole = false, with_traces = true;  // the last snapshot's asks
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
  const auto& trackers = c10::cuda::CUDACachingAllocator::Trackers();
  if (trackers.empty()) return;
  std::string compile_string = "N/A";
  const TraceEntry entry(static_cast<TraceEntry::Action>(action),
                         static_cast<c10::DeviceIndex>(device), addr, size,
                         reinterpret_cast<cudaStream_t>(stream), {0, 0},
                         ApproximateTime(), nullptr, compile_string);
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
