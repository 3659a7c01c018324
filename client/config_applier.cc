#include "client/config_applier.h"

#include <utility>

#include "absl/status/statusor.h"

namespace allocd {

ConfigApplier::ConfigApplier(DaemonClient& client, AllocatorConfig running)
    : client_(client), config_(std::move(running)) {}

bool ConfigApplier::Apply(const v1::ConfigPush& push, Target target) {
  const uint64_t version = push.config().version();
  absl::StatusOr<AllocatorConfig> parsed =
      ParseAllocatorConfig(push.config().config());
  absl::Status status = parsed.status();
  if (status.ok() && parsed->backend != config_.backend) {
    status = absl::FailedPreconditionError(
        "backend cannot change in a running process");
  }
  if (status.ok()) status = target(*parsed);
  if (!status.ok()) {
    ++rejected_;
    (void)client_.Ack(version, false, status.message());
    return false;
  }
  config_ = *std::move(parsed);
  reason_ = push.reason();
  client_.SetRunning(FormatAllocatorConfig(config_), version);
  ++applied_;
  (void)client_.Ack(version, true, "");
  return true;
}

}  // namespace allocd
