// RestartAdoption: what a restarted daemon does before it promises memory
// again. The sessions of the daemon before re-declare the chunks they
// still hold (NodePool::Adopt); new memory waits until they have, or the
// adoption window has passed (AdoptionWindow). Then, once — settling —
// each device's pool capacity is fitted to what the device can give
// (DeviceAtStart).
//
// A declaration is believed only as far as the daemon's own sessions file
// goes: inside the window, and for chunks the daemon before handed to the
// declaring session's tenant (the same id, size and device), each once.
// Everything else is refused and its FD closed at once, so a client can
// neither make the pool count memory it never handed out nor make the
// daemon hold FDs of its making: a tenant's declarations leave the daemon
// holding at most the FDs of the chunks the daemon before handed it.
//
// Meanwhile the sessions file keeps the pids of live sessions and the
// chunks they hold, and of the daemon before's sessions and chunks still
// awaited, for the next daemon.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_RESTART_ADOPTION_H_
#define ALLOCD_SERVER_RESTART_ADOPTION_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
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
    // Where the pids of live sessions and the chunks they hold are kept for
    // the next daemon; empty: nowhere, and no adoption window.
    std::string sessions_file;
    // The longest new memory waits, from the start, for the sessions of
    // the daemon before to re-declare their chunks.
    absl::Duration window;
    // Each device's memory at start, by node device (missing ones: no
    // device, nothing fitted).
    std::vector<DeviceAtStart> devices_at_start;
    // The most often the file is rewritten whole because chunks changed
    // hands (SaveChunks); grants are appended to it as they are made.
    absl::Duration save_chunks_every = absl::Milliseconds(250);
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

  // What a pool makes of a declaration (NodePool::Adopt).
  using AdoptFn =
      absl::FunctionRef<absl::StatusOr<AdoptOutcome>(std::vector<DeclaredChunk>)>;
  // A session of `tenant` on `device` declares `chunks`. While the window
  // is open, those the sessions file lists for `tenant` on that device, as
  // that size, and not adopted since, go to `adopt` (which checks their
  // proofs, the capacity and the quotas); the others are refused, with why,
  // their FDs closed before this returns. Once the window has closed (or
  // with no window at all) every chunk is refused. `adopt`'s error is
  // returned as it is.
  absl::StatusOr<AdoptOutcome> Declare(const TenantId& tenant,
                                       const DevicePool& device,
                                       std::vector<DeclaredChunk> chunks,
                                       AdoptFn adopt)
      ABSL_LOCKS_EXCLUDED(settle_mu_);
  // A session of `pid` finished declaring what it holds: no longer
  // awaited. Settles when it was the last.
  void FinishedDeclaring(pid_t pid) ABSL_LOCKS_EXCLUDED(settle_mu_);
  // Stops waiting for processes that died; closes the window at its
  // deadline, and then settles. Rewrites the sessions file when chunks
  // changed hands (SaveChunks). Called periodically.
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(settle_mu_);

  // Session `tenant`'s grant of chunks `ids` (of `sizes`) on `device`:
  // listed in the sessions file before the grant is answered, so that a
  // crash right after it loses none (AppendHandedChunks). Errors are
  // logged: such a chunk is then refused after a restart.
  void Granted(const TenantId& tenant, const DevicePool& device,
               absl::Span<const uint64_t> ids,
               absl::Span<const uint64_t> sizes) ABSL_LOCKS_EXCLUDED(file_mu_);
  // Writes the sessions file: the pids of live sessions and the chunks
  // they hold, and the daemon before's sessions and chunks still awaited.
  // Call whenever a session starts or ends. Errors are logged: the daemon
  // runs on without the file.
  void SaveSessions() ABSL_LOCKS_EXCLUDED(file_mu_, settle_mu_);
  // The daemon shuts down: writes the file a last time; from now on it
  // keeps the sessions the shutdown ends and their chunks, whose processes
  // live on and will declare them to the next daemon.
  void ShutDown() ABSL_LOCKS_EXCLUDED(file_mu_, settle_mu_);

 private:
  // Once the window has closed (at most once): fits each device's
  // capacity to its memory at start.
  void Settle() ABSL_LOCKS_EXCLUDED(settle_mu_);
  // Fits `device`'s capacity to its free memory at start plus what its
  // pool adopted.
  void FitCapacity(const DevicePool& device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(settle_mu_);
  // SaveSessions when chunks changed hands since the file was last
  // written (NodePool::holdings_version) and save_chunks_every has
  // passed since.
  void SaveChunks(absl::Time now) ABSL_LOCKS_EXCLUDED(file_mu_, settle_mu_);
  // Every pool's holdings version, summed: changes whenever chunks do.
  uint64_t HoldingsVersion() const;

  const Options options_;
  const DevicePools* const pools_;
  const SessionRegistry* const sessions_;
  Metrics* const metrics_;
  // What the daemon before left; its sessions are the window's.
  SessionsFile before_;
  AdoptionWindow window_;
  std::atomic<bool> shutting_down_{false};
  // Acquires wait on it for the first settler to finish: none may create
  // memory before the capacity is what the device can give. Declarations
  // hold it, so that none is adopted after the capacity was fitted.
  absl::Mutex settle_mu_;
  bool settled_ ABSL_GUARDED_BY(settle_mu_) = false;
  // The chunks the daemon before handed out and nobody has adopted yet, by
  // tenant, then device and id: their sizes. Emptied when the window
  // closes.
  std::map<TenantId, std::map<std::pair<std::string, uint64_t>, uint64_t>>
      awaited_chunks_ ABSL_GUARDED_BY(settle_mu_);
  // By node device: what the capacity was raised by for the window (see
  // the constructor), taken back when it is fitted.
  std::map<int, uint64_t> raised_for_window_ ABSL_GUARDED_BY(settle_mu_);
  // One writer of the sessions file at a time, each with the state as it
  // is then: the last write is the newest.
  absl::Mutex file_mu_;
  // The file as last written, open for appending (Granted); invalid
  // before the first write or after a failed one.
  UniqueFd journal_ ABSL_GUARDED_BY(file_mu_);
  // The holdings version and time of the last write.
  uint64_t saved_version_ ABSL_GUARDED_BY(file_mu_) = 0;
  absl::Time saved_at_ ABSL_GUARDED_BY(file_mu_) = absl::InfinitePast();
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_RESTART_ADOPTION_H_
