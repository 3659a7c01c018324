// ReplayObserver: what a replay did, call by call, for tools that record
// more than ReplayResult's counters (the snapshot writer: the addresses the
// engine handed out and the segments it got from the device).
//
// Set ReplayOptions::observer to receive the calls; a replay without one
// pays nothing for them. Per trace event, in order: OnEvent, then any
// OnDeviceCall the engine made while running it, then OnCacheFlush if it
// flushed the cache, then OnBlock (the event's allocation or free) or
// OnOutOfMemory, then AfterEvent. OnEnd follows the last event. Frees of an allocation that
// ran out of memory are not reported (the replay skips them). Only the native
// allocator replays through the engine: a backend:cudaMallocAsync replay with
// an observer is an InvalidArgument error.
#ifndef ALLOCD_ALLOCATOR_TRACE_REPLAY_OBSERVER_H_
#define ALLOCD_ALLOCATOR_TRACE_REPLAY_OBSERVER_H_

#include <cstdint>

#include "allocator/caching_allocator.h"
#include "allocator/trace/trace.h"

namespace allocd {

// A DeviceBackend call that succeeded, named after what PyTorch does.
enum class DeviceCall : uint8_t {
  kSegmentAlloc,  // cudaMalloc
  kSegmentFree,   // cudaFree
  kReserve,       // cuMemAddressReserve of an expandable segment
  kRelease,       // cuMemAddressFree
  kMap,           // cuMemMap of pages inside a reserved range
  kUnmap,         // cuMemUnmap
};

class ReplayObserver {
 public:
  virtual ~ReplayObserver() = default;

  // Trace event `index` is about to run.
  virtual void OnEvent(uint64_t index, const TraceEvent& event) = 0;

  // The engine made `call` on [address, address + bytes) while running the
  // current event. The range may belong to another stream than the event's
  // (a cache flush frees every stream's segments).
  virtual void OnDeviceCall(DeviceCall call, uint64_t address,
                            uint64_t bytes) = 0;

  // The current event's allocation flushed the cache, synchronising all
  // streams first: every free requested but not yet completed completed
  // then, before the flush released any segment. The trace's later
  // kFreeCompleted of such a block changes nothing (OnBlock still reports it).
  virtual void OnCacheFlush() = 0;

  // The current event ran: a kAlloc that got `allocation`, or a free of it.
  virtual void OnBlock(const TraceEvent& event,
                       const Allocation& allocation) = 0;

  // The current kAlloc event ran out of memory with `device_free` bytes
  // still free on the device.
  virtual void OnOutOfMemory(const TraceEvent& event, uint64_t device_free) = 0;

  // The current event is done: a safe point to change the allocator, as a
  // live client applies a pushed config (Reconfigure) or empties its cache
  // between allocations. Returning false ends the replay after this event
  // (a live client whose time is up). Recording observers need not override
  // it.
  virtual bool AfterEvent(uint64_t /*index*/, CachingAllocator& /*allocator*/) {
    return true;
  }

  // The replay ended (after the last event, at the first OOM with
  // stop_at_first_oom, or when AfterEvent said so); `allocator` holds the
  // end state.
  virtual void OnEnd(const CachingAllocator& allocator) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_REPLAY_OBSERVER_H_
