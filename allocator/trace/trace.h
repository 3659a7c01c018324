// Trace: the allocation history of one device of one process, as the engine
// replays it.
//
// Ids are dense (0..num_ids-1) and name one allocation from its `alloc` to
// its `free_completed`. A block returns to the cache at kFreeCompleted;
// kFreeRequested is when the program dropped it (allocated bytes fall then),
// and the two differ when record_stream() delayed the free.
#ifndef ALLOCD_ALLOCATOR_TRACE_TRACE_H_
#define ALLOCD_ALLOCATOR_TRACE_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace allocd {

enum class TraceOp : uint8_t { kAlloc, kFreeRequested, kFreeCompleted };

struct TraceEvent {
  TraceOp op;
  // Index into Trace::streams.
  uint16_t stream;
  uint32_t id;
  // The size the program asked for, before rounding.
  uint64_t size;

  bool operator==(const TraceEvent&) const = default;
};

// A segment the recorded run allocated from the driver (`segment_alloc`):
// where the CUDA driver put it tells how it places new segments.
struct RecordedSegment {
  uint64_t address;
  uint64_t size;
  // Index of the first trace event after this segment was allocated.
  uint64_t before_event;
};

// Snapshot events that Trace::events leaves out, by kind.
struct OmittedEvents {
  // free_requested / free_completed of an address that no recorded `alloc`
  // holds: the block was allocated before recording began (or before the
  // oldest event that _record_memory_history's max_entries kept).
  uint64_t unmatched_frees = 0;
  uint64_t segment_free = 0;
  // Expandable segments map and unmap pages of one big reservation.
  uint64_t segment_map = 0;
  uint64_t segment_unmap = 0;
  uint64_t snapshot = 0;
  // Allocations that failed in the recorded run with an OutOfMemoryError.
  uint64_t oom = 0;

  bool operator==(const OmittedEvents&) const = default;
};

// A segment the process held before the trace's first event.
struct InitialSegment {
  uint64_t address;
  uint64_t size;
  // Index into Trace::streams.
  uint16_t stream;
  bool is_small;
  // One mapped range of an expandable segment.
  bool is_expandable = false;

  bool operator==(const InitialSegment&) const = default;
};

// A block allocated before the trace's first event and still held then. Its
// id is one of the trace's: the trace's events free it like any other.
struct InitialBlock {
  uint32_t id;
  uint64_t address;
  // The block's size: the request rounded under the recorded config, or
  // more when the recorded run did not split it.
  uint64_t size;
  uint64_t requested_size;
  // Freed by the program before the first event, its free_completed (after
  // record_stream) still to come: the trace holds only that.
  bool free_requested = false;

  bool operator==(const InitialBlock&) const = default;
};

// How a snapshot is partial, and what was reconstructed of the memory its
// first event found (see snapshot_reader.h).
struct PartialTrace {
  // The state at the first event: non-empty when recording began after the
  // process allocated (a late _record_memory_history, or a ring buffer that
  // dropped the oldest events). Segments and blocks by address; a block's
  // segment is the one that holds its address.
  std::vector<InitialSegment> segments;
  std::vector<InitialBlock> blocks;
  // Free events (free_requested, free_completed) of blocks that no recorded
  // alloc made.
  uint64_t unmatched_frees = 0;
  // The snapshot's end state holds what no event explains (segments or
  // blocks that were there before the first event).
  bool state_before_first_event = false;
  // The trace looks cut by _record_memory_history(max_entries=N): it is
  // partial and holds a round number of events.
  bool ring_buffer_wrapped = false;
  // Other devices of the process with events (a replay covers one).
  std::vector<int> other_devices;
  // Why the state at the first event could not be reconstructed; empty when
  // it was (or nothing was missing). A replay of an unrecoverable partial
  // trace starts from an empty device and misses what was live.
  std::string unrecoverable;

  bool partial() const {
    return unmatched_frees > 0 || state_before_first_event;
  }
  // The replay starts from the recorded state (Trace::partial.segments).
  bool reconstructed() const { return partial() && unrecoverable.empty(); }
};

struct Trace {
  std::vector<TraceEvent> events;
  // When each event happened (the snapshot's time_us, microseconds on the
  // recording host's clock), in events' order: what paces a replay at the
  // job's own rate. Empty when the trace does not say for every event.
  std::vector<int64_t> event_times_us;
  // The distinct CUDA stream handles, ascending; TraceEvent::stream indexes
  // this, so stream order is PyTorch's (it orders free blocks by stream).
  std::vector<uint64_t> streams;
  uint32_t num_ids = 0;
  std::vector<RecordedSegment> recorded_segments;
  // The PYTORCH_CUDA_ALLOC_CONF of the recorded run, when the snapshot says.
  std::string recorded_config;
  int device = 0;
  OmittedEvents omitted;
  PartialTrace partial;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_TRACE_H_
