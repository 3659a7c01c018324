#include "server/admin_socket.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace allocd {
namespace {

// The kernel's POSIX ACL xattr (linux/posix_acl_xattr.h): a version, then
// entries sorted by tag, then id; little-endian.
constexpr uint32_t kAclVersion = 2;
constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04,
                   kMask = 0x10, kOther = 0x20;
constexpr uint32_t kNoId = UINT32_MAX;
// Connecting to a socket needs write permission; read for symmetry.
constexpr uint16_t kReadWrite = 6;

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

void AppendEntry(std::string& acl, uint16_t tag, uint16_t perm, uint32_t id) {
  AppendLittleEndian(acl, tag, 2);
  AppendLittleEndian(acl, perm, 2);
  AppendLittleEndian(acl, id, 4);
}

}  // namespace

absl::StatusOr<gid_t> ResolveAdminGroup(absl::string_view group) {
  gid_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return gid;
  const std::string name(group);
  std::string buffer(16384, '\0');
  struct group entry;
  struct group* found = nullptr;
  if (getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) !=
          0 ||
      found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "--admin-group: no group \"", group, "\" (give a name from /etc/group "
        "or a gid)"));
  }
  return found->gr_gid;
}

absl::Status OpenAdminSocketTo(const std::string& path,
                               const std::vector<uid_t>& uids,
                               std::optional<gid_t> gid) {
  if (gid.has_value()) {
    if (chown(path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--admin-group: cannot give the admin socket ", path, " to gid ",
          *gid, ": ", strerror(errno),
          " (the daemon must run as root or be a member of that group)"));
    }
  }
  if (uids.empty()) {
    if (gid.has_value() && chmod(path.c_str(), 0660) != 0) {
      return absl::InternalError(
          absl::StrCat("chmod 0660 ", path, ": ", strerror(errno)));
    }
    return absl::OkStatus();
  }
  std::vector<uid_t> sorted = uids;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string acl;
  AppendLittleEndian(acl, kAclVersion, 4);
  AppendEntry(acl, kUserObj, kReadWrite, kNoId);
  for (uid_t uid : sorted) AppendEntry(acl, kUser, kReadWrite, uid);
  AppendEntry(acl, kGroupObj, gid.has_value() ? kReadWrite : 0, kNoId);
  AppendEntry(acl, kMask, kReadWrite, kNoId);
  AppendEntry(acl, kOther, 0, kNoId);
  if (setxattr(path.c_str(), "system.posix_acl_access", acl.data(), acl.size(),
               0) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--admin-uid: cannot give the admin socket ", path,
        " an ACL for those uids: ", strerror(errno),
        ". Put the socket on a filesystem with POSIX ACLs, or use "
        "--admin-group"));
  }
  return absl::OkStatus();
}

}  // namespace allocd
