// Writes a replay as a torch.cuda.memory._snapshot() pickle: PyTorch's
// memory viewer (https://pytorch.org/memory_viz, or
// `python -m torch.cuda._memory_viz trace_plot OUT.pickle -o out.html`)
// opens it, and ReadSnapshotFile reads it back.
//
// The snapshot is a dict with PyTorch's keys:
// - segments: the engine's end state (CachingAllocator::Snapshot()), each
//   {device, address, total_size, allocated_size, active_size,
//   requested_size, stream, segment_type ('small'|'large'), is_expandable,
//   frames, blocks}, each block {address, size, requested_size, state
//   ('active_allocated'|'active_pending_free'|'inactive'), frames}.
// - device_traces: one list per device up to the trace's; the trace's holds
//   every replayed event {action, addr, size, stream, time_us, frames}:
//   alloc, free_requested and free_completed at the engine's addresses with
//   the program's requested sizes; segment_alloc and segment_free
//   (cudaMalloc/cudaFree), segment_map and segment_unmap (expandable
//   segments) with the segment's stream; and oom {action, size, stream,
//   device_free, time_us, frames} for an allocation that failed. `stream` is
//   the recorded CUDA stream handle; time_us is the trace event's index (a
//   replay has no clock); frames are empty (it has no stack traces).
// - allocator_settings: {'PYTORCH_CUDA_ALLOC_CONF': the replayed config}.
//
// As in PyTorch, frees that a cache flush completed early are written as
// free_completed then (before the flushing allocation's segment events), and
// the trace's own free_completed of them later is left out. A replay without
// OOMs or flushes therefore reads back as the trace it replayed.
//
// A recorder may also start on an allocator that already holds memory (a
// live process's _record_memory_history): a free of an allocation it did not
// see allocated is written at the allocation's address with the event's
// size, and a device call on a segment or reservation it did not see made
// gets the current event's stream, as PyTorch writes what it cannot know.
#ifndef ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_WRITER_H_
#define ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/trace/replay_observer.h"
#include "allocator/trace/snapshot_action.h"
#include "allocator/trace/trace.h"

namespace allocd {

// Records a replay as a snapshot: pass it as ReplayOptions::observer, then
// call Pickle().
class SnapshotRecorder final : public ReplayObserver {
 public:
  // `trace` (its stream handles and device) must outlive the recorder.
  SnapshotRecorder(const Trace& trace, const AllocatorConfig& config);

  void OnEvent(uint64_t index, const TraceEvent& event) override;
  void OnDeviceCall(DeviceCall call, uint64_t address, uint64_t bytes) override;
  void OnCacheFlush() override;
  void OnBlock(const TraceEvent& event, const Allocation& allocation) override;
  void OnOutOfMemory(const TraceEvent& event, uint64_t device_free) override;
  void OnEnd(const CachingAllocator& allocator) override;

  // Writes only the newest `max_events` snapshot events, as
  // _record_memory_history(max_entries=) keeps them (older ones are dropped
  // as new ones arrive: memory stays within about twice that). 0: all.
  void KeepNewest(size_t max_events) { max_events_ = max_events; }

  // The snapshot pickle of the replay so far (segments as of OnEnd).
  std::string Pickle() const;

 private:
  using Action = SnapshotAction;
  struct Event {
    Action action;
    StreamId stream;
    uint64_t time;
    // For kOom: the device's free memory.
    uint64_t addr;
    uint64_t size;
  };
  // An allocation from its alloc to its free_completed.
  struct LiveBlock {
    uint64_t addr;
    uint64_t size;
    StreamId stream;
    // Order of free_requested, for the ones a flush completes; 0: not yet.
    uint64_t free_requested = 0;
  };
  // A segment or an expandable segment's reserved range.
  struct Range {
    uint64_t bytes;
    StreamId stream;
  };

  void Add(Action action, StreamId stream, uint64_t addr, uint64_t size);
  // The stream of the range that holds `address` (a mapped or unmapped
  // page); the current event's for a range made before recording began.
  StreamId StreamOfRange(uint64_t address) const;
  uint64_t StreamHandle(StreamId stream) const;

  const Trace& trace_;
  std::string conf_;
  uint64_t time_ = 0;
  StreamId stream_ = 0;
  // Where the current trace event's snapshot events begin.
  size_t event_begin_ = 0;
  uint64_t free_requests_ = 0;
  size_t max_events_ = 0;
  std::vector<Event> events_;
  absl::flat_hash_map<uint32_t, LiveBlock> live_;
  // Ids whose free a cache flush completed; their own free_completed is
  // left out.
  absl::flat_hash_set<uint32_t> flushed_;
  std::map<uint64_t, Range> ranges_;
  std::vector<SegmentInfo> segments_;
};

// Writes `pickle` to `path`, gzipped when the path ends in ".gz" (PyTorch's
// viewer wants the plain pickle; ReadSnapshotFile reads both). An error
// names the path and the reason.
absl::Status WriteSnapshotFile(const std::string& path,
                               std::string_view pickle);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_WRITER_H_
