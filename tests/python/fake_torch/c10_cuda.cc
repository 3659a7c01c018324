// The fake libc10_cuda.so: keeps the trackers attached and calls them for
// the events a test makes (fake_torch_emit), as PyTorch's allocator does
// for its own. As PyTorch's, it gives a tracker only to the device
// allocators that exist, none before CUDA's lazy initialisation
// (fake_torch_init, the fake torch.cuda.init).
#include <c10/cuda/CUDACachingAllocator.h>

#include <vector>

namespace c10::cuda::CUDACachingAllocator {
namespace {
std::vector<AllocatorTraceTracker>& Trackers() {
  static auto* trackers = new std::vector<AllocatorTraceTracker>;
  return *trackers;
}
bool initialized = false;
}  // namespace

void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) {
  if (initialized) Trackers().push_back(std::move(tracker));
}

}  // namespace c10::cuda::CUDACachingAllocator

using c10::cuda::CUDACachingAllocator::TraceEntry;

extern "C" void fake_torch_emit(int action, int device, uint64_t addr,
                                uint64_t size, uint64_t stream) {
  const TraceEntry entry{
      .action_ = static_cast<TraceEntry::Action>(action),
      .device_ = static_cast<c10::DeviceIndex>(device),
      .addr_ = addr,
      .stream_ = reinterpret_cast<cudaStream_t>(stream),
      .size_ = size};
  for (const auto& tracker : c10::cuda::CUDACachingAllocator::Trackers()) {
    tracker(entry);
  }
}

extern "C" void fake_torch_init() {
  c10::cuda::CUDACachingAllocator::initialized = true;
}

extern "C" size_t fake_torch_trackers() {
  return c10::cuda::CUDACachingAllocator::Trackers().size();
}
