#include "server/session_access.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace allocd {

SessionAccess::SessionAccess(const SessionRegistry* sessions,
                             SessionAccessOptions options)
    : sessions_(sessions),
      options_(std::move(options)),
      tenants_(options_.tenancy, options_.proc) {}

absl::StatusOr<TenantId> SessionAccess::TenantOf(
    const PeerCredentials& peer) const {
  return tenants_.Resolve(peer);
}

absl::StatusOr<std::shared_ptr<Session>> SessionAccess::OwnedSession(
    const PeerCredentials& peer, SessionId id, absl::string_view secret) const {
  std::shared_ptr<Session> session = sessions_->Find(id);
  // The secret is compared whatever the rest says, so that the refusal
  // takes as long for an unknown session as for another's.
  const bool proven = session != nullptr && session->ProvenBy(secret);
  // The same pid and uid as at registration: the same process, so the
  // same tenant (a pid's pod and uid do not change while it lives, and its
  // lease ends the session when it exits).
  if (!proven || session->identity().pid != peer.pid ||
      session->identity().uid != peer.uid) {
    return absl::NotFoundError(absl::StrCat(
        "no session ", id,
        " of this process with that secret (it ended, e.g. the daemon "
        "restarted, or never was): register again"));
  }
  return session;
}

bool SessionAccess::InAdminGroup(const PeerCredentials& peer) const {
  if (!options_.admin_gid.has_value()) return false;
  if (peer.gid == *options_.admin_gid) return true;
  if (peer.pid == 0) return false;
  std::ifstream status(absl::StrCat(options_.proc, "/", peer.pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view groups = line;
    if (!absl::ConsumePrefix(&groups, "Groups:")) continue;
    for (absl::string_view group :
         absl::StrSplit(groups, absl::ByAnyChar(" \t"), absl::SkipEmpty())) {
      gid_t gid = 0;
      if (absl::SimpleAtoi(group, &gid) && gid == *options_.admin_gid) {
        return true;
      }
    }
  }
  return false;
}

absl::Status SessionAccess::CheckAdmin(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == geteuid()) return absl::OkStatus();
  if (std::find(options_.admin_uids.begin(), options_.admin_uids.end(),
                peer.uid) != options_.admin_uids.end() ||
      InAdminGroup(peer)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", peer.uid,
      " may not administer allocd (root, the daemon's uid, --admin-uid or "
      "--admin-group)"));
}

}  // namespace allocd
