// ConfigApplier: the one way a process applies a config the daemon pushed,
// whatever allocator it runs: the engine (LiveSession) or PyTorch's own,
// driven from Python through the C ABI (allocd_poll); LiveSession drives it.
//
// A push is refused, NACKed with the reason, when it does not parse or
// names another backend than the process runs (PyTorch fixes the backend
// when it loads). Else the allocator takes it and empties its cache
// (Target); the client declares it as the config it runs (SetRunning, so a
// restarted daemon does not push it again) and ACKs it. A push the
// allocator refuses is NACKed with the allocator's error.
//
// Not thread-safe: call it where the allocator is not in use.
#ifndef ALLOCD_CLIENT_CONFIG_APPLIER_H_
#define ALLOCD_CLIENT_CONFIG_APPLIER_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "allocator/config.h"
#include "allocd.pb.h"
#include "client/daemon_client.h"

namespace allocd {

class ConfigApplier {
 public:
  // Makes the allocator run `config` from now on, then empties its cache:
  // blocks cached under the old rules would serve the next peak as the old
  // config cut them; released, the new config shapes it. An error when the
  // allocator refused `config`.
  using Target = absl::FunctionRef<absl::Status(const AllocatorConfig& config)>;

  // `client` outlives the applier; `running` is the config the allocator
  // starts with.
  ConfigApplier(DaemonClient& client, AllocatorConfig running);

  // Applies `push` to `target` and ACKs it, or NACKs it; whether it was
  // applied.
  bool Apply(const v1::ConfigPush& push, Target target);

  // The config the allocator runs now, and why the daemon pushed it.
  const AllocatorConfig& config() const { return config_; }
  const std::string& reason() const { return reason_; }
  // Pushes applied and refused so far.
  int64_t applied() const { return applied_; }
  int64_t rejected() const { return rejected_; }

 private:
  DaemonClient& client_;
  AllocatorConfig config_;
  std::string reason_ = "the config the process started with";
  int64_t applied_ = 0;
  int64_t rejected_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CONFIG_APPLIER_H_
