// WatchedProcess: one client process, held by a pidfd, so that the node
// pool knows when it has exited -- the moment its FDs and mappings of the
// chunks it was given are gone, and a chunk it mapped may go to another
// tenant (scrubbed). A pidfd names the process itself, never a later one that
// reuses its pid.
//
// What it cannot see: processes the watched one handed a chunk's FD or
// mapping on (a fork()ed child inheriting a MAP_SHARED mapping, SCM_RIGHTS).
// Those are the watched process's own doing, inside its tenant; on a GPU a
// fork()ed child cannot use its parent's CUDA mappings at all.
//
// Thread-safe: Exited() may be called from any thread.
#ifndef ALLOCD_SERVER_POOL_WATCHED_PROCESS_H_
#define ALLOCD_SERVER_POOL_WATCHED_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <memory>

#include "ipc/unix_socket.h"

namespace allocd {

class WatchedProcess {
 public:
  // Process `pid` from now on (pidfd_open; a syscall). A pid that cannot be
  // watched -- 0 (a peer in another pid namespace), one already gone or
  // reused before this call, no pidfd support, no FD to spare -- gives a
  // process that never counts as exited: whatever it mapped never goes to
  // another tenant (the pool destroys such chunks instead of scrubbing them).
  static std::shared_ptr<const WatchedProcess> Watch(pid_t pid);

  // Whether the process has exited (its pidfd is readable: the kernel has
  // torn down its memory and FDs). Once true, true forever, with no more
  // syscalls; while false, one poll() per call.
  bool Exited() const;

  pid_t pid() const { return pid_; }
  // Whether a pidfd holds the process (false: Watch could not; never exits).
  bool watched() const { return pidfd_.valid(); }

  explicit WatchedProcess(pid_t pid, UniqueFd pidfd)
      : pid_(pid), pidfd_(std::move(pidfd)) {}

 private:
  const pid_t pid_;
  const UniqueFd pidfd_;
  mutable std::atomic<bool> exited_{false};
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_WATCHED_PROCESS_H_
