#include "allocator/trace/replay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_backend.h"
#include "allocator/trace/async_pool_model.h"
#include "allocator/trace/observed_backend.h"
#include "allocator/trace/replay_observer.h"

namespace allocd {
namespace {

enum class IdState : uint8_t { kUnseen, kLive, kFreeRequested, kDone, kFailed };

// Keeps the highs of reserved and allocated memory per stretch of events.
class TimelineRecorder {
 public:
  TimelineRecorder(uint64_t num_events, size_t samples)
      : stride_(samples == 0 ? 0 : std::max<uint64_t>(1, (num_events + samples - 1) / samples)) {}

  void Observe(uint64_t event, const DeviceStats& stats,
               std::vector<TimelineSample>& out) {
    if (stride_ == 0) return;
    reserved_ = std::max(reserved_, stats.reserved_bytes.all().current);
    allocated_ = std::max(allocated_, stats.allocated_bytes.all().current);
    if ((event + 1) % stride_ == 0) Flush(event, stats, out);
  }

  void Finish(uint64_t events, const DeviceStats& stats,
              std::vector<TimelineSample>& out) {
    if (stride_ != 0 && events % stride_ != 0) Flush(events - 1, stats, out);
  }

 private:
  void Flush(uint64_t event, const DeviceStats& stats,
             std::vector<TimelineSample>& out) {
    out.push_back(TimelineSample{event, reserved_, allocated_});
    reserved_ = stats.reserved_bytes.all().current;
    allocated_ = stats.allocated_bytes.all().current;
  }

  uint64_t stride_;
  int64_t reserved_ = 0;
  int64_t allocated_ = 0;
};

absl::Status CheckOptions(const ReplayOptions& options) {
  if (options.memory_fraction &&
      !(*options.memory_fraction >= 0.0 && *options.memory_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory fraction %g is outside [0, 1]", *options.memory_fraction));
  }
  return absl::OkStatus();
}

absl::Status BadEvent(uint64_t index, const TraceEvent& event,
                      const char* what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("trace event %d (id %d): %s", index, event.id, what));
}

void CopyCounters(const DeviceStats& stats, ReplayResult& result) {
  result.peak_reserved = stats.reserved_bytes.all().peak;
  result.peak_allocated = stats.allocated_bytes.all().peak;
  result.peak_requested = stats.requested_bytes.all().peak;
  result.num_device_alloc = stats.num_device_alloc;
  result.num_device_free = stats.num_device_free;
  result.num_alloc_retries = stats.num_alloc_retries;
  result.num_ooms = stats.num_ooms;
  result.num_sync_all_streams = stats.num_sync_all_streams;
  result.stats = stats;
}

absl::StatusOr<ReplayResult> ReplayNative(const Trace& trace,
                                          const AllocatorConfig& config,
                                          const ReplayOptions& options) {
  const size_t capacity = options.capacity == 0
                              ? std::numeric_limits<size_t>::max()
                              : options.capacity;
  std::optional<SimBackend> simulated;
  DeviceBackend& backend =
      options.device != nullptr
          ? *options.device
          : simulated.emplace(capacity, options.total_memory);
  // The observer, if any, sees the engine's device calls through a wrapper;
  // without one the engine calls the simulator directly.
  ReplayObserver* const observer = options.observer;
  std::optional<ObservedBackend> observed;
  if (observer != nullptr) observed.emplace(backend, observer);
  CachingAllocator allocator(
      config, observed ? static_cast<DeviceBackend*>(&*observed) : &backend);
  if (options.memory_fraction) allocator.SetMemoryFraction(*options.memory_fraction);

  ReplayResult result;
  std::vector<Allocation> allocations(trace.num_ids);
  std::vector<IdState> states(trace.num_ids, IdState::kUnseen);
  TimelineRecorder timeline(trace.events.size(), options.timeline_samples);

  const auto start = std::chrono::steady_clock::now();
  uint64_t i = 0;
  for (; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.id >= trace.num_ids) return BadEvent(i, e, "id out of range");
    IdState& state = states[e.id];
    if (observer != nullptr) observer->OnEvent(i, e);
    switch (e.op) {
      case TraceOp::kAlloc: {
        if (state != IdState::kUnseen) return BadEvent(i, e, "allocated twice");
        const int64_t syncs = allocator.Stats().num_sync_all_streams;
        absl::StatusOr<Allocation> a = allocator.Malloc(e.size, e.stream);
        if (observer != nullptr &&
            allocator.Stats().num_sync_all_streams != syncs) {
          observer->OnCacheFlush();
        }
        if (a.ok()) {
          allocations[e.id] = *a;
          state = IdState::kLive;
        } else if (absl::IsResourceExhausted(a.status())) {
          state = IdState::kFailed;
          if (!result.first_oom_event) result.first_oom_event = i;
          if (observer != nullptr) {
            observer->OnOutOfMemory(e, backend.FreeMemory());
          }
        } else {
          return a.status();
        }
        break;
      }
      case TraceOp::kFreeRequested:
        if (state == IdState::kLive) {
          if (absl::Status s = allocator.FreeDeferred(allocations[e.id]); !s.ok()) return s;
          state = IdState::kFreeRequested;
        } else if (state != IdState::kFailed) {
          return BadEvent(i, e, "free_requested of a block that is not allocated");
        }
        break;
      case TraceOp::kFreeCompleted:
        if (state == IdState::kFreeRequested) {
          allocator.CompleteFree(allocations[e.id]);
          state = IdState::kDone;
        } else if (state != IdState::kFailed) {
          return BadEvent(i, e, "free_completed without free_requested");
        }
        break;
    }
    bool go_on = true;
    if (observer != nullptr) {
      if (state != IdState::kFailed) observer->OnBlock(e, allocations[e.id]);
      go_on = observer->AfterEvent(i, allocator);
    }
    timeline.Observe(i, allocator.Stats(), result.timeline);
    if (!go_on || (options.stop_at_first_oom && result.first_oom_event)) {
      ++i;
      break;
    }
  }
  result.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  result.events = i;
  timeline.Finish(i, allocator.Stats(), result.timeline);
  CopyCounters(allocator.Stats(), result);
  if (observer != nullptr) {
    observer->OnEnd(allocator);
    observed->Detach();
  }
  return result;
}

}  // namespace

absl::StatusOr<ReplayResult> Replay(const Trace& trace,
                                    const AllocatorConfig& config,
                                    const ReplayOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (config.backend == AllocatorBackend::kCudaMallocAsync) {
    if (options.observer != nullptr) {
      return absl::InvalidArgumentError(
          "backend:cudaMallocAsync is a model's estimate without blocks or "
          "segments to observe");
    }
    return EstimateAsyncPoolReplay(trace, options);
  }
  return ReplayNative(trace, config, options);
}

}  // namespace allocd
