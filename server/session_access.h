// SessionAccess: who a caller is to the daemon, and what it may act on.
// A caller is who the kernel says it is (PeerCredentials, SO_PEERCRED on
// the connection), never what it claims; every call that names a session,
// and every Admin call, asks here first.
//
// Rules:
// - a session belongs to a tenant (TenantResolver: the peer's uid, its pod,
//   or the node), fixed when it registers; a peer whose tenant cannot be
//   told (pid 0, but under --tenancy node) may not register;
// - a session is proven by its secret (Session::secret) AND by the peer:
//   the pid and uid that registered it (and so its tenant, which they
//   determine). A call that fails either, and a call naming a session that
//   ended or never was, get the same answer: the caller learns nothing of
//   sessions it does not hold;
// - root, the daemon's own uid, the uids given as --admin-uid and the
//   members of --admin-group may administer the daemon (over the admin
//   socket only: grpc_services.h).
//
// Thread-safe: it reads the registry (which locks itself) and constants.
#ifndef ALLOCD_SERVER_SESSION_ACCESS_H_
#define ALLOCD_SERVER_SESSION_ACCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ipc/unix_socket.h"
#include "server/session_id.h"
#include "server/session_registry.h"
#include "server/tenant.h"
#include "server/tenant_id.h"

namespace allocd {

struct SessionAccessOptions {
  Tenancy tenancy = Tenancy::kUid;
  // May administer besides root and the daemon's uid.
  std::vector<uid_t> admin_uids;
  std::optional<gid_t> admin_gid;
  // Where /proc is (tests give a directory of their own).
  std::string proc = "/proc";
};

class SessionAccess {
 public:
  // `sessions` outlives this.
  SessionAccess(const SessionRegistry* sessions, SessionAccessOptions options);

  // The tenant a session `peer` registers belongs to; TenantResolver's
  // errors (a pid-0 peer: FailedPrecondition saying what to set).
  absl::StatusOr<TenantId> TenantOf(const PeerCredentials& peer) const;

  // Session `id`, for `peer` to act on, proven by `secret`. NotFound, the
  // same for every cause (ended, never was, another process's, another
  // secret), and telling a client that lost its session to register again.
  absl::StatusOr<std::shared_ptr<Session>> OwnedSession(
      const PeerCredentials& peer, SessionId id,
      absl::string_view secret) const;

  // OK when `peer` may administer the daemon; PermissionDenied saying who
  // may otherwise.
  absl::Status CheckAdmin(const PeerCredentials& peer) const;

  Tenancy tenancy() const { return tenants_.tenancy(); }

 private:
  // Whether `peer`'s groups (its gid, or, read from /proc/PID/status, a
  // supplementary one) include --admin-group.
  bool InAdminGroup(const PeerCredentials& peer) const;

  const SessionRegistry* const sessions_;
  const SessionAccessOptions options_;
  const TenantResolver tenants_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_ACCESS_H_
