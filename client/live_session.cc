#include "client/live_session.h"

#include <utility>

#include "absl/time/clock.h"
#include "allocator/stats.h"

namespace allocd {

LiveSession::LiveSession(DaemonClient& client, AllocatorConfig config,
                         absl::Duration telemetry_period)
    : client_(client),
      telemetry_period_(telemetry_period),
      config_(std::move(config)) {}

void LiveSession::Poll(CachingAllocator& allocator) {
  for (v1::ControlMessage& m : client_.TakeControl()) {
    if (m.has_config()) Apply(m.config(), allocator);
    if (m.has_reclaim()) {
      allocator.EmptyCache();
      ++reclaims_;
    }
  }
  if (absl::Now() - last_telemetry_ >= telemetry_period_) Publish(allocator);
}

void LiveSession::Publish(const CachingAllocator& allocator) {
  last_telemetry_ = absl::Now();
  client_.PublishStats(MemoryStatsDict(allocator.Stats()), config_version());
}

void LiveSession::ReportOom(uint64_t bytes, absl::string_view message) {
  ++ooms_;
  (void)client_.ReportOom(bytes, message, config_version());
}

nlohmann::json LiveSession::Report() const {
  return {{"session_id", client_.session_id()},
          {"reconnects", client_.epoch() - 1},
          {"config", FormatAllocatorConfig(config_)},
          {"config_version", config_version()},
          {"config_reason", config_reason_},
          {"pushes_applied", applied_},
          {"pushes_rejected", rejected_},
          {"reclaims", reclaims_},
          {"ooms", ooms_},
          {"events_dropped", client_.events() == nullptr
                                 ? 0
                                 : client_.events()->dropped_total()}};
}

void LiveSession::Apply(const v1::ConfigPush& push,
                        CachingAllocator& allocator) {
  const uint64_t version = push.config().version();
  absl::StatusOr<AllocatorConfig> parsed =
      ParseAllocatorConfig(push.config().config());
  absl::Status status = parsed.status();
  if (status.ok() && parsed->backend != config_.backend) {
    status = absl::FailedPreconditionError(
        "backend cannot change in a running process");
  }
  if (!status.ok()) {
    ++rejected_;
    (void)client_.Ack(version, false, status.message());
    return;
  }
  allocator.Reconfigure(*parsed);
  // Blocks cached under the old rules would serve the next peak as the old
  // config cut them; released now, the new config shapes it.
  allocator.EmptyCache();
  config_ = *std::move(parsed);
  config_reason_ = push.reason();
  client_.SetRunning(FormatAllocatorConfig(config_), version);
  ++applied_;
  (void)client_.Ack(version, true, "");
}

}  // namespace allocd
