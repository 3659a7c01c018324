// For the tests that run `allocd serve` and its clients as real processes
// (tests/server/daemon_test.cc, tests/gpu/cuda_chunks_test.cc): a child
// process whose output the test reads, a gRPC channel to a daemon's socket,
// and the node pool's state through the Admin service.
#ifndef ALLOCD_TESTS_SERVER_DAEMON_HARNESS_H_
#define ALLOCD_TESTS_SERVER_DAEMON_HARNESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "allocd.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"

namespace allocd::harness {

// A child process (args[0] run with `args`) with its output on a pipe:
// stdout, and stderr too when `with_stderr`. Killed with SIGKILL and reaped
// when destroyed, if still running, and killed when the test process dies
// (PR_SET_PDEATHSIG): a daemon left behind by a crashed test would hold
// the test's stderr, and ctest would wait for it forever. Construct it on
// the test's main thread (the signal follows the thread that made it).
class Child {
 public:
  explicit Child(std::vector<std::string> args, bool with_stderr = false);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Whether it has not exited yet (reaps it if it has).
  bool running();
  // The next line of output, or "" after `timeout` or at its end.
  std::string Line(absl::Duration timeout = absl::Seconds(60));
  // Everything printed until it closes its output (or `timeout`).
  std::string Rest(absl::Duration timeout = absl::Seconds(60));
  // Exit code (128 + signal when killed).
  int Wait();
  void Kill();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  UniqueFd output_;
  std::string buffer_;
};

// Polls until the daemon serving `socket` accepts on it: the last of its
// sockets it opens (SOCKET.fds, SOCKET.admin, SOCKET), so all of them answer
// then. False (and a test failure) after `limit`.
bool WaitForDaemon(const std::string& socket, absl::Duration limit = absl::Seconds(60));

// A channel to the daemon listening on the Unix socket `socket`. With no
// daemon there, a test failure and a channel whose calls fail.
std::shared_ptr<grpc::Channel> Dial(const std::string& socket);

// A channel to the admin socket (SOCKET.admin, where alone the Admin
// service answers) of the daemon whose clients' socket is `socket`.
std::shared_ptr<grpc::Channel> DialAdmin(const std::string& socket);

// Admin.Status (a failed call fails the test).
v1::StatusResponse PoolStatus(v1::Admin::Stub& admin);

// Polls until the pool holds `bytes` in use or `limit` passes; returns how
// long it took.
absl::Duration WaitForInUse(v1::Admin::Stub& admin, uint64_t bytes,
                            absl::Duration limit);

}  // namespace allocd::harness

#endif  // ALLOCD_TESTS_SERVER_DAEMON_HARNESS_H_
