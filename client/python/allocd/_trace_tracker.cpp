// The allocation stream of PyTorch's CUDA caching allocator, from inside it:
// a trace tracker (attachAllocatorTraceTracker) that keeps the alloc,
// free_requested and free_completed events of one device in a buffer, for
// the allocd package to take in bulk (allocd/_tracker.py compiles this
// against the PyTorch the job runs, once per version, and loads it with
// ctypes).
//
// Why: reading the same events from PyTorch's history (_snapshot()) builds a
// Python dict per event with the GIL held, ~2 us an event; a job with 13,000
// events a step lost 8% of its mean step to it. Here an event costs a
// comparison and one append under a spin lock of this file's, in the
// allocator's own call (PyTorch calls trackers with its device lock held,
// never under the GIL); taking them swaps two buffers under that lock and
// copies out after it.
//
// PyTorch cannot detach a tracker: stop() makes it ignore events, and a
// second attach re-arms the same one.
//
// It also reads the allocator's state (its segments and the blocks the
// program holds) for the advisor's step marks, as allocd/_allocator_state.py
// reads it from torch.cuda.memory_snapshot(): that builds a Python dict per
// block with the GIL held on the job's thread, 4.3 ms a read on a T5-base
// fine-tune; here it is PyTorch's C++ snapshot and a copy into columns.
//
// And it reads PyTorch's allocator history (_record_memory_history), which a
// stream reads first because the history can be switched off once the
// daemon has decided and a tracker cannot be detached: the events of a
// snapshot taken in C++, kept as the tracker keeps its own, and the history
// re-armed cleared in the same call, where _history.py's Python reader
// builds a dict per event and per held block with the GIL held (a seq2seq
// first run stepped 35% slower on it until the daemon decided).
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;

// What the allocd protocol calls the ops (EventBatch.ops); kStep is the
// job's step mark (proto/protocol.h kEventOpStep).
enum Op : uint8_t { kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2, kStep = 3 };

// One event as the allocating threads append it: one array, one stream of
// writes (four columns were four), the op in the size's top byte (no device
// has 2^56 bytes). allocd_tracker_take spreads them into its four columns.
struct Event {
  uint64_t size_and_op;
  uint64_t id;
  uint64_t stream;
};
constexpr int kOpShift = 56;
constexpr uint64_t kSizeMask = (uint64_t{1} << kOpShift) - 1;

struct Events {
  std::vector<Event> events;

  size_t size() const { return events.size(); }
  void Append(Op op, uint64_t size, uint64_t id, uint64_t stream) {
    events.push_back({(size & kSizeMask) | (uint64_t{op} << kOpShift), id, stream});
  }
  void Clear() { events.clear(); }  // keeps its capacity, for the next round's appends
};

// The allocating side's lock. Its holders are the tracker (PyTorch calls it
// under its own device lock, so trackers never wait for each other), a step
// mark, and a take's swap: each holds it for an append or a swap. Released
// with a plain store, where a std::mutex's unlock is a call and an atomic
// exchange: on the H200 host that unlock was the largest single part of the
// tracker's cost to a seq2seq step (bench/gpu/results/packing/
// run_1130b_tracker_split_and_cpu_profile).
class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 64) {
          Pause();
        } else {
          std::this_thread::yield();  // a holder descheduled mid-swap
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  std::atomic<bool> locked_{false};
};

// Two sets of events, so that a take holds the allocating threads' lock
// only to swap them, not while it copies out a round's events (tens of
// thousands, tens of microseconds), which every allocation in the job
// would otherwise wait for. Lock order: take_mu, then mu. The taking side
// has cache lines of its own: a take does not pull the allocating side's.
struct Buffer {
  SpinLock mu;  // the allocating side: the tracker, the step marks
  std::atomic<int> device{-1};  // -1: stopped
  Events filling;  // guarded by mu
  uint64_t dropped = 0;  // guarded by mu: since the last swap, the buffer full
  size_t capacity = 0;  // guarded by mu

  // Appends an event under mu, or counts it dropped when the buffer is full.
  void Keep(Op op, uint64_t size, uint64_t id, uint64_t stream) {
    std::lock_guard<SpinLock> lock(mu);
    if (filling.size() >= capacity) {
      ++dropped;
      return;
    }
    filling.Append(op, size, id, stream);
  }

  alignas(64) std::mutex take_mu;  // the taking side
  Events taken;  // guarded by take_mu: swapped out, taken from its front
  size_t taken_from = 0;  // guarded by take_mu
  uint64_t taken_dropped = 0;  // guarded by take_mu: dropped after `taken`
};

Buffer* buffer = nullptr;  // never freed: the tracker outlives any stop
std::mutex attach_mu;

template <typename S, typename = void>
struct HasStreamHandle : std::false_type {};  // c10::cuda::CUDAStream
template <typename S>
struct HasStreamHandle<S, std::void_t<decltype(std::declval<const S&>().stream())>>
    : std::true_type {};

// A stream as a number, whatever PyTorch's TraceEntry holds it as: the
// cudaStream_t (what _snapshot() reports), else c10::Stream's id.
template <typename S>
uint64_t StreamId(const S& stream) {
  if constexpr (std::is_pointer_v<S>) {
    return reinterpret_cast<uintptr_t>(stream);
  } else if constexpr (std::is_integral_v<S>) {
    return static_cast<uint64_t>(stream);
  } else if constexpr (HasStreamHandle<S>::value) {
    return reinterpret_cast<uintptr_t>(stream.stream());
  } else {
    return static_cast<uint64_t>(stream.id());
  }
}

// The stream's op of a PyTorch action, in *op; false for the actions the
// stream leaves out (segments, snapshots, OOMs).
inline bool StreamOp(TraceEntry::Action action, Op* op) {
  switch (action) {
    case TraceEntry::Action::ALLOC:
      *op = kAlloc;
      return true;
    case TraceEntry::Action::FREE_REQUESTED:
      *op = kFreeRequested;
      return true;
    case TraceEntry::Action::FREE_COMPLETED:
      *op = kFreeCompleted;
      return true;
    default:
      return false;
  }
}

void Track(const TraceEntry& entry) {
  Buffer& b = *buffer;
  Op op;
  if (static_cast<int>(entry.device_) != b.device.load(std::memory_order_relaxed) ||
      !StreamOp(entry.action_, &op)) {
    return;
  }
  b.Keep(op, static_cast<uint64_t>(entry.size_), static_cast<uint64_t>(entry.addr_),
         StreamId(entry.stream_));
}

// The allocator's state as allocd_record_state's columns (proto/protocol.h
// AllocatorState), from the last allocd_tracker_read_state.
struct State {
  std::vector<uint64_t> segment_addresses, segment_sizes, segment_streams;
  std::vector<uint32_t> segment_flags;
  std::vector<uint64_t> block_ids, block_addresses, block_sizes, block_requested;
  std::vector<uint32_t> block_flags;

  void Clear() {
    for (auto* column : {&segment_addresses, &segment_sizes, &segment_streams, &block_ids,
                         &block_addresses, &block_sizes, &block_requested}) {
      column->clear();
    }
    segment_flags.clear();
    block_flags.clear();
  }
};

// AllocatorState's flags (proto/protocol.h).
constexpr uint32_t kSegmentSmall = 1, kSegmentExpandable = 2, kBlockFreeRequested = 1;

std::mutex state_mu;
State* state = nullptr;  // never freed, as the buffer

// PyTorch's snapshot without its trace ring where PyTorch can leave it out
// (since 2.8: snapshot(mempool_id, include_traces)): a job that records
// history would otherwise have its ring copied at every read. {0, 0}: every
// pool's segments, as memory_snapshot() reports them.
template <typename Allocator>
auto Snapshot(Allocator* allocator, int) -> decltype(allocator->snapshot({0, 0}, false)) {
  return allocator->snapshot({0, 0}, false);
}
template <typename Allocator>
auto Snapshot(Allocator* allocator, long) -> decltype(allocator->snapshot()) {
  return allocator->snapshot();
}

// PyTorch's snapshot with its trace ring (the history's events).
template <typename Allocator>
auto SnapshotWithHistory(Allocator* allocator, int)
    -> decltype(allocator->snapshot({0, 0}, true)) {
  return allocator->snapshot({0, 0}, true);
}
template <typename Allocator>
auto SnapshotWithHistory(Allocator* allocator, long) -> decltype(allocator->snapshot()) {
  return allocator->snapshot();
}

using c10::cuda::CUDACachingAllocator::CUDAAllocator;
using c10::cuda::CUDACachingAllocator::CreateContextFn;

std::shared_ptr<c10::GatheredContext> NoStackFrames() { return nullptr; }

// Arms (or disarms) the history as _history.py's reader does through
// _record_memory_history("all", context=None, max_entries=ring,
// clear_history=clear, skip_actions=[segment_alloc, segment_free,
// snapshot]): no stack frames (RecordContext NEVER, value 0), and without
// the actions the stream does not need where PyTorch knows them. Deduced
// from recordHistory's own type, so that a PyTorch whose recordHistory
// takes other arguments compiles the tracker all the same and says -1
// here (the Python reader then arms it). 0; -1 not this PyTorch; -2
// PyTorch refused.
template <typename When>
int RecordHistory(void (CUDAAllocator::*)(bool, CreateContextFn, size_t, When, bool,
                                          const std::vector<std::string>&),
                  bool enabled, uint64_t ring, bool clear) {
  static const std::vector<std::string> skipped{"segment_alloc", "segment_free", "snapshot"};
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  if (allocator == nullptr) return -2;
  try {
    try {
      allocator->recordHistory(enabled, &NoStackFrames, ring, When{}, clear, skipped);
    } catch (...) {  // a PyTorch that does not know one of the skipped actions
      allocator->recordHistory(enabled, &NoStackFrames, ring, When{}, clear, {});
    }
  } catch (...) {
    return -2;
  }
  return 0;
}
template <typename Other>
int RecordHistory(Other, bool, uint64_t, bool) {
  return -1;
}

// Whether RecordHistory knows this PyTorch's recordHistory.
template <typename When>
constexpr bool KnowsRecordHistory(void (CUDAAllocator::*)(bool, CreateContextFn, size_t, When,
                                                          bool,
                                                          const std::vector<std::string>&)) {
  return true;
}
template <typename Other>
constexpr bool KnowsRecordHistory(Other) {
  return false;
}

// The events of the last allocd_history_take, for allocd_history_copy.
std::mutex history_mu;
Events* history_events = nullptr;  // never freed, as the buffer

// Whether the newest alloc of device `device` in `entries` carries stack
// frames: the job armed the history itself (PyTorch's defaults record
// them, allocd never asks). From the end: the first alloc met decides.
template <typename Entries>
bool ArmedByJob(const Entries& entries, int device) {
  for (auto entry = entries.rbegin(); entry != entries.rend(); ++entry) {
    if (static_cast<int>(entry->device_) == device &&
        entry->action_ == TraceEntry::Action::ALLOC) {
      return entry->context_ != nullptr;
    }
  }
  return false;
}

// Keeps `entries`' alloc and free events of device `device` in `out`.
template <typename Entries>
void KeepHistory(const Entries& entries, int device, Events& out) {
  out.Clear();
  for (const auto& entry : entries) {
    Op op;
    if (static_cast<int>(entry.device_) != device || !StreamOp(entry.action_, &op)) continue;
    out.Append(op, static_cast<uint64_t>(entry.size_), static_cast<uint64_t>(entry.addr_),
               StreamId(entry.stream_));
  }
}

// Fills `out` with device `device`'s segments and the blocks held in them
// (allocated, or freed by the program and waiting on a stream), as
// memory_snapshot() reports them: a block's address is its segment's plus the
// sizes of the blocks before it. 0; 1 when there are more than
// `max_segments` or `max_blocks`.
template <typename Segments>
int FillState(const Segments& segments, int device, uint64_t max_segments,
              uint64_t max_blocks, State& out) {
  out.Clear();
  for (const auto& segment : segments) {
    if (static_cast<int>(segment.device) != device) continue;
    if (out.segment_addresses.size() == max_segments) return 1;
    const auto base = static_cast<uint64_t>(segment.address);
    out.segment_addresses.push_back(base);
    out.segment_sizes.push_back(static_cast<uint64_t>(segment.total_size));
    out.segment_streams.push_back(StreamId(segment.stream));
    out.segment_flags.push_back((segment.is_large ? 0 : kSegmentSmall) |
                                (segment.is_expandable ? kSegmentExpandable : 0));
    uint64_t address = base;
    for (const auto& block : segment.blocks) {
      const auto size = static_cast<uint64_t>(block.size);
      if (block.allocated || block.active) {  // else the cache's, not the program's
        if (out.block_ids.size() == max_blocks) return 1;
        // The events name an allocation by its address.
        out.block_ids.push_back(address);
        out.block_addresses.push_back(address);
        out.block_sizes.push_back(size);
        // Never past its size: the daemon refuses a state that says so.
        out.block_requested.push_back(
            std::min(static_cast<uint64_t>(block.requested_size), size));
        out.block_flags.push_back(block.allocated ? 0 : kBlockFreeRequested);
      }
      address += size;
    }
  }
  return 0;
}

// Copies `n` events into the four columns the package reads.
void SpreadEvents(const Event* from, size_t n, uint8_t* ops, uint64_t* sizes, uint64_t* ids,
                  uint64_t* streams) {
  for (size_t i = 0; i < n; ++i) {
    ops[i] = static_cast<uint8_t>(from[i].size_and_op >> kOpShift);
    sizes[i] = from[i].size_and_op & kSizeMask;
    ids[i] = from[i].id;
    streams[i] = from[i].stream;
  }
}

template <typename T>
void CopyOut(const std::vector<T>& from, T* to) {
  if (!from.empty()) std::memcpy(to, from.data(), from.size() * sizeof(T));
}

}  // namespace

extern "C" {

// Starts keeping device `device`'s events, at most `capacity` between two
// takes (more are counted as dropped). 0 on success, -1 when PyTorch
// refused the tracker (its allocator not initialised).
__attribute__((visibility("default"))) int allocd_tracker_attach(
    int device, uint64_t capacity) {
  std::lock_guard<std::mutex> lock(attach_mu);
  if (buffer == nullptr) {
    auto* fresh = new Buffer;
    fresh->capacity = capacity;
    buffer = fresh;
    try {
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&Track);
    } catch (...) {
      buffer = nullptr;
      delete fresh;
      return -1;
    }
  }
  {
    std::lock_guard<std::mutex> taking(buffer->take_mu);
    std::lock_guard<SpinLock> hold(buffer->mu);
    buffer->capacity = capacity;
    buffer->filling.Clear();
    buffer->dropped = 0;
    buffer->taken.Clear();
    buffer->taken_from = 0;
    buffer->taken_dropped = 0;
  }
  buffer->device.store(device);
  return 0;
}

// Stops keeping events (PyTorch keeps calling the tracker).
__attribute__((visibility("default"))) void allocd_tracker_stop() {
  std::lock_guard<std::mutex> lock(attach_mu);
  if (buffer != nullptr) buffer->device.store(-1);
}

// Marks the end of one of the job's steps (its optimizer stepped) in the
// stream, in order with the events: op kStep, size, id and stream 0. 0, or
// -1 when no device is tracked.
__attribute__((visibility("default"))) int allocd_tracker_mark_step() {
  if (buffer == nullptr || buffer->device.load(std::memory_order_relaxed) < 0) return -1;
  buffer->Keep(kStep, 0, 0, 0);
  return 0;
}

// Events waiting to be taken.
__attribute__((visibility("default"))) uint64_t allocd_tracker_pending() {
  if (buffer == nullptr) return 0;
  std::lock_guard<std::mutex> taking(buffer->take_mu);
  std::lock_guard<SpinLock> lock(buffer->mu);
  return buffer->taken.size() - buffer->taken_from + buffer->filling.size();
}

// Moves the oldest events, at most `max`, into the four arrays; returns how
// many, and in *dropped the events lost (the buffer full) right after them,
// reported by the take that returns the last event before the loss (0 from
// the takes before it). The allocating threads wait only for a swap.
__attribute__((visibility("default"))) uint64_t allocd_tracker_take(
    uint8_t* ops, uint64_t* sizes, uint64_t* ids, uint64_t* streams,
    uint64_t max, uint64_t* dropped) {
  *dropped = 0;
  if (buffer == nullptr) return 0;
  Buffer& b = *buffer;
  std::lock_guard<std::mutex> taking(b.take_mu);
  if (b.taken_from == b.taken.size()) {  // all taken: swap in what filled since
    b.taken.Clear();
    b.taken_from = 0;
    std::lock_guard<SpinLock> lock(b.mu);
    std::swap(b.filling, b.taken);
    b.taken_dropped += b.dropped;
    b.dropped = 0;
  }
  const size_t first = b.taken_from;
  const size_t n = std::min<size_t>(max, b.taken.size() - first);
  SpreadEvents(b.taken.events.data() + first, n, ops, sizes, ids, streams);
  b.taken_from += n;
  if (b.taken_from == b.taken.size()) {  // the drops came after these events
    *dropped = b.taken_dropped;
    b.taken_dropped = 0;
  }
  return n;
}

// Reads the allocator's state of device `device` (PyTorch's snapshot) and
// keeps it for allocd_tracker_take_state; counts[0] and counts[1] are its
// segments and held blocks. 0; 1 when there are more than `max_segments` or
// `max_blocks` (nothing kept); -1 when PyTorch's allocator cannot give one
// (a pluggable allocator, no snapshot).
__attribute__((visibility("default"))) int allocd_tracker_read_state(
    int device, uint64_t max_segments, uint64_t max_blocks, uint64_t* counts) {
  counts[0] = counts[1] = 0;
  std::lock_guard<std::mutex> lock(state_mu);
  if (state == nullptr) state = new State;
  int result;
  try {
    auto* allocator = c10::cuda::CUDACachingAllocator::get();
    if (allocator == nullptr) return -1;
    result = FillState(Snapshot(allocator, 0).segments, device, max_segments, max_blocks,
                       *state);
  } catch (...) {
    state->Clear();
    return -1;
  }
  if (result != 0) {
    state->Clear();
    return result;
  }
  counts[0] = state->segment_addresses.size();
  counts[1] = state->block_ids.size();
  return 0;
}

// Copies the state the last allocd_tracker_read_state kept into ten arrays of
// its counts: the segments' addresses, sizes, streams and flags, then the
// held blocks' ids, addresses, sizes, requested sizes and flags.
__attribute__((visibility("default"))) void allocd_tracker_take_state(
    uint64_t* segment_addresses, uint64_t* segment_sizes, uint64_t* segment_streams,
    uint32_t* segment_flags, uint64_t* block_ids, uint64_t* block_addresses,
    uint64_t* block_sizes, uint64_t* block_requested, uint32_t* block_flags) {
  std::lock_guard<std::mutex> lock(state_mu);
  if (state == nullptr) return;
  CopyOut(state->segment_addresses, segment_addresses);
  CopyOut(state->segment_sizes, segment_sizes);
  CopyOut(state->segment_streams, segment_streams);
  CopyOut(state->segment_flags, segment_flags);
  CopyOut(state->block_ids, block_ids);
  CopyOut(state->block_addresses, block_addresses);
  CopyOut(state->block_sizes, block_sizes);
  CopyOut(state->block_requested, block_requested);
  CopyOut(state->block_flags, block_flags);
}

// 1 when the allocd_history_ functions can arm this PyTorch's history; 0
// when they cannot (allocd_history_record says -1), and the package reads
// it through Python.
__attribute__((visibility("default"))) int allocd_history_supported() {
  return KnowsRecordHistory(&CUDAAllocator::recordHistory) ? 1 : 0;
}

// Arms PyTorch's history for the stream (`enabled` 1: without stack frames,
// at most `ring` entries, cleared when `clear`) or disarms it (0). 0; -1
// when this PyTorch's recordHistory is not the one this file knows (the
// caller arms it through Python instead); -2 when PyTorch refused.
__attribute__((visibility("default"))) int allocd_history_record(int enabled, uint64_t ring,
                                                                 int clear) {
  return RecordHistory(&CUDAAllocator::recordHistory, enabled != 0, ring, clear != 0);
}

// PyTorch's counts of device `device`'s allocation requests, frees requested
// and blocks returned to the cache (memory_stats()'s allocation.all.allocated,
// allocation.all.freed, active.all.freed), summed: how many of the stream's
// events the allocator made, without the Python dict of every statistic
// that memory_stats() builds.
__attribute__((visibility("default"))) uint64_t allocd_history_counted(int device) {
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  if (allocator == nullptr) return 0;
  try {
    const auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return static_cast<uint64_t>(stats.allocation[0].allocated + stats.allocation[0].freed +
                                 stats.active[0].freed);
  } catch (...) {  // a device PyTorch's allocator does not know
    return 0;
  }
}

// Takes device `device`'s events from PyTorch's history (its snapshot) and
// keeps them for allocd_history_copy; when `rearm` and the job has not
// armed the history itself (*job_armed 0), arms it again cleared with
// `ring` entries first, right after the snapshot, so that the next take
// begins where this one ends and nothing is read twice. The events the
// allocator makes between the snapshot and the re-arm are lost (the
// caller counts them): the caller holds the GIL, so that no Python thread
// of the job allocates meanwhile, and the gap is the snapshot's own
// return, no more. Returns how many events were kept; -1 when PyTorch gave
// no snapshot, -2 when it refused the re-arm.
__attribute__((visibility("default"))) int64_t allocd_history_take(int device, uint64_t ring,
                                                                   int rearm, int* job_armed) {
  *job_armed = 0;
  std::lock_guard<std::mutex> lock(history_mu);
  if (history_events == nullptr) history_events = new Events;
  history_events->Clear();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  if (allocator == nullptr) return -1;
  try {
    const auto snapshot = SnapshotWithHistory(allocator, 0);
    const bool has_trace = device >= 0 && static_cast<size_t>(device) < snapshot.device_traces.size();
    *job_armed = has_trace && ArmedByJob(snapshot.device_traces[device], device);
    if (rearm != 0 && *job_armed == 0 &&
        RecordHistory(&CUDAAllocator::recordHistory, true, ring, true) != 0) {
      return -2;
    }
    if (has_trace) KeepHistory(snapshot.device_traces[device], device, *history_events);
  } catch (...) {
    history_events->Clear();
    return -1;
  }
  return static_cast<int64_t>(history_events->size());
}

// Copies the events the last allocd_history_take kept into four arrays of
// its count, as allocd_tracker_take does.
__attribute__((visibility("default"))) void allocd_history_copy(uint8_t* ops, uint64_t* sizes,
                                                                uint64_t* ids,
                                                                uint64_t* streams) {
  std::lock_guard<std::mutex> lock(history_mu);
  if (history_events == nullptr) return;
  SpreadEvents(history_events->events.data(), history_events->size(), ops, sizes, ids,
               streams);
}

}  // extern "C"
