// A model of the part of PyTorch 2.11's c10/cuda/CUDACachingAllocator.h that
// allocd/_trace_tracker.cpp uses: TraceEntry's fields and actions as
// PyTorch's own trackers read them (ProcessGroupNCCL's
// cacheAllocatorRegisterHook), attachAllocatorTraceTracker, and through
// get() the snapshot's segments and blocks (SegmentInfo, BlockInfo) and
// trace ring, recordHistory and getDeviceStats' event counters. The tests
// compile the tracker against it and feed it events; the GPU validation
// compiles it against the real headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

typedef struct CUstream_st* cudaStream_t;

namespace c10 {
using DeviceIndex = int8_t;
// A stack trace PyTorch gathered for an event (c10/util/Unwind.h).
struct GatheredContext {
  virtual ~GatheredContext() = default;
};
namespace cuda {
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;
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
  // As PyTorch 2.11's (c10/core/CachingDeviceAllocator.h TraceEntryBase):
  // what building one costs a tracked event, besides the fields the tracker
  // reads.
  TraceEntry(Action action, DeviceIndex device, size_t addr, size_t size,
             cudaStream_t stream, MempoolId_t mempool, uint64_t time,
             std::shared_ptr<GatheredContext> context = nullptr,
             std::string compile_context = {})
      : action_(action),
        device_(device),
        addr_(addr),
        context_(std::move(context)),
        stream_(stream),
        size_(size),
        mempool_(std::move(mempool)),
        time_(time),
        compile_context_(std::move(compile_context)) {}
  Action action_;
  DeviceIndex device_;
  size_t addr_;
  std::shared_ptr<GatheredContext> context_;
  cudaStream_t stream_;
  size_t size_;
  MempoolId_t mempool_;
  uint64_t time_;
  std::string compile_context_;
};

using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;
typedef std::shared_ptr<GatheredContext> (*CreateContextFn)();
enum struct RecordContext { NEVER = 0, STATE = 1, ALLOC = 2, ALL = 3 };

// c10/core/CachingDeviceAllocator.h's, the counters the stream's reader sums.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
};
using StatArray = std::array<Stat, 3>;  // aggregate, small pool, large pool
struct DeviceStats {
  StatArray allocation;
  StatArray active;
};
void attachAllocatorTraceTracker(AllocatorTraceTracker tracker);

struct BlockInfo {
  size_t size = 0;
  size_t requested_size = 0;
  int32_t gc_counter = 0;
  bool allocated = false;
  bool active = false;
};

struct SegmentInfo {
  DeviceIndex device = 0;
  size_t address = 0;
  size_t total_size = 0;
  size_t requested_size = 0;
  size_t allocated_size = 0;
  size_t active_size = 0;
  cudaStream_t stream = nullptr;
  bool is_large = false;
  bool is_expandable = false;
  MempoolId_t owner_private_pool_id = {0, 0};
  std::vector<BlockInfo> blocks;
};

struct SnapshotInfo {
  std::vector<SegmentInfo> segments;
  std::vector<std::vector<TraceEntry>> device_traces;
};

class CUDAAllocator {
 public:
  virtual ~CUDAAllocator() = default;
  virtual SnapshotInfo snapshot(MempoolId_t mempool_id = {0, 0},
                                bool include_traces = true) = 0;
  virtual DeviceStats getDeviceStats(DeviceIndex device) = 0;
  virtual void recordHistory(bool enabled, CreateContextFn context_recorder,
                             size_t alloc_trace_max_entries, RecordContext when,
                             bool clearHistory,
                             const std::vector<std::string>& skip_actions) = 0;
};

CUDAAllocator* get();

}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10
