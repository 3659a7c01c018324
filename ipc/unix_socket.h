// Unix-domain sockets for the daemon and its clients: listening with a file
// mode, the peer's kernel credentials, and framed messages that can carry
// file descriptors (SCM_RIGHTS).
//
// Every descriptor these functions create is close-on-exec, and every
// descriptor they hand out is owned by a UniqueFd.
#ifndef ALLOCD_IPC_UNIX_SOCKET_H_
#define ALLOCD_IPC_UNIX_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace allocd {

// Owns one file descriptor and closes it when destroyed or reset. Move-only;
// -1 means "none". Not thread-safe (like any value type).
class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd` (may be -1).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  // The descriptor, still owned by this object (-1 when none).
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller must close the returned descriptor.
  ABSL_MUST_USE_RESULT int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes the owned descriptor (if any) and takes ownership of `fd`.
  // Resetting to the descriptor already owned keeps it open.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Creates a socket, binds it to `path`, sets the file's mode to exactly
// `mode` (0660 for the daemon's main socket; the umask does not apply) and
// listens. Connections are refused until the mode is set.
//
// An existing file at `path` is removed only when it is a socket that nobody
// listens on (connect() is refused: its daemon died). Errors:
//  - InvalidArgument: `path` is empty or too long for sun_path (107 bytes);
//  - NotFound: the directory holding `path` does not exist;
//  - AlreadyExists: "another allocd is listening on PATH";
//  - FailedPrecondition: `path` exists and is not a socket (never removed);
//  - PermissionDenied: the directory is not writable;
//  - Internal for other system errors, with strerror().
// The socket file stays when the descriptor closes: the caller unlinks it at
// shutdown.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode);

// Connects a blocking stream socket to `path`. Unavailable when there is no
// socket there or nobody listens ("is allocd running?"), PermissionDenied
// when the socket's mode refuses this user, InvalidArgument for a bad path.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path);

// Accepts one connection (close-on-exec, blocking); EINTR and ECONNABORTED
// are retried. ResourceExhausted when this process is out of descriptors;
// Unavailable when `listen_fd` is non-blocking and its backlog is empty.
absl::StatusOr<UniqueFd> AcceptUnix(int listen_fd);

// A close-on-exec copy of `fd` (fcntl F_DUPFD_CLOEXEC). ResourceExhausted
// when the process or the system is out of descriptors.
absl::StatusOr<UniqueFd> DuplicateFd(int fd);

// A connected pair of stream sockets (socketpair(2)), both close-on-exec.
absl::StatusOr<std::pair<UniqueFd, UniqueFd>> UnixSocketPair();

// Raises this process's soft RLIMIT_NOFILE to its hard limit (as Go's
// runtime does at start): the daemon holds one FD per chunk, tens of
// thousands on a large GPU. Returns the soft limit now in force.
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

// Grows this process's descriptor table to at least `slots` entries now
// (capped by the soft RLIMIT_NOFILE), so that descriptors received later
// never grow it. The kernel grows the table when a descriptor beyond it is
// installed, and in a process of several threads that waits for an RCU
// grace period (expand_fdtable: synchronize_rcu), milliseconds paid by
// whichever call received the descriptors: on the H100 a grant of 16 chunk
// FDs took 5-17 ms instead of 0.1. The table never shrinks, so this costs
// that wait at most once, when called. Returns the table's guaranteed size.
absl::StatusOr<int> ReserveFdTable(int slots);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// What the kernel says about the process at the other end (SO_PEERCRED), as
// it was when that process called connect() (or socketpair()). The pid is in
// this process's pid namespace (0 if the peer is outside it).
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

// The most descriptors one message carries: the kernel's SCM_MAX_FD.
// SendMessage does NOT split larger sets: the caller sends them in several
// messages (InvalidArgument otherwise, before anything is sent).
inline constexpr size_t kMaxFdsPerMessage = 253;

// The wire format of one message ("frame") on a SOCK_STREAM socket: a 4-byte
// little-endian payload length, then the payload. The descriptors, if any,
// travel as one SCM_RIGHTS control message attached to the first bytes of
// the frame.
inline constexpr size_t kFrameHeaderBytes = 4;

// Sends one frame carrying `payload` (at most 4 GiB - 1) and duplicates of
// `fds` (at most kMaxFdsPerMessage; the caller keeps and closes its own).
// Blocks until the whole frame is written (partial writes and EINTR are
// retried; a non-blocking socket is polled); never raises SIGPIPE
// (MSG_NOSIGNAL). Unavailable("peer closed") when the peer has gone. After a
// failure part of the frame may have been sent: close the connection.
// Concurrent senders on one socket must serialize their calls.
absl::Status SendMessage(int fd, absl::string_view payload,
                         absl::Span<const int> fds = {});

struct ReceivedMessage {
  std::string payload;
  // The descriptors that came with the frame, owned (close-on-exec).
  std::vector<UniqueFd> fds;
};

// Receives one frame sent by SendMessage. Errors:
//  - Unavailable("peer closed"): EOF (or a reset) before the frame began;
//  - DataLoss: EOF in the middle of a frame;
//  - InvalidArgument: a length over `max_payload` (the payload is not read);
//  - ResourceExhausted: the kernel dropped descriptors that came with the
//    frame (MSG_CTRUNC: this process is at its RLIMIT_NOFILE);
//  - DeadlineExceeded: no whole frame within `timeout` (nullopt: wait
//    forever).
// On every error the descriptors received so far are closed. After any error
// the stream is out of step (the rest of the frame may be pending): close
// the connection rather than read from it again.
absl::StatusOr<ReceivedMessage> ReceiveMessage(
    int fd, size_t max_payload,
    std::optional<absl::Duration> timeout = std::nullopt);

// Non-blocking framed I/O, for a poll() loop that serves many peers and
// must never wait on one of them: a peer that sends half a frame, or stops
// reading its answers, holds only its own connection.

// Assembles the frames SendMessage sends from what a socket has ready
// (MSG_DONTWAIT), whatever the socket's own blocking mode. Not thread-safe.
class FrameAssembler {
 public:
  explicit FrameAssembler(size_t max_payload);

  // Reads what `fd` has ready toward the current frame, never past it. A
  // whole frame when it completed (the next starts empty); nullopt when
  // more bytes must come first (poll for POLLIN). Errors as ReceiveMessage's
  // (no DeadlineExceeded: the caller keeps its own time); after one, close
  // the connection.
  absl::StatusOr<std::optional<ReceivedMessage>> ReadReady(int fd);
  // Whether part of a frame has been read.
  bool partial() const { return got_ > 0; }

 private:
  const size_t max_payload_;
  char header_[kFrameHeaderBytes] = {};
  // Bytes of the current frame read so far, header included.
  size_t got_ = 0;
  ReceivedMessage frame_;
};

// The frames waiting to be written to one socket, written as far as the
// socket takes them without blocking (MSG_DONTWAIT). Not thread-safe.
class FrameQueue {
 public:
  // Queues a frame of `payload` with `fds` (at most kMaxFdsPerMessage,
  // owned here until they are sent, then closed), then Flush()es.
  // InvalidArgument for a frame SendMessage would refuse (nothing queued);
  // Flush's errors.
  absl::Status Send(int fd, std::string payload,
                    std::vector<UniqueFd> fds = {});
  // Writes what the socket takes now; the rest waits for the next Flush
  // (poll for POLLOUT while pending()). Unavailable("peer closed") when the
  // peer has gone; after any error, close the connection.
  absl::Status Flush(int fd);
  bool pending() const { return !frames_.empty(); }
  // Bytes not written yet.
  size_t pending_bytes() const { return pending_bytes_; }

 private:
  struct Frame {
    char header[kFrameHeaderBytes];
    std::string payload;
    std::vector<UniqueFd> fds;
    // Bytes of header and payload written.
    size_t sent = 0;
  };
  std::deque<Frame> frames_;
  size_t pending_bytes_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_IPC_UNIX_SOCKET_H_
