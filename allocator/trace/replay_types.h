// The vocabulary of a replay, shared by its drivers (replay.h runs a trace
// through the engine, async_pool_model.h estimates backend:cudaMallocAsync):
// what a replay is asked (ReplayOptions, a LiveSwitch) and what it reports
// (ReplayResult and its parts).
#ifndef ALLOCD_ALLOCATOR_TRACE_REPLAY_TYPES_H_
#define ALLOCD_ALLOCATOR_TRACE_REPLAY_TYPES_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "allocator/config.h"
#include "allocator/stats.h"

namespace allocd {

class DeviceBackend;
class ReplayObserver;

// A live reconfiguration just before trace event `before_event`, as a
// running PyTorch does it: torch.cuda.memory._set_allocator_settings(conf)
// (CachingAllocator::Reconfigure), optionally
// torch.cuda.set_per_process_memory_fraction, then torch.cuda.empty_cache().
struct LiveSwitch {
  // 0..trace size; at the size, the switch comes after the last event.
  uint64_t before_event = 0;
  // What the process holds after the update (ParseAllocatorConfigUpdate of
  // the pushed string on the running config). nullopt: no update and no
  // empty cache, only the counters are split there: what staying on the
  // config does over the same events.
  std::optional<AllocatorConfig> config;
  // The new cap; nullopt: the cap (if any) stays.
  std::optional<double> memory_fraction;
  // A second torch.cuda.empty_cache() just before this later event (after
  // `before_event`; with a `config` only): allocd's client releases the
  // cache again at the job's first step mark after a push, once what was
  // live at the switch is freed and the segments the old config cut can
  // go. nullopt: none.
  std::optional<uint64_t> release_again_before_event;
};

struct ReplayOptions {
  // Device memory the process can get (cudaMemGetInfo's free at start).
  // 0: unlimited.
  size_t capacity = 0;
  // The device's total memory, the base of `memory_fraction`; 0: capacity.
  size_t total_memory = 0;
  // torch.cuda.set_per_process_memory_fraction, called before the first
  // allocation.
  std::optional<double> memory_fraction;
  // Keep about this many (event, reserved, allocated) samples; 0: none.
  size_t timeline_samples = 0;
  // Stop at the first OOM instead of skipping the failed allocation (and its
  // frees) and going on, as a program that catches OutOfMemoryError would.
  bool stop_at_first_oom = false;
  // Told what the replay does, call by call (see replay_observer.h); not
  // owned. nullptr: nothing is reported and nothing is paid for it.
  ReplayObserver* observer = nullptr;
  // Replays on this device instead of a simulated one of `capacity` (a
  // live client replays on the node daemon's memory); not owned.
  DeviceBackend* device = nullptr;
  // Switch configs live at one point; ReplayResult then reports the
  // stretches before and after it apart. Not for backend:cudaMallocAsync,
  // which a running process cannot switch to or from.
  std::optional<LiveSwitch> live_switch;
};

// Memory at one point of the replay: the highs within the sampled stretch
// of events that ends at `event`.
struct TimelineSample {
  uint64_t event;
  int64_t reserved;
  int64_t allocated;
};

// What a replay counts: its peaks and the engine's device calls.
struct ReplayCounters {
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;
  int64_t peak_requested = 0;  // sizes as asked: what the job itself held
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  // Index of the trace event whose allocation hit the first OOM.
  std::optional<uint64_t> first_oom_event;

  bool operator==(const ReplayCounters&) const = default;
};

// The counters over one stretch of a replay split by a LiveSwitch. The
// switch's own work (the empty cache's device frees) counts after it; the
// peaks after it start from what the empty cache left reserved.
struct ReplayPhase : ReplayCounters {
  uint64_t first_event = 0;
  int64_t reserved_at_start = 0;

  bool operator==(const ReplayPhase&) const = default;
};

// The counters over the whole replay, and what it recorded.
struct ReplayResult : ReplayCounters {
  // Events replayed (all of them unless stop_at_first_oom or the observer
  // stopped early).
  uint64_t events = 0;
  // Wall time of the replay itself.
  double seconds = 0;
  // True for backend:cudaMallocAsync, whose pool is the CUDA driver's: the
  // numbers are a model's estimate, not PyTorch's rules.
  bool estimated = false;
  // At the end; with a live switch, its peaks are those after the switch.
  DeviceStats stats;
  std::vector<TimelineSample> timeline;
  // Set with ReplayOptions::live_switch (after_switch is empty when the
  // replay stopped before the switch point).
  std::optional<ReplayPhase> before_switch;
  std::optional<ReplayPhase> after_switch;
};

// What every replay driver (the engine's, the cudaMallocAsync model) says
// of its run: the `events` it replayed and its wall time since `start`.
void SetRunTotals(std::chrono::steady_clock::time_point start, uint64_t events,
                  ReplayResult& result);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_REPLAY_TYPES_H_
