#include "client/live_session.h"

#include <utility>

#include "absl/time/clock.h"
#include "allocator/stats.h"

namespace allocd {

LiveSession::LiveSession(DaemonClient& client, AllocatorConfig config,
                         absl::Duration telemetry_period)
    : client_(client),
      telemetry_period_(telemetry_period),
      applier_(client, std::move(config)) {}

void LiveSession::Poll(CachingAllocator& allocator) {
  for (v1::ControlMessage& m : client_.TakeControl()) {
    if (m.has_config()) {
      applier_.Apply(m.config(), [&allocator](const AllocatorConfig& config) {
        allocator.Reconfigure(config);
        allocator.EmptyCache();
        return absl::OkStatus();
      });
    }
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
          {"config", FormatAllocatorConfig(config())},
          {"config_version", config_version()},
          {"config_reason", config_reason()},
          {"configs_applied", configs_applied()},
          {"configs_rejected", configs_rejected()},
          {"reclaims", reclaims_},
          {"ooms_reported", ooms_},
          {"events_dropped", client_.events() == nullptr
                                 ? 0
                                 : client_.events()->dropped_total()}};
}

}  // namespace allocd
