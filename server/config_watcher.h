// ConfigWatcher: keeps the daemon in step with its config file (in
// Kubernetes a mounted ConfigMap, which the kubelet swaps through a
// symlink). It reads the file every `period`; when the content changed and
// is valid, the daemon pushes the configs that changed, falls jobs whose
// entry was removed back to the default, and replaces the uid and tenant
// quotas. A file that does not parse changes nothing: the error is logged
// and counted, and the last good file stays in force.
#ifndef ALLOCD_SERVER_CONFIG_WATCHER_H_
#define ALLOCD_SERVER_CONFIG_WATCHER_H_

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/config_file.h"
#include "server/daemon_autotune.h"
#include "server/daemon_core.h"
#include "server/metrics.h"

namespace allocd {

class ConfigWatcher {
 public:
  // Applies `path` once; an error here is the daemon's start-up error.
  // `autotune` (may be null) gets the file's autotune section.
  static absl::StatusOr<std::unique_ptr<ConfigWatcher>> Start(
      std::string path, absl::Duration period, DaemonCore* core,
      DaemonAutotune* autotune, Metrics* metrics);
  ~ConfigWatcher();

  // Reads the file now and applies it if it changed. OK when unchanged or
  // applied; the parse error otherwise (counted in the metrics; the last
  // good file stays in force).
  absl::Status Reload();

 private:
  ConfigWatcher(std::string path, absl::Duration period, DaemonCore* core,
                DaemonAutotune* autotune, Metrics* metrics);
  void Loop();
  void Apply(const NodeConfigFile& next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const absl::Duration period_;
  DaemonCore* const core_;
  DaemonAutotune* const autotune_;
  Metrics* const metrics_;
  absl::Mutex mu_;
  std::string last_text_ ABSL_GUARDED_BY(mu_);
  NodeConfigFile applied_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_CONFIG_WATCHER_H_
