// Who may connect to the admin socket. It is made mode 0600 (the daemon's
// uid only; root passes anyway); --admin-group gives it to a group (mode
// 0660) and --admin-uid to single uids (a POSIX ACL entry each, as
// setfacl -m u:UID:rw would). SessionAccess::CheckAdmin checks each caller
// again by its kernel credentials: the file's mode is the first gate, not
// the only one.
#ifndef ALLOCD_SERVER_ADMIN_SOCKET_H_
#define ALLOCD_SERVER_ADMIN_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace allocd {

// The gid of `group`, a group name or a number. NotFound for an unknown
// name.
absl::StatusOr<gid_t> ResolveAdminGroup(absl::string_view group);

// Opens the socket file at `path` (mode 0600) to `gid`'s members and to
// `uids`. FailedPrecondition when the file cannot be given to the group
// (the daemon is not root and not in it) or its filesystem takes no ACLs,
// saying what to do instead.
absl::Status OpenAdminSocketTo(const std::string& path,
                               const std::vector<uid_t>& uids,
                               std::optional<gid_t> gid);

}  // namespace allocd

#endif  // ALLOCD_SERVER_ADMIN_SOCKET_H_
