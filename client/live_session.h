// LiveSession: the client's control loop, one for every mode. What a
// process does between allocations, at its safe points, for the allocator
// it runs (AllocatorTarget: allocd's engine, or PyTorch's own driven from
// Python): applies the configs the daemon pushes (ConfigApplier), releases
// the cache at the switch and once more after it (SecondRelease), answers
// reclaim requests by releasing what the daemon asks of the cache, publishes the allocator's stats,
// and reports OOMs.
//
// Not thread-safe, except AtStepMark and ReportOom, which the job's own
// thread may call while another polls. Call the rest where the allocator
// is not in use (under the allocator's lock, between trace events, from
// one session thread).
#ifndef ALLOCD_CLIENT_LIVE_SESSION_H_
#define ALLOCD_CLIENT_LIVE_SESSION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/config.h"
#include "client/allocator_target.h"
#include "client/config_applier.h"
#include "client/daemon_client.h"
#include "client/second_release.h"
#include "nlohmann/json.hpp"

namespace allocd {

class LiveSession {
 public:
  // `client` outlives the session; `config` is what the allocator starts
  // with (config version 0). Stats are published at most once a
  // `telemetry_period` by Poll (zero: at every Poll).
  LiveSession(DaemonClient& client, AllocatorConfig config,
              absl::Duration telemetry_period = absl::Milliseconds(50));

  // Handles every control message waiting, then, if `telemetry_period` has
  // passed since they last were, publishes `target`'s stats and makes the
  // second release a job that marks no steps is due.
  void Poll(AllocatorTarget& target);
  // Publishes the allocator's `stats` (torch.cuda.memory_stats() names)
  // now, as at the end of a run.
  void Publish(std::map<std::string, int64_t> stats);
  // The job marked a step: the second release a push left pending is made.
  // Thread-safe.
  void AtStepMark(AllocatorTarget& target);
  // Tells the daemon that an allocation of `bytes` failed; `message` is
  // PyTorch's "CUDA out of memory" text. Thread-safe.
  void ReportOom(uint64_t bytes, absl::string_view message);

  // The config the allocator runs now and the version it came with (as
  // the daemon connected now knows it), and why the daemon pushed it.
  const AllocatorConfig& config() const { return applier_.config(); }
  uint64_t config_version() const { return client_.running_version(); }
  const std::string& config_reason() const { return applier_.reason(); }
  int64_t configs_applied() const { return applier_.applied(); }
  int64_t configs_rejected() const { return applier_.rejected(); }
  // Reclaim requests the process answered (with what it read ahead, or
  // the allocator's cache).
  int64_t reclaims() const { return client_.reclaims(); }
  int64_t ooms_reported() const { return ooms_.load(); }
  int64_t second_releases() const { return second_release_.releases(); }

  // The session as every report of it names it (allocd.stats() in every
  // mode, `allocd client-replay`; docs/gpu.md): session_id, reconnects,
  // config, config_version, config_reason, start_config_source,
  // stream_from_reserved, stream_demands, stream_demanded_from_reserved,
  // stream_demand_reason,
  // configs_applied, configs_rejected, reclaims, ooms_reported,
  // events_dropped.
  nlohmann::json Report() const;

 private:
  DaemonClient& client_;
  const absl::Duration telemetry_period_;
  ConfigApplier applier_;
  SecondRelease second_release_;
  std::atomic<bool> marks_steps_ = false;
  std::atomic<int64_t> ooms_ = 0;
  absl::Time last_telemetry_ = absl::InfinitePast();
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_LIVE_SESSION_H_
