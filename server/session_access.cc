#include "server/session_access.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace allocd {

SessionAccess::SessionAccess(const SessionRegistry* sessions,
                             std::vector<uid_t> admin_uids)
    : sessions_(sessions), admin_uids_(std::move(admin_uids)) {}

absl::StatusOr<std::shared_ptr<Session>> SessionAccess::OwnedSession(
    const PeerCredentials& peer, SessionId id) const {
  std::shared_ptr<Session> session = sessions_->Find(id);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no session ", id,
                                            " (ended, or never registered)"));
  }
  if (session->identity().pid != peer.pid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", id, " belongs to pid ",
                     session->identity().pid, ", not to pid ", peer.pid));
  }
  return session;
}

absl::Status SessionAccess::CheckAdmin(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == geteuid()) return absl::OkStatus();
  if (std::find(admin_uids_.begin(), admin_uids_.end(), peer.uid) !=
      admin_uids_.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", peer.uid,
      " may not administer allocd (root, the daemon's uid, or --admin-uid)"));
}

}  // namespace allocd
