#include "ipc/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace allocd {
namespace {

// An error for the errno of the failed call `what`.
absl::Status Errno(int error, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case ENOMEM:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(what, ": ", strerror(error)));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path \"", path, "\" is ", path.size(),
        " bytes; a Unix socket path must be 1 to ",
        sizeof address.sun_path - 1, " bytes"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("socket path holds a NUL byte");
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

std::string Directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Connects `fd` to `address`, retrying EINTR. Returns 0 or an errno.
int Connect(int fd, const sockaddr_un& address) {
  for (;;) {
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address),
                sizeof address) == 0) {
      return 0;
    }
    // A connect() interrupted after the kernel queued it completes in the
    // background; asking again says so (EISCONN) on Unix sockets.
    if (errno == EISCONN) return 0;
    if (errno != EINTR) return errno;
  }
}

// The milliseconds poll() should wait until `deadline` (-1: forever).
int PollTimeout(std::optional<absl::Time> deadline) {
  if (!deadline) return -1;
  const absl::Duration left = *deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Round up, so that poll() never returns a hair before the deadline.
  const int64_t ms = absl::ToInt64Milliseconds(left + absl::Milliseconds(1) -
                                               absl::Nanoseconds(1));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Waits until `fd` has one of `events` or `deadline` passes (false then).
absl::StatusOr<bool> Wait(int fd, short events,
                          std::optional<absl::Time> deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int timeout_ms = PollTimeout(deadline);
    const int ready = poll(&p, 1, timeout_ms);
    if (ready > 0) return true;
    if (ready == 0 && timeout_ms >= 0 && absl::Now() >= *deadline) {
      return false;
    }
    if (ready < 0 && errno != EINTR) return Errno(errno, "poll");
  }
}

// One recvmsg() of up to `size` bytes into `buffer` with `flags`; the
// descriptors that came with them are appended to `fds` (owned) first, so
// they are closed whatever happens next. The bytes received (0: EOF), or
// nullopt for EINTR, EAGAIN and EWOULDBLOCK. ECONNRESET counts as EOF.
absl::StatusOr<std::optional<size_t>> ReceiveOnce(int fd, char* buffer,
                                                  size_t size, int flags,
                                                  std::vector<UniqueFd>* fds) {
  iovec io{buffer, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(fd, &message, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
      return std::nullopt;
    }
    if (errno == ECONNRESET) return 0;
    return Errno(errno, "recvmsg");
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
       c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->emplace_back(received);
    }
  }
  if (message.msg_flags & MSG_CTRUNC) {
    return absl::ResourceExhaustedError(
        "file descriptors sent with a message were dropped by the "
        "kernel (MSG_CTRUNC): this process is probably at its "
        "RLIMIT_NOFILE");
  }
  return static_cast<size_t>(n);
}

// EOF `frame_bytes` into a frame of `frame_size` bytes.
absl::Status EndOfStream(size_t frame_bytes, size_t frame_size) {
  if (frame_bytes == 0) return absl::UnavailableError("peer closed");
  return absl::DataLossError(
      absl::StrCat("peer closed in the middle of a message: got ",
                   frame_bytes, " of ", frame_size, " bytes"));
}

// The payload length a frame header gives.
uint32_t DecodeHeader(const char (&header)[kFrameHeaderBytes]) {
  uint32_t size = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    size |= static_cast<uint32_t>(static_cast<unsigned char>(header[i]))
            << (8 * i);
  }
  return size;
}

absl::Status PayloadTooLarge(uint32_t size, size_t max_payload) {
  return absl::InvalidArgumentError(
      absl::StrCat("message of ", size, " bytes is over the limit of ",
                   max_payload, " bytes"));
}

// Reads one frame from `fd` into `out`, piece by piece.
struct FrameReader {
  int fd;
  std::optional<absl::Time> deadline;
  ReceivedMessage* out;
  // Bytes of the frame read so far (header included).
  size_t frame_bytes = 0;
  size_t frame_size = kFrameHeaderBytes;

  // Reads exactly `size` bytes into `buffer`, collecting descriptors.
  absl::Status ReadExactly(char* buffer, size_t size) {
    size_t done = 0;
    while (done < size) {
      if (deadline) {
        absl::StatusOr<bool> ready = Wait(fd, POLLIN, deadline);
        if (!ready.ok()) return ready.status();
        if (!*ready) {
          return absl::DeadlineExceededError(
              frame_bytes == 0
                  ? "no message arrived within the timeout"
                  : absl::StrCat("message stalled after ", frame_bytes,
                                 " of ", frame_size, " bytes (timeout)"));
        }
      }
      absl::StatusOr<std::optional<size_t>> n =
          ReceiveOnce(fd, buffer + done, size - done, 0, &out->fds);
      if (!n.ok()) return n.status();
      if (!n->has_value()) {
        // EINTR, or a non-blocking socket: wait for data (or the deadline).
        absl::StatusOr<bool> ready = Wait(fd, POLLIN, deadline);
        if (!ready.ok()) return ready.status();
        continue;
      }
      if (**n == 0) return EndOfStream(frame_bytes, frame_size);
      done += **n;
      frame_bytes += **n;
    }
    return absl::OkStatus();
  }
};

// One sendmsg() of the bytes of `parts` from `sent` on, with `fds` as
// SCM_RIGHTS when `sent` is 0, and `flags`. The bytes sent, or nullopt for
// EINTR, EAGAIN and EWOULDBLOCK.
absl::StatusOr<std::optional<size_t>> SendOnce(int fd,
                                               absl::Span<const iovec> parts,
                                               size_t sent,
                                               absl::Span<const int> fds,
                                               int flags) {
  // The parts still to send, starting `sent` bytes in.
  iovec io[2];
  size_t count = 0;
  size_t skip = sent;
  for (const iovec& part : parts) {
    if (skip >= part.iov_len) {
      skip -= part.iov_len;
      continue;
    }
    io[count++] = {static_cast<char*>(part.iov_base) + skip,
                   part.iov_len - skip};
    skip = 0;
  }
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr message{};
  message.msg_iov = io;
  message.msg_iovlen = count;
  if (sent == 0 && !fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  const ssize_t n = sendmsg(fd, &message, flags | MSG_NOSIGNAL);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
    return std::nullopt;
  }
  if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) {
    return absl::UnavailableError("peer closed");
  }
  if (errno == EBADF && sent == 0 && !fds.empty()) {
    return absl::InvalidArgumentError(
        "a file descriptor to send is not open (EBADF)");
  }
  return Errno(errno, "sendmsg");
}

// What SendMessage and FrameQueue check before a frame goes out.
absl::Status CheckFrame(absl::string_view payload, size_t fd_count) {
  if (fd_count > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message carries at most ", kMaxFdsPerMessage,
                     " file descriptors; got ", fd_count,
                     " (send them in several messages)"));
  }
  if (payload.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message payload is at most ", UINT32_MAX, " bytes; got ",
        payload.size()));
  }
  return absl::OkStatus();
}

void EncodeHeader(size_t payload_size, char (&header)[kFrameHeaderBytes]) {
  const uint32_t size = static_cast<uint32_t>(payload_size);
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    header[i] = static_cast<char>(size >> (8 * i));
  }
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) close(fd_);  // close() is never retried on Linux
  fd_ = fd;
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode) {
  absl::StatusOr<sockaddr_un> address = Address(path);
  if (!address.ok()) return address.status();

  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " exists and is not a socket; not removing it"));
    }
    // Is anybody listening? A non-blocking probe, so that a live daemon
    // with a full backlog answers EAGAIN rather than blocking us.
    UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!probe.valid()) return Errno(errno, "socket");
    const int error = Connect(probe.get(), *address);
    if (error == 0 || error == EAGAIN) {
      return absl::AlreadyExistsError(
          absl::StrCat("another allocd is listening on ", path));
    }
    if (error != ECONNREFUSED) {
      return Errno(error, absl::StrCat("cannot tell whether ", path,
                                       " is in use: connect"));
    }
    // Stale: its daemon died without removing it.
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Errno(errno, absl::StrCat("removing the stale socket ", path));
    }
  } else if (errno != ENOENT) {
    const int error = errno;
    if (error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(
          "cannot listen on ", path, ": a component of ", Directory(path),
          " is not a directory"));
    }
    return Errno(error, absl::StrCat("stat ", path));
  }

  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno(errno, "socket");
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*address),
           sizeof *address) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(
          "cannot listen on ", path, ": directory ", Directory(path),
          " does not exist"));
    }
    if (error == EADDRINUSE) {  // another daemon won a race with us
      return absl::AlreadyExistsError(
          absl::StrCat("another allocd is listening on ", path));
    }
    return Errno(error, absl::StrCat("bind ", path));
  }
  // Nobody can connect before listen(), so the file's mode is right before
  // the first client arrives.
  if (chmod(path.c_str(), mode) != 0) {
    const absl::Status s = Errno(errno, absl::StrCat("chmod ", path));
    unlink(path.c_str());
    return s;
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    const absl::Status s = Errno(errno, absl::StrCat("listen on ", path));
    unlink(path.c_str());
    return s;
  }
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path) {
  absl::StatusOr<sockaddr_un> address = Address(path);
  if (!address.ok()) return address.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno(errno, "socket");
  const int error = Connect(fd.get(), *address);
  switch (error) {
    case 0:
      return fd;
    case ENOENT:
    case ENOTDIR:
      return absl::UnavailableError(absl::StrCat(
          "no socket at ", path, " (is allocd running?)"));
    case ECONNREFUSED:
      return absl::UnavailableError(absl::StrCat(
          "nothing listens on ", path, " (is allocd running?)"));
    default:
      return Errno(error, absl::StrCat("connect to ", path));
  }
}

absl::StatusOr<UniqueFd> AcceptUnix(int listen_fd) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::UnavailableError("accept: no connection waiting");
    }
    return Errno(errno, "accept");
  }
}

absl::StatusOr<std::pair<UniqueFd, UniqueFd>> UnixSocketPair() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Errno(errno, "socketpair");
  }
  return std::make_pair(UniqueFd(fds[0]), UniqueFd(fds[1]));
}

absl::StatusOr<UniqueFd> DuplicateFd(int fd) {
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) {
    const int error = errno;
    std::string message = absl::StrCat("dup of a descriptor: ", strerror(error));
    return error == EMFILE || error == ENFILE
               ? absl::ResourceExhaustedError(message)
               : absl::InternalError(message);
  }
  return copy;
}

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return Errno(errno, "getrlimit(RLIMIT_NOFILE)");
  }
  if (limit.rlim_cur != limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      return Errno(errno, "setrlimit(RLIMIT_NOFILE)");
    }
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

absl::StatusOr<int> ReserveFdTable(int slots) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return Errno(errno, "getrlimit(RLIMIT_NOFILE)");
  }
  const int size = static_cast<int>(std::min<uint64_t>(
      static_cast<uint64_t>(std::max(slots, 1)),
      std::min<uint64_t>(limit.rlim_cur, INT_MAX)));
  UniqueFd any(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!any.valid()) return Errno(errno, "open(/dev/null)");
  // The lowest free descriptor at or above the last slot: the table holds
  // it from now on, and no descriptor already open is touched.
  UniqueFd high(fcntl(any.get(), F_DUPFD_CLOEXEC, size - 1));
  if (!high.valid() && errno != EMFILE) {  // EMFILE: all taken up there
    return Errno(errno, "fcntl(F_DUPFD_CLOEXEC) to grow the descriptor table");
  }
  return size;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t size = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) != 0) {
    return Errno(errno, "getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
}

absl::Status SendMessage(int fd, absl::string_view payload,
                         absl::Span<const int> fds) {
  if (absl::Status s = CheckFrame(payload, fds.size()); !s.ok()) return s;
  char header[kFrameHeaderBytes];
  EncodeHeader(payload.size(), header);
  // Header and payload, written without copying the payload.
  const iovec parts[2] = {{header, sizeof header},
                          {const_cast<char*>(payload.data()), payload.size()}};
  const size_t total = sizeof header + payload.size();
  size_t sent = 0;
  while (sent < total) {
    absl::StatusOr<std::optional<size_t>> n = SendOnce(fd, parts, sent, fds, 0);
    if (!n.ok()) return n.status();
    if (n->has_value()) {
      sent += **n;
      continue;
    }
    // EINTR, or a non-blocking socket whose buffer is full.
    absl::StatusOr<bool> ready = Wait(fd, POLLOUT, std::nullopt);
    if (!ready.ok()) return ready.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> ReceiveMessage(
    int fd, size_t max_payload, std::optional<absl::Duration> timeout) {
  ReceivedMessage out;
  FrameReader reader{.fd = fd, .out = &out};
  if (timeout) reader.deadline = absl::Now() + *timeout;
  char header[kFrameHeaderBytes];
  if (absl::Status s = reader.ReadExactly(header, sizeof header); !s.ok()) {
    return s;
  }
  const uint32_t size = DecodeHeader(header);
  if (size > max_payload) return PayloadTooLarge(size, max_payload);
  reader.frame_size = kFrameHeaderBytes + size;
  out.payload.resize(size);
  if (absl::Status s = reader.ReadExactly(out.payload.data(), size); !s.ok()) {
    return s;
  }
  return out;
}

// ---------------------------------------------------------- FrameAssembler

FrameAssembler::FrameAssembler(size_t max_payload)
    : max_payload_(max_payload) {}

absl::StatusOr<std::optional<ReceivedMessage>> FrameAssembler::ReadReady(
    int fd) {
  for (;;) {
    // The header first, then exactly the payload it announces: never a
    // byte of the next frame, whose descriptors are the next frame's.
    const bool in_header = got_ < kFrameHeaderBytes;
    const size_t frame_size = kFrameHeaderBytes + frame_.payload.size();
    char* into = in_header ? header_ + got_
                           : frame_.payload.data() + (got_ - kFrameHeaderBytes);
    const size_t want = (in_header ? kFrameHeaderBytes : frame_size) - got_;
    absl::StatusOr<std::optional<size_t>> n =
        ReceiveOnce(fd, into, want, MSG_DONTWAIT, &frame_.fds);
    if (!n.ok()) return n.status();
    if (!n->has_value()) return std::nullopt;  // the rest is not here yet
    if (**n == 0) {
      return EndOfStream(got_, in_header ? kFrameHeaderBytes : frame_size);
    }
    got_ += **n;
    if (in_header && got_ == kFrameHeaderBytes) {
      const uint32_t size = DecodeHeader(header_);
      if (size > max_payload_) return PayloadTooLarge(size, max_payload_);
      frame_.payload.resize(size);
    }
    if (got_ == kFrameHeaderBytes + frame_.payload.size()) {
      got_ = 0;
      return std::exchange(frame_, ReceivedMessage());
    }
  }
}

// -------------------------------------------------------------- FrameQueue

absl::Status FrameQueue::Send(int fd, std::string payload,
                              std::vector<UniqueFd> fds) {
  if (absl::Status s = CheckFrame(payload, fds.size()); !s.ok()) return s;
  Frame frame{.payload = std::move(payload), .fds = std::move(fds)};
  EncodeHeader(frame.payload.size(), frame.header);
  pending_bytes_ += kFrameHeaderBytes + frame.payload.size();
  frames_.push_back(std::move(frame));
  return Flush(fd);
}

absl::Status FrameQueue::Flush(int fd) {
  while (!frames_.empty()) {
    Frame& frame = frames_.front();
    const iovec parts[2] = {{frame.header, sizeof frame.header},
                            {frame.payload.data(), frame.payload.size()}};
    const size_t total = kFrameHeaderBytes + frame.payload.size();
    std::vector<int> fds;
    if (frame.sent == 0) {
      for (const UniqueFd& f : frame.fds) fds.push_back(f.get());
    }
    absl::StatusOr<std::optional<size_t>> n =
        SendOnce(fd, parts, frame.sent, fds, MSG_DONTWAIT);
    if (!n.ok()) return n.status();
    if (!n->has_value()) return absl::OkStatus();  // the socket is full
    // The descriptors went with the first bytes: the peer has its copies.
    frame.fds.clear();
    frame.sent += **n;
    pending_bytes_ -= **n;
    if (frame.sent == total) frames_.pop_front();
  }
  return absl::OkStatus();
}

}  // namespace allocd
