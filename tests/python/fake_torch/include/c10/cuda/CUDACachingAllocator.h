// A model of the part of PyTorch 2.11's c10/cuda/CUDACachingAllocator.h that
// allocd/_trace_tracker.cpp uses: TraceEntry's fields and actions as
// PyTorch's own trackers read them (ProcessGroupNCCL's
// cacheAllocatorRegisterHook), and attachAllocatorTraceTracker. The tests
// compile the tracker against it and feed it events; the GPU validation
// compiles it against the real headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

typedef struct CUstream_st* cudaStream_t;

namespace c10 {
using DeviceIndex = int8_t;
namespace cuda {
namespace CUDACachingAllocator {

struct TraceEntry {
  enum Action {
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    OOM
  };
  Action action_;
  DeviceIndex device_;
  size_t addr_;
  cudaStream_t stream_;
  size_t size_;
};

using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);

}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10
