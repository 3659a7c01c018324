#include "tools/allocd/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <ostream>

#include "absl/time/time.h"
#include "tools/allocd/common.h"
#include "tools/common/cli.h"

namespace allocd {

int RunServe(const ServeCommandOptions& options, std::ostream& err) {
  // Signals are taken synchronously by this thread: block them before the
  // daemon starts threads, which inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that vanishes mid-write must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);

  DaemonOptions daemon_options = options.daemon;
  // Not refused: a daemon that will not start over a flag whose safe
  // replacement costs a few ms per GiB would take every job on the node
  // down with it at the next upgrade; one that starts and says so costs
  // nothing but the scrub's saving.
  if (options.cross_tenant_reuse == "scrub") {
    err << "allocd serve: notice: --cross-tenant-reuse scrub is no longer "
           "offered: the daemon cannot show that no process still maps a "
           "chunk (a fork child, an FD passed on), so another tenant's "
           "cached memory is destroyed and created again (recreate, 0.7-24 "
           "ms per GiB on an H200). Drop the flag to silence this\n";
  }
  // A percentage is of the device, which only the daemon's chunk sources
  // know: the daemon reads the sizes.
  daemon_options.capacity_size = options.capacity;
  if (!absl::ParseDuration(options.trim_after,
                           &daemon_options.trim.idle_after) ||
      daemon_options.trim.idle_after < absl::ZeroDuration()) {
    err << "allocd serve: --trim-after " << options.trim_after
        << " is not a duration: write e.g. 30s, 5m, 1h, or inf\n";
    return kExitUsage;
  }
  if (!absl::ParseDuration(options.adopt_window,
                           &daemon_options.adopt_window) ||
      daemon_options.adopt_window < absl::ZeroDuration() ||
      daemon_options.adopt_window == absl::InfiniteDuration()) {
    err << "allocd serve: --adopt-window " << options.adopt_window
        << " is not a finite duration: write e.g. 5s, 30s, or 0s\n";
    return kExitUsage;
  }
  if (!options.cache_high_water.empty()) {
    absl::StatusOr<uint64_t> high_water = ParseSizeFlag(
        "--cache-high-water", options.cache_high_water,
        {.no_percent_reason = "write the size, e.g. 16GiB"});
    if (!high_water.ok()) {
      err << "allocd serve: " << high_water.status().message() << "\n";
      return kExitUsage;
    }
    daemon_options.trim.high_water = *high_water;
  }
  absl::StatusOr<uint64_t> autotune_memory =
      ParseSizeFlag("--autotune-memory", options.autotune_memory,
                    {.no_percent_reason = "write the size, e.g. 256MiB"});
  if (!autotune_memory.ok()) {
    err << "allocd serve: " << autotune_memory.status().message() << "\n";
    return kExitUsage;
  }
  daemon_options.autotune_memory = *autotune_memory;
  if (!options.autotune_memory_per_tenant.empty()) {
    absl::StatusOr<uint64_t> share = ParseSizeFlag(
        "--autotune-memory-per-tenant", options.autotune_memory_per_tenant,
        {.no_percent_reason = "write the size, e.g. 64MiB"});
    if (!share.ok()) {
      err << "allocd serve: " << share.status().message() << "\n";
      return kExitUsage;
    }
    daemon_options.autotune_memory_per_tenant = *share;
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Start(std::move(daemon_options));
  if (!daemon.ok()) {
    err << "allocd serve: " << daemon.status().message() << "\n";
    return 1;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace allocd
