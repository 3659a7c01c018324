// AdoptionWindow: after a daemon restart, new memory waits until the
// sessions of the daemon before have re-declared the chunks they still hold
// (NodePool::Adopt), so the pool never promises anyone memory a surviving
// job maps.
//
// Which sessions to wait for, and which chunks they may declare, come from
// the sessions file: every daemon keeps there, while it runs, the pids of
// its live sessions (one line per session) and the chunks it handed to
// each tenant, and leaves them when it dies or shuts down. The file is the
// daemon's own: written 0600, and read only when this user owns it and
// nobody else may write it (a client that could write it could name any
// chunk). The window closes
// when each of those processes that is still alive has finished its
// declaration (as many times as it had sessions), or at the deadline,
// whichever comes first; a process that dies meanwhile is not waited for.
// Without a file (a first start), or with no live process in it, there is
// no window.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_ADOPTION_WINDOW_H_
#define ALLOCD_SERVER_ADOPTION_WINDOW_H_

#include <sys/types.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ipc/unix_socket.h"
#include "server/tenant_id.h"

namespace allocd {

// Sessions by pid: how many sessions each process has (or had).
using SessionsByPid = std::map<pid_t, int>;

// A chunk the daemon handed to a session: a restarted daemon adopts a
// declared chunk only when the file lists it, for the declaring session's
// tenant, with the same id, size and device.
struct HandedChunk {
  // The GPU UUID of the pool it came from.
  std::string device;
  uint64_t id = 0;
  // Its size, which is its class (each chunk is one class's size).
  uint64_t bytes = 0;
  friend bool operator==(const HandedChunk&, const HandedChunk&) = default;
  friend auto operator<=>(const HandedChunk&, const HandedChunk&) = default;
};

// What a daemon keeps for the next one.
struct SessionsFile {
  SessionsByPid sessions;
  // By tenant.
  std::map<TenantId, std::vector<HandedChunk>> chunks;
};

// The sessions file's processes that are still alive (`alive` tells), and
// every chunk it lists. NotFound for no file (a first start);
// PermissionDenied for one that is not a regular file of this process's
// user, private to it (group or others may read or write it): it is not
// this daemon's, and nothing in it is believed. Lines it does not know are
// skipped; a chunk may be listed twice (appended after the file listed it).
absl::StatusOr<SessionsFile> ReadSessionsFile(
    const std::string& path, const std::function<bool(pid_t)>& alive);
// Replaces the file (atomically: a crash leaves the old or the new one),
// mode 0600, and returns it open for appending (AppendHandedChunks).
// Errors are the caller's to log; the daemon runs on without the file.
absl::StatusOr<UniqueFd> WriteSessionsFile(const std::string& path,
                                           const SessionsFile& contents);
// Lists `chunks`, handed to `tenant`, in the file `fd` (WriteSessionsFile's)
// with one write(): cheap enough to do before each grant is answered, so
// that the daemon's crash right after never loses one (the kernel keeps
// what was written; not fsync'ed: the file must outlive the daemon, not
// the machine). InternalError for a failed or short write.
absl::Status AppendHandedChunks(int fd, const TenantId& tenant,
                                const std::vector<HandedChunk>& chunks);
// Whether process `pid` exists (kill(pid, 0)).
bool ProcessAlive(pid_t pid);

class AdoptionWindow {
 public:
  // Open until `deadline` while `expected` is not empty; `alive` tells
  // whether a process still exists (tests replace it).
  AdoptionWindow(SessionsByPid expected, absl::Time deadline,
                 std::function<bool(pid_t)> alive = ProcessAlive);

  // A session of `pid` finished declaring what it holds.
  void Returned(pid_t pid);
  // Stops waiting for processes that died; closes the window at its
  // deadline. Called periodically.
  void Tick(absl::Time now);
  // Blocks until the window is closed (at most until its deadline).
  void Wait();
  bool open() const;
  // The processes still waited for (their sessions).
  SessionsByPid pending() const;

 private:
  void CloseIfDone(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Time deadline_;
  const std::function<bool(pid_t)> alive_;
  mutable absl::Mutex mu_;
  SessionsByPid pending_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_ADOPTION_WINDOW_H_
