#include "tools/allocd/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <ostream>

#include "tools/allocd/common.h"

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
  absl::StatusOr<uint64_t> capacity =
      ParseSizeFlag("--capacity", options.capacity,
                    {.no_percent_reason =
                         "the pool's --capacity is the memory jobs on the "
                         "node may share, not a part of one device"});
  if (!capacity.ok()) {
    err << "allocd serve: " << capacity.status().message() << "\n";
    return 1;
  }
  daemon_options.capacity = *capacity;
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
