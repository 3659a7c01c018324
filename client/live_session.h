// LiveSession: what a process that runs the engine on the daemon's memory
// does between allocations, at its safe points: applies the configs the
// daemon pushes (ConfigApplier, with the engine's live Reconfigure and
// EmptyCache), answers reclaim requests by emptying its cache, publishes
// its stats under PyTorch's names, and reports OOMs. `allocd client-replay`
// and liballocd_torch.so share it.
//
// Not thread-safe: call it where the allocator is not in use (under the
// allocator's lock, between trace events).
#ifndef ALLOCD_CLIENT_LIVE_SESSION_H_
#define ALLOCD_CLIENT_LIVE_SESSION_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "client/config_applier.h"
#include "client/daemon_client.h"
#include "nlohmann/json.hpp"

namespace allocd {

class LiveSession {
 public:
  // `client` outlives the session; `config` is what the allocator starts
  // with (config version 0).
  LiveSession(DaemonClient& client, AllocatorConfig config,
              absl::Duration telemetry_period = absl::Milliseconds(50));

  // Handles every control message waiting, then publishes the allocator's
  // stats if `telemetry_period` has passed since they last were.
  void Poll(CachingAllocator& allocator);
  // Publishes the allocator's stats now (and at the end of a run).
  void Publish(const CachingAllocator& allocator);
  // Tells the daemon that an allocation of `bytes` failed; `message` is
  // PyTorch's "CUDA out of memory" text.
  void ReportOom(uint64_t bytes, absl::string_view message);

  // The config the allocator runs now and the version it came with (as
  // the daemon connected now knows it), and why the daemon pushed it.
  const AllocatorConfig& config() const { return applier_.config(); }
  uint64_t config_version() const { return client_.running_version(); }
  const std::string& config_reason() const { return applier_.reason(); }
  int64_t configs_applied() const { return applier_.applied(); }
  int64_t configs_rejected() const { return applier_.rejected(); }
  int64_t reclaims() const { return reclaims_; }
  int64_t ooms_reported() const { return ooms_; }

  // The session as every report of it names it (allocd.stats() in every
  // mode, `allocd client-replay`; docs/gpu.md): session_id, reconnects,
  // config, config_version, config_reason, configs_applied,
  // configs_rejected, reclaims, ooms_reported, events_dropped.
  nlohmann::json Report() const;

 private:
  DaemonClient& client_;
  const absl::Duration telemetry_period_;
  ConfigApplier applier_;
  int64_t reclaims_ = 0;
  int64_t ooms_ = 0;
  absl::Time last_telemetry_ = absl::InfinitePast();
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_LIVE_SESSION_H_
