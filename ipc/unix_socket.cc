#include "ipc/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace allocd {
namespace {

absl::Status Errno(absl::string_view what) {
  const int error = errno;
  return absl::Status(
      error == EACCES || error == EPERM ? absl::StatusCode::kPermissionDenied
      : error == ENOENT || error == ECONNREFUSED
          ? absl::StatusCode::kUnavailable
          : absl::StatusCode::kInternal,
      absl::StrCat(what, ": ", strerror(error)));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" must be 1 to ",
                     sizeof address.sun_path - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

UniqueFd NewSocket() {
  return UniqueFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
}

// Waits until `fd` is readable or writable, up to `deadline`.
absl::Status Wait(int fd, short events, std::optional<absl::Time> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      const absl::Duration left = *deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError("socket timed out mid-frame");
      }
      timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    }
    pollfd p{fd, events, 0};
    const int ready = poll(&p, 1, timeout_ms);
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return Errno("poll");
  }
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode) {
  absl::StatusOr<sockaddr_un> address = Address(path);
  if (!address.ok()) return address.status();
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists and is not a socket"));
    }
    if (ConnectUnix(path).ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("another allocd is listening on ", path));
    }
    unlink(path.c_str());  // stale: its daemon died
  }
  UniqueFd fd = NewSocket();
  if (!fd.valid()) return Errno("socket");
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*address),
           sizeof *address) != 0) {
    return Errno(absl::StrCat("bind ", path));
  }
  if (chmod(path.c_str(), mode) != 0) return Errno(absl::StrCat("chmod ", path));
  if (listen(fd.get(), SOMAXCONN) != 0) return Errno("listen");
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path) {
  absl::StatusOr<sockaddr_un> address = Address(path);
  if (!address.ok()) return address.status();
  UniqueFd fd = NewSocket();
  if (!fd.valid()) return Errno("socket");
  while (connect(fd.get(), reinterpret_cast<const sockaddr*>(&*address),
                 sizeof *address) != 0) {
    if (errno != EINTR) return Errno(absl::StrCat("connect ", path));
  }
  return fd;
}

absl::StatusOr<UniqueFd> AcceptUnix(int listen_fd) {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    if (errno != EINTR) return Errno("accept");
  }
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t size = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) != 0) {
    return Errno("SO_PEERCRED");
  }
  return PeerCredentials{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
}

absl::Status SendMessage(int fd, absl::string_view payload,
                         absl::Span<const int> fds) {
  if (fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", kMaxFdsPerMessage, " FDs per message; got ", fds.size()));
  }
  if (payload.size() > UINT32_MAX) {
    return absl::InvalidArgumentError("message over 4 GiB");
  }
  const uint32_t size = static_cast<uint32_t>(payload.size());
  std::string frame(4 + payload.size(), '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(size >> (8 * i));
  std::memcpy(frame.data() + 4, payload.data(), payload.size());

  size_t sent = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  while (sent < frame.size()) {
    iovec io{frame.data() + sent, frame.size() - sent};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      message.msg_control = control;
      message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = Wait(fd, POLLOUT, std::nullopt); !s.ok()) return s;
    } else if (n < 0 && errno != EINTR) {
      return errno == EPIPE || errno == ECONNRESET
                 ? absl::UnavailableError("peer closed")
                 : Errno("sendmsg");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> ReceiveMessage(
    int fd, size_t max_payload, std::optional<absl::Duration> timeout) {
  std::optional<absl::Time> deadline;
  if (timeout) deadline = absl::Now() + *timeout;
  ReceivedMessage out;
  char header[4];
  size_t got = 0;
  // Reads into [buffer, buffer + size), taking FDs from the first read.
  auto read_all = [&](char* buffer, size_t size) -> absl::Status {
    size_t done = 0;
    while (done < size) {
      if (deadline) {
        if (absl::Status s = Wait(fd, POLLIN, deadline); !s.ok()) return s;
      }
      iovec io{buffer + done, size - done};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
      msghdr message{};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof control;
      const ssize_t n = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (absl::Status s = Wait(fd, POLLIN, deadline); !s.ok()) return s;
          continue;
        }
        return errno == ECONNRESET ? absl::UnavailableError("peer closed")
                                   : Errno("recvmsg");
      }
      for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
           c = CMSG_NXTHDR(&message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          out.fds.emplace_back(received);
        }
      }
      if (message.msg_flags & MSG_CTRUNC) {
        return absl::InvalidArgumentError("file descriptors were truncated");
      }
      if (n == 0) {
        return got == 0 && done == 0
                   ? absl::UnavailableError("peer closed")
                   : absl::DataLossError("peer closed mid-frame");
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read_all(header, 4); !s.ok()) return s;
  got = 4;
  uint32_t size = 0;
  for (int i = 0; i < 4; ++i) {
    size |= static_cast<uint32_t>(static_cast<unsigned char>(header[i])) << (8 * i);
  }
  if (size > max_payload) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of ", size, " bytes; at most ", max_payload, " expected"));
  }
  out.payload.resize(size);
  if (absl::Status s = read_all(out.payload.data(), size); !s.ok()) return s;
  return out;
}

}  // namespace allocd
