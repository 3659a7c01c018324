// SessionAccess: who a caller is to the daemon, and what it may act on.
// A caller is who the kernel says it is (PeerCredentials, SO_PEERCRED on
// the connection), never what it claims; every call that names a session,
// and every Admin call, asks here first.
//
// Rules:
// - a session belongs to the pid that registered it: a call naming it
//   from any other pid is PermissionDenied;
// - root, the daemon's own uid and the uids given as --admin-uid may
//   administer the daemon.
//
// Thread-safe: it reads the registry (which locks itself) and constants.
#ifndef ALLOCD_SERVER_SESSION_ACCESS_H_
#define ALLOCD_SERVER_SESSION_ACCESS_H_

#include <sys/types.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ipc/unix_socket.h"
#include "server/session_id.h"
#include "server/session_registry.h"

namespace allocd {

class SessionAccess {
 public:
  // `sessions` outlives this; `admin_uids` may administer besides root and
  // the daemon's uid.
  SessionAccess(const SessionRegistry* sessions, std::vector<uid_t> admin_uids);

  // Session `id`, for `peer` to act on. NotFound when it ended or never
  // was; PermissionDenied, naming both pids, when another process
  // registered it.
  absl::StatusOr<std::shared_ptr<Session>> OwnedSession(
      const PeerCredentials& peer, SessionId id) const;

  // OK when `peer` may administer the daemon; PermissionDenied otherwise.
  absl::Status CheckAdmin(const PeerCredentials& peer) const;

 private:
  const SessionRegistry* const sessions_;
  const std::vector<uid_t> admin_uids_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_ACCESS_H_
