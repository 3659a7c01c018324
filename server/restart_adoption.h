// RestartAdoption: what a restarted daemon does before it promises memory
// again. The sessions of the daemon before re-declare the chunks they
// still hold (NodePool::Adopt); new memory waits until they have, or the
// adoption window has passed (AdoptionWindow). Then, once — settling —
// each device's pool capacity is fitted to what the device can give
// (DeviceAtStart). A declaration that comes later grows the fitted
// capacity by what it holds, up to a ceiling. Meanwhile the sessions file
// keeps the pids of live sessions, and of the daemon before's sessions
// still awaited, for the next daemon.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_RESTART_ADOPTION_H_
#define ALLOCD_SERVER_RESTART_ADOPTION_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/adoption_window.h"
#include "server/metrics.h"
#include "server/pool/device_pools.h"
#include "server/session_registry.h"

namespace allocd {

// A device's memory when the daemon started, for fitting its pool's
// capacity after a restart (RestartAdoption).
struct DeviceAtStart {
  // cuMemGetInfo's free at start; nullopt: no device (sim), nothing fitted.
  std::optional<uint64_t> free_memory;
  // The capacity was derived from `free_memory` (free minus --headroom, no
  // --capacity): the chunks surviving clients hold were in use at start,
  // so the capacity grows by what the pool adopts. Otherwise (--capacity
  // given) it is clipped, with a warning, to `free_memory` plus what the
  // pool adopted.
  bool capacity_from_free = false;
};

class RestartAdoption {
 public:
  struct Options {
    // Where the pids of live sessions are kept for the next daemon; empty:
    // nowhere, and no adoption window.
    std::string sessions_file;
    // The longest new memory waits, from the start, for the sessions of
    // the daemon before to re-declare their chunks.
    absl::Duration window;
    // Each device's memory at start, by node device (missing ones: no
    // device, nothing fitted).
    std::vector<DeviceAtStart> devices_at_start;
  };

  // Reads the sessions file the daemon before left and logs the processes
  // it waits for; settles at once when there are none. `pools`, `sessions`
  // and `metrics` outlive this.
  RestartAdoption(Options options, absl::Time started,
                  const DevicePools* pools, const SessionRegistry* sessions,
                  Metrics* metrics);

  // Whether new memory still waits for the sessions of the daemon before.
  bool open() const { return window_.open(); }
  // Blocks until the window is closed (at most until its deadline), then
  // settles: what an acquire does before it creates memory.
  void Await() ABSL_LOCKS_EXCLUDED(settle_mu_);
  // A session's declaration adopted `adopted_bytes` into `device`'s pool.
  // After settling, that memory was not free when the capacity was
  // fitted; the device gets it back when it is released, so the capacity
  // grows by it (up to the --capacity the fit clipped).
  void Adopted(const DevicePool& device, uint64_t adopted_bytes)
      ABSL_LOCKS_EXCLUDED(settle_mu_);
  // A session of `pid` finished declaring what it holds: no longer
  // awaited. Settles when it was the last.
  void FinishedDeclaring(pid_t pid) ABSL_LOCKS_EXCLUDED(settle_mu_);
  // Stops waiting for processes that died; closes the window at its
  // deadline, and then settles. Called periodically.
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(settle_mu_);

  // Writes the sessions file: the pids of live sessions, and of the daemon
  // before's sessions still awaited. Call whenever a session starts or
  // ends. Errors are logged: the daemon runs on without the file.
  void SaveSessions() ABSL_LOCKS_EXCLUDED(file_mu_);
  // The daemon shuts down: the file keeps the sessions the shutdown ends,
  // whose processes live on and will declare their chunks to the next
  // daemon.
  void ShutDown() { shutting_down_ = true; }

 private:
  // Once the window has closed (at most once): fits each device's
  // capacity to its memory at start.
  void Settle() ABSL_LOCKS_EXCLUDED(settle_mu_);
  // Fits `device`'s capacity to its free memory at start plus what its
  // pool adopted.
  void FitCapacity(const DevicePool& device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(settle_mu_);

  const Options options_;
  const DevicePools* const pools_;
  const SessionRegistry* const sessions_;
  Metrics* const metrics_;
  AdoptionWindow window_;
  std::atomic<bool> shutting_down_{false};
  // Acquires wait on it for the first settler to finish: none may create
  // memory before the capacity is what the device can give.
  absl::Mutex settle_mu_;
  bool settled_ ABSL_GUARDED_BY(settle_mu_) = false;
  // By node device, once settling fitted its capacity: the most a late
  // declaration grows it to (the --capacity it clipped, or unbounded for a
  // capacity derived from free memory).
  std::map<int, uint64_t> capacity_ceiling_ ABSL_GUARDED_BY(settle_mu_);
  // One writer of the sessions file at a time, each with the state as it
  // is then: the last write is the newest.
  absl::Mutex file_mu_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_RESTART_ADOPTION_H_
