#include "client/live_session.h"

#include <utility>

#include "absl/time/clock.h"

namespace allocd {
namespace {

// How long a push's ACK waits for the events before it to be sent (a
// write on a live stream takes well under a millisecond).
constexpr absl::Duration kAckFlushWait = absl::Milliseconds(200);

}  // namespace

LiveSession::LiveSession(DaemonClient& client, AllocatorConfig config,
                         absl::Duration telemetry_period)
    : client_(client),
      telemetry_period_(telemetry_period),
      applier_(client, std::move(config)) {}

void LiveSession::Poll(AllocatorTarget& target) {
  for (v1::ControlMessage& m : client_.TakeControl()) {
    if (m.has_config()) {
      applier_.Apply(m.config(), [&](const AllocatorConfig& config) {
        if (absl::Status s = target.Reconfigure(config); !s.ok()) return s;
        // Blocks cached under the old rules would serve the next peak as
        // the old config cut them: released, the new config shapes it.
        target.EmptyCache();
        second_release_.Switched(target);
        // Sent before the ACK: the daemon's watch of the push then starts
        // where the job switched, and the step the push landed in is the
        // job's first step mark after the ACK. Not waited for long: in
        // engine mode this runs on the job's thread, and a daemon gone
        // meanwhile must not hold it.
        Publish(target.Stats());
        (void)client_.FlushTelemetry(kAckFlushWait);
        return absl::OkStatus();
      });
    }
    if (m.has_reclaim()) {
      // What the daemon asks of the allocator (ControlStream took off what
      // the client read ahead); 0 from a daemon that asks everything.
      if (const uint64_t bytes = m.reclaim().bytes(); bytes != 0) {
        target.ReleaseCached(bytes);
      } else {
        target.EmptyCache();
      }
      // What is left cached, known now: a later reclaim counts it.
      Publish(target.Stats());
    }
  }
  if (absl::Now() - last_telemetry_ < telemetry_period_) return;
  std::map<std::string, int64_t> stats = target.Stats();
  Publish(stats);
  second_release_.AtRound(stats, marks_steps_.load(), target);
}

void LiveSession::Publish(std::map<std::string, int64_t> stats) {
  last_telemetry_ = absl::Now();
  client_.PublishStats(std::move(stats), config_version());
}

void LiveSession::AtStepMark(AllocatorTarget& target) {
  marks_steps_.store(true);
  second_release_.AtStepMark(target);
}

void LiveSession::ReportOom(uint64_t bytes, absl::string_view message) {
  ++ooms_;
  (void)client_.ReportOom(bytes, message, config_version());
}

nlohmann::json LiveSession::Report() const {
  const ControlStream::StreamDemands demands = client_.stream_demands();
  return {{"session_id", client_.session_id()},
          {"reconnects", client_.epoch() - 1},
          {"config", FormatAllocatorConfig(config())},
          {"config_version", config_version()},
          {"config_reason", config_reason()},
          {"start_config_source", client_.start_config_source()},
          {"stream_from_reserved", client_.stream_from_reserved()},
          {"stream_demands", demands.count},
          {"stream_demanded_from_reserved", demands.from_reserved},
          {"stream_demand_reason", demands.reason},
          {"configs_applied", configs_applied()},
          {"configs_rejected", configs_rejected()},
          {"reclaims", reclaims()},
          {"map_path", client_.map_path().ToJson()},
          {"ooms_reported", ooms_reported()},
          {"events_dropped", client_.events() == nullptr
                                 ? 0
                                 : client_.events()->dropped_total()}};
}

}  // namespace allocd
