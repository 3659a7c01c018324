// Unix-domain sockets for the daemon and its clients: listening with a file
// mode, the peer's kernel credentials, and framed messages that can carry
// file descriptors (SCM_RIGHTS).
#ifndef ALLOCD_IPC_UNIX_SOCKET_H_
#define ALLOCD_IPC_UNIX_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace allocd {

// Owns one file descriptor; closes it when destroyed. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Binds and listens on `path` with file mode `mode`. A stale socket file
// (nothing accepts on it) is replaced; a live one is an AlreadyExists error,
// so two daemons never share a socket.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode);
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path);
// Accepts one connection (close-on-exec); EINTR is retried.
absl::StatusOr<UniqueFd> AcceptUnix(int listen_fd);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// What the kernel says about the process at the other end (SO_PEERCRED),
// as it was when that process connected.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

// The most FDs one message carries (the kernel's SCM_MAX_FD).
inline constexpr size_t kMaxFdsPerMessage = 253;

// Sends one frame: a 4-byte little-endian length, then `payload`; `fds`
// (at most kMaxFdsPerMessage) ride with its first byte. Blocks until sent;
// never raises SIGPIPE.
absl::Status SendMessage(int fd, absl::string_view payload,
                         absl::Span<const int> fds = {});

struct ReceivedMessage {
  std::string payload;
  std::vector<UniqueFd> fds;
};

// Receives one frame sent by SendMessage. Unavailable("peer closed") on EOF
// before a frame; InvalidArgument for a length over `max_payload` (nothing
// more is read) or for FDs the kernel had to drop (those received are
// closed); DeadlineExceeded when a frame does not arrive whole within
// `timeout` (none: wait forever).
absl::StatusOr<ReceivedMessage> ReceiveMessage(
    int fd, size_t max_payload,
    std::optional<absl::Duration> timeout = std::nullopt);

}  // namespace allocd

#endif  // ALLOCD_IPC_UNIX_SOCKET_H_
