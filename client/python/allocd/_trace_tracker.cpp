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
// comparison and four appends under a mutex of this file's, in the
// allocator's own call (PyTorch calls trackers with its device lock held,
// never under the GIL); taking them is four copies.
//
// PyTorch cannot detach a tracker: stop() makes it ignore events, and a
// second attach re-arms the same one.
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;

// What the allocd protocol calls the ops (EventBatch.ops); kStep is the
// job's step mark (proto/protocol.h kEventOpStep).
enum Op : uint8_t { kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2, kStep = 3 };

struct Buffer {
  std::mutex mu;
  std::vector<uint8_t> ops;
  std::vector<uint64_t> sizes, ids, streams;
  uint64_t dropped = 0;  // since the last take: the buffer was full
  size_t capacity = 0;
  std::atomic<int> device{-1};  // -1: stopped
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

void Track(const TraceEntry& entry) {
  Buffer& b = *buffer;
  if (static_cast<int>(entry.device_) != b.device.load(std::memory_order_relaxed)) {
    return;
  }
  Op op;
  switch (entry.action_) {
    case TraceEntry::Action::ALLOC:
      op = kAlloc;
      break;
    case TraceEntry::Action::FREE_REQUESTED:
      op = kFreeRequested;
      break;
    case TraceEntry::Action::FREE_COMPLETED:
      op = kFreeCompleted;
      break;
    default:
      return;
  }
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.ops.size() >= b.capacity) {
    ++b.dropped;
    return;
  }
  b.ops.push_back(op);
  b.sizes.push_back(static_cast<uint64_t>(entry.size_));
  b.ids.push_back(static_cast<uint64_t>(entry.addr_));
  b.streams.push_back(StreamId(entry.stream_));
}

template <typename T>
void MoveFront(std::vector<T>& from, T* to, size_t n) {
  if (n == 0) return;
  std::memcpy(to, from.data(), n * sizeof(T));
  from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
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
    std::lock_guard<std::mutex> hold(buffer->mu);
    buffer->capacity = capacity;
    buffer->ops.clear();
    buffer->sizes.clear();
    buffer->ids.clear();
    buffer->streams.clear();
    buffer->dropped = 0;
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
  Buffer& b = *buffer;
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.ops.size() >= b.capacity) {
    ++b.dropped;
    return 0;
  }
  b.ops.push_back(kStep);
  b.sizes.push_back(0);
  b.ids.push_back(0);
  b.streams.push_back(0);
  return 0;
}

// Events waiting to be taken.
__attribute__((visibility("default"))) uint64_t allocd_tracker_pending() {
  if (buffer == nullptr) return 0;
  std::lock_guard<std::mutex> lock(buffer->mu);
  return buffer->ops.size();
}

// Moves the oldest events, at most `max`, into the four arrays; returns how
// many, and in *dropped the events lost (buffer full) since the last take.
__attribute__((visibility("default"))) uint64_t allocd_tracker_take(
    uint8_t* ops, uint64_t* sizes, uint64_t* ids, uint64_t* streams,
    uint64_t max, uint64_t* dropped) {
  *dropped = 0;
  if (buffer == nullptr) return 0;
  std::lock_guard<std::mutex> lock(buffer->mu);
  const size_t n = std::min<size_t>(max, buffer->ops.size());
  MoveFront(buffer->ops, ops, n);
  MoveFront(buffer->sizes, sizes, n);
  MoveFront(buffer->ids, ids, n);
  MoveFront(buffer->streams, streams, n);
  *dropped = buffer->dropped;
  buffer->dropped = 0;
  return n;
}

}  // extern "C"
