// Reconnector: the session thread, which keeps the process registered with
// the node daemon.
//
// While a connection serves, the thread reads its control stream
// (ControlStream::Watch); the stream ends only when the daemon or the
// session went away. Then it reconnects with exponential backoff
// (reconnect_min up to reconnect_max) and registers a new session (the
// epoch goes up), declaring the config the process runs (SetRunning), so a
// restarted daemon does not push it again. Before the new session serves
// any call it re-declares every chunk the process holds
// (HeldChunks::DeclareTo), forgets the control messages the lost daemon
// sent, and has the working set sent again.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_RECONNECTOR_H_
#define ALLOCD_CLIENT_RECONNECTOR_H_

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/control_stream.h"
#include "client/daemon_client_options.h"
#include "client/daemon_connection.h"
#include "client/held_chunks.h"
#include "client/telemetry_stream.h"

namespace allocd {

class Reconnector {
 public:
  // What a new session is made ready with, and served on; all outlive the
  // reconnector.
  struct Parts {
    ActiveConnection& active;
    HeldChunks& held;
    ControlStream& control;
    TelemetryStream& telemetry;
  };
  // Starts the session thread on `parts.active`'s first connection.
  Reconnector(const DaemonClientOptions& options, Parts parts);
  // Stop()s.
  ~Reconnector();
  Reconnector(const Reconnector&) = delete;
  Reconnector& operator=(const Reconnector&) = delete;

  // Stops `active` (ending the watch and every wait for a connection) and
  // waits for the thread.
  void Stop();

  // The config the process runs now (canonical) and the version it came
  // with, after applying a push: declared again when the client registers
  // anew, so a restarted daemon knows it and pushes nothing twice.
  void SetRunning(std::string config, uint64_t version)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The version to report the running config under: the one SetRunning
  // gave, or the one a new daemon registered it as after a reconnect.
  uint64_t running_version() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // Registers a new session and serves it; false when none answered.
  bool Reconnect() ABSL_LOCKS_EXCLUDED(mu_);

  const DaemonClientOptions& options_;
  const Parts parts_;

  mutable absl::Mutex mu_;
  RunningConfig running_ ABSL_GUARDED_BY(mu_);
  // Bumped by every SetRunning, so a registration that declared an older
  // config does not overwrite a newer version.
  uint64_t running_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_RECONNECTOR_H_
