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

absl::Status CheckFraction(const std::optional<double>& fraction) {
  if (fraction && !(*fraction >= 0.0 && *fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memory fraction %g is outside [0, 1]", *fraction));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const Trace& trace, const AllocatorConfig& config,
                          const ReplayOptions& options) {
  if (absl::Status s = CheckFraction(options.memory_fraction); !s.ok()) return s;
  if (!options.live_switch) return absl::OkStatus();
  const LiveSwitch& sw = *options.live_switch;
  if (absl::Status s = CheckFraction(sw.memory_fraction); !s.ok()) return s;
  if (sw.before_event > trace.events.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "live switch before event %d of a trace of %d events", sw.before_event,
        trace.events.size()));
  }
  if (sw.release_again_before_event &&
      (*sw.release_again_before_event <= sw.before_event ||
       *sw.release_again_before_event > trace.events.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a second release before event %d of a trace of %d events, switched before event %d",
        *sw.release_again_before_event, trace.events.size(), sw.before_event));
  }
  if (config.backend == AllocatorBackend::kCudaMallocAsync ||
      (sw.config && sw.config->backend != config.backend)) {
    return absl::InvalidArgumentError(
        "a running process cannot switch to or from backend:cudaMallocAsync "
        "(the backend is fixed when libc10_cuda loads)");
  }
  return absl::OkStatus();
}

absl::Status BadEvent(uint64_t index, const TraceEvent& event,
                      const char* what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("trace event %d (id %d): %s", index, event.id, what));
}

// The counters of `stats` as a phase that starts at `first_event`; the
// caller subtracts where the phase began.
ReplayPhase PhaseCounters(const DeviceStats& stats, uint64_t first_event) {
  ReplayPhase p;
  p.first_event = first_event;
  p.reserved_at_start = stats.reserved_bytes.all().current;
  p.peak_reserved = stats.reserved_bytes.all().peak;
  p.peak_allocated = stats.allocated_bytes.all().peak;
  p.peak_requested = stats.requested_bytes.all().peak;
  p.num_device_alloc = stats.num_device_alloc;
  p.num_device_free = stats.num_device_free;
  p.num_alloc_retries = stats.num_alloc_retries;
  p.num_ooms = stats.num_ooms;
  p.num_sync_all_streams = stats.num_sync_all_streams;
  return p;
}

// Splits a replay at a LiveSwitch: the counters before it, the switch
// itself, and the counters since.
class SwitchSplitter {
 public:
  explicit SwitchSplitter(const std::optional<LiveSwitch>& live_switch)
      : switch_(live_switch) {}

  // Called before each event and once after the last one.
  void Before(uint64_t event, CachingAllocator& allocator,
              const ReplayResult& result) {
    if (!switch_) return;
    if (done_ && switch_->config && switch_->release_again_before_event == event) {
      allocator.EmptyCache();
    }
    if (done_ || event != switch_->before_event) return;
    done_ = true;
    before_ = PhaseCounters(allocator.Stats(), 0);
    before_.reserved_at_start = 0;
    before_.first_oom_event = result.first_oom_event;
    start_ = PhaseCounters(allocator.Stats(), event);
    if (switch_->config) {
      allocator.Reconfigure(*switch_->config);
      if (switch_->memory_fraction) allocator.SetMemoryFraction(*switch_->memory_fraction);
      allocator.EmptyCache();
    }
    start_.reserved_at_start = allocator.Stats().reserved_bytes.all().current;
    allocator.ResetPeakStats();
  }

  void OnOom(uint64_t event) {
    if (done_ && !first_oom_after_) first_oom_after_ = event;
  }

  // After CopyCounters: the phases, and the whole replay's peaks.
  void Finish(const DeviceStats& stats, ReplayResult& result) const {
    if (!done_) return;
    ReplayPhase after = PhaseCounters(stats, start_.first_event);
    after.reserved_at_start = start_.reserved_at_start;
    after.num_device_alloc -= start_.num_device_alloc;
    after.num_device_free -= start_.num_device_free;
    after.num_alloc_retries -= start_.num_alloc_retries;
    after.num_ooms -= start_.num_ooms;
    after.num_sync_all_streams -= start_.num_sync_all_streams;
    after.first_oom_event = first_oom_after_;
    result.peak_reserved = std::max(before_.peak_reserved, after.peak_reserved);
    result.peak_allocated = std::max(before_.peak_allocated, after.peak_allocated);
    result.peak_requested = std::max(before_.peak_requested, after.peak_requested);
    result.before_switch = before_;
    result.after_switch = after;
  }

 private:
  const std::optional<LiveSwitch>& switch_;
  bool done_ = false;
  ReplayPhase before_;
  ReplayPhase start_;  // accumulated counters before the switch's own work
  std::optional<uint64_t> first_oom_after_;
};

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

// Trace::partial's state at the first event, as the engine adopts it.
std::vector<AdoptedSegment> InitialSegments(const PartialTrace& partial) {
  std::vector<AdoptedSegment> segments;
  auto block = partial.blocks.begin();
  for (const InitialSegment& s : partial.segments) {
    AdoptedSegment& adopted = segments.emplace_back(AdoptedSegment{
        s.address, s.size, s.stream, s.is_small, {}, s.is_expandable});
    for (; block != partial.blocks.end() && block->address < s.address + s.size;
         ++block) {
      adopted.blocks.push_back(AdoptedBlock{block->address, block->size,
                                            block->requested_size,
                                            block->free_requested});
    }
  }
  return segments;
}

// Seeds `allocator` (on `simulated`) with the memory a partial trace's first
// event found, and marks those blocks' ids live.
absl::Status AdoptInitialState(const PartialTrace& partial,
                               SimBackend* simulated,
                               CachingAllocator& allocator,
                               std::vector<Allocation>& allocations,
                               std::vector<IdState>& states) {
  if (simulated == nullptr) {
    return absl::InvalidArgumentError(
        "this partial trace starts with memory already allocated, which only "
        "a simulated device can hold: replay it without a live device");
  }
  const std::vector<AdoptedSegment> segments = InitialSegments(partial);
  uint64_t reserved = 0;
  for (const AdoptedSegment& s : segments) reserved += s.size;
  for (const AdoptedSegment& s : segments) {
    if (absl::Status st = simulated->AdoptRange(s.address, s.size); !st.ok()) {
      if (!absl::IsResourceExhausted(st)) return st;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the trace is partial: its first event found %d bytes reserved, "
          "more than the device's %d",
          reserved, simulated->capacity()));
    }
  }
  absl::StatusOr<std::vector<Allocation>> adopted = allocator.Adopt(segments);
  if (!adopted.ok()) return adopted.status();
  // Adopt returns the blocks in address order, as partial.blocks are.
  for (size_t i = 0; i < partial.blocks.size(); ++i) {
    const InitialBlock& block = partial.blocks[i];
    if (block.id >= allocations.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "initial block id %d is out of range", block.id));
    }
    allocations[block.id] = (*adopted)[i];
    states[block.id] =
        block.free_requested ? IdState::kFreeRequested : IdState::kLive;
  }
  return absl::OkStatus();
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
  if (trace.partial.reconstructed()) {
    if (absl::Status s = AdoptInitialState(
            trace.partial, simulated ? &*simulated : nullptr, allocator,
            allocations, states);
        !s.ok()) {
      return s;
    }
  }
  TimelineRecorder timeline(trace.events.size(), options.timeline_samples);
  SwitchSplitter splitter(options.live_switch);

  const auto start = std::chrono::steady_clock::now();
  uint64_t i = 0;
  for (; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.id >= trace.num_ids) return BadEvent(i, e, "id out of range");
    IdState& state = states[e.id];
    splitter.Before(i, allocator, result);
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
          splitter.OnOom(i);
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
  SetRunTotals(start, i, result);
  if (i == trace.events.size()) splitter.Before(i, allocator, result);
  timeline.Finish(i, allocator.Stats(), result.timeline);
  CopyCounters(allocator.Stats(), result);
  splitter.Finish(allocator.Stats(), result);
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
  if (absl::Status s = CheckOptions(trace, config, options); !s.ok()) return s;
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
