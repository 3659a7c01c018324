// The client's connection to the node daemon: one registered session over
// one gRPC connection and its lease (Connection, made by Register), and the
// one the client's calls go over now (ActiveConnection), which the session
// thread replaces when the daemon goes away (reconnector.h).
//
// The lease is the side-socket connection whose life is the session's:
// chunk FDs arrive over it with SCM_RIGHTS, and the daemon ends the session
// and takes back every chunk of its epoch when it closes.
#ifndef ALLOCD_CLIENT_DAEMON_CONNECTION_H_
#define ALLOCD_CLIENT_DAEMON_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocd.grpc.pb.h"
#include "client/daemon_client_options.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"

namespace allocd {

// What a daemon said of the pool that serves a session (RegisterResponse).
struct PoolTerms {
  uint64_t chunk_bytes = 0;
  uint64_t capacity = 0;
  std::string gpu_uuid;
};

// What the process runs, as it declares it when it registers.
struct RunningConfig {
  std::string config;
  uint64_t version = 0;
};

// One registered session over one connection to one daemon. Immutable once
// Register returns it, but for the lease, which carries one call at a time.
struct Connection {
  // The client's count of the sessions it registered: 1 for the first,
  // one more for each after the daemon went away.
  uint64_t epoch = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Allocd::Stub> stub;
  uint64_t session_id = 0;
  // What proves the session to the daemon (RegisterResponse.session_secret),
  // sent with every request naming it: NameSession.
  std::string session_secret;
  PoolTerms pool;
  // What this daemon calls the config the client declared as running.
  uint64_t running_version = 0;
  // Whether chunks declared to this daemon after a restart are proven with
  // their FDs, so the client keeps an FD of each chunk it holds.
  bool declare_fds = false;
  // Whether this daemon takes declarations at all.
  bool adopts_chunks = false;
  // Whether this daemon grants and takes back chunks on the lease.
  bool lease_acquires = false;
  // RegisterResponse.start_config_source: where the config the session
  // starts on came from.
  std::string start_config_source;
  // RegisterResponse.stream_from_reserved: a learned run's reserved bytes
  // up to which it may leave its allocation stream off (0: none).
  uint64_t stream_from_reserved = 0;
  // The job's last working set, as this daemon handed it over.
  std::vector<uint64_t> working_set;
  // The lease; calls travel over it one at a time (LeaseCall). lease_mu
  // guards whose turn it is rather than the call, so that a caller with a
  // deadline can give up waiting for its turn.
  absl::Mutex lease_mu;
  UniqueFd lease ABSL_GUARDED_BY(lease_mu);
  // No call is on the lease: the next may read and write it.
  bool lease_idle ABSL_GUARDED_BY(lease_mu) = true;
  // Answers still on their way to calls that stopped waiting for them
  // (LeaseCall's timeout): the daemon answers in order, so the next call
  // reads them first.
  int unread_answers ABSL_GUARDED_BY(lease_mu) = 0;
};

// Names `c`'s session in `request` (any request with session_id and
// session_secret): the daemon answers only requests that prove it.
template <typename Request>
void NameSession(const Connection& c, Request& request) {
  request.set_session_id(c.session_id);
  request.set_session_secret(c.session_secret);
}

// Registers a session as `epoch` with the daemon at options.socket,
// declaring `running` as the config the process runs (nothing when its
// version is 0), and opens its lease. Unavailable, naming the socket, when
// no daemon answers there; the daemon's error when it refuses.
absl::StatusOr<std::shared_ptr<Connection>> Register(
    const DaemonClientOptions& options, uint64_t epoch,
    const RunningConfig& running);

// The config the daemon at `socket` would hand a session of `job` (in the
// caller's tenant) at registration, for a process to start on before its
// first allocation: its learned config, or for a job that would start on
// `start_config` (its own; "" PyTorch's defaults) the node's prior or a
// safe replacement of a harmful one; "" when none. `source` (optional) is
// set to why: "learned", "prior", "replaced" ("" with none). Unavailable,
// naming the socket, when no daemon answers; the daemon's error when it
// refuses.
absl::StatusOr<std::string> AskLearnedConfig(const std::string& socket,
                                             const std::string& job,
                                             absl::Duration timeout,
                                             const std::string& start_config = "",
                                             std::string* source = nullptr);

// Starts this process on the config its tenant's job learned, if any, by
// its environment, before PyTorch reads PYTORCH_CUDA_ALLOC_CONF (and
// PYTORCH_ALLOC_CONF, when set) once, at its first allocation: a config
// handed at registration would come after the job allocated under its
// own. Both are set to the learned config, and ALLOCD_LEARNED_ALLOC_CONF
// with it; the job's own (the user's PYTORCH_CUDA_ALLOC_CONF: a learned
// config replaces it, as the daemon's push at registration would) goes to
// ALLOCD_INITIAL_ALLOC_CONF, where a rollback returns. The interposer
// declares both at registration. For `allocd run` before it starts the
// program, and allocd.enable() before `import torch`. The job's own is the
// start config asked about (a harmful one is replaced, the node's prior
// may be answered), and ALLOCD_START_CONFIG_SOURCE is set to the answer's
// source (stats()' start_config_source). Returns the config, "" when none
// (nothing set); AskLearnedConfig's errors.
absl::StatusOr<std::string> StartOnLearnedConfig(const std::string& socket,
                                                 const std::string& job,
                                                 absl::Duration timeout);

// How long a side call waits for the daemon's whole answer unless its
// caller says otherwise.
inline constexpr absl::Duration kSideCallTimeout = absl::Seconds(10);

// Sends `request` on the side socket `fd` (with `send_fds` riding along)
// and gathers the answer, which may span several frames (a claim of more
// chunks than one frame carries FDs for); their FDs go to `fds` unless it
// is null. The daemon's error as its status; DataLoss when the answer does
// not parse; DeadlineExceeded when the whole answer did not arrive within
// `timeout`.
absl::StatusOr<v1::SideResponse> SideCall(
    int fd, const v1::SideRequest& request, std::vector<UniqueFd>* fds,
    absl::Span<const int> send_fds = {},
    absl::Duration timeout = kSideCallTimeout);
// SideCall on the lease of `c`, in its turn: within `timeout` all told,
// the wait for the calls before it included. A call that times out leaves
// the lease usable (its answer, when it comes, is read and dropped, FDs
// closed, by the next call, within that call's `timeout`), so a caller
// that cannot wait long (a give on the free path) may pass a short one.
// DeadlineExceeded with the request unsent when the time ran out first. A
// frame cut off by the timeout, which the daemon's small answers are not,
// leaves the lease out of step: the next call fails.
absl::StatusOr<v1::SideResponse> LeaseCall(
    Connection& c, const v1::SideRequest& request, std::vector<UniqueFd>* fds,
    absl::Span<const int> send_fds = {},
    absl::Duration timeout = kSideCallTimeout);

// ReleaseChunks of `ids` on the session of `c`, in batches of
// kMaxChunkIdsPerRequest (on the lease when the daemon takes them back
// there). Unavailable when the daemon went away, a broken lease included.
absl::Status ReleaseChunks(Connection& c, absl::Span<const uint64_t> ids,
                           absl::Duration rpc_timeout);

absl::Status FromGrpc(const grpc::Status& s);
void SetDeadline(grpc::ClientContext& context, absl::Duration timeout);

// The connection the client's calls go over now, and what the last daemon
// said while none answers. Thread-safe; it calls nothing of the client's
// while it holds mu_, so a part may read it under a lock of its own.
class ActiveConnection {
 public:
  // Serves `first` (Register'd as epoch 1).
  explicit ActiveConnection(std::shared_ptr<Connection> first);

  // The live connection, or nullptr while the daemon is away.
  std::shared_ptr<Connection> Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Current(), waiting until there is one, Stop, or `deadline`.
  std::shared_ptr<Connection> WaitConnected(absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls go over `c` (its epoch the newest) from now on; false, serving
  // nothing, after Stop.
  bool Serve(std::shared_ptr<Connection> c) ABSL_LOCKS_EXCLUDED(mu_);
  // The daemon stopped answering on `c`: drops it (unless another serves
  // already) and cancels the watch, so the session thread reconnects.
  void Lost(const std::shared_ptr<Connection>& c) ABSL_LOCKS_EXCLUDED(mu_);

  // The call the session thread blocks in on the current connection (the
  // control stream), which Lost and Stop cancel; false after Stop.
  // Unwatch before `context` goes away.
  bool Watch(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Unwatch() ABSL_LOCKS_EXCLUDED(mu_);

  // Ends waits and the watch for good: the client is going away.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for Stop; whether it came.
  bool AwaitStop(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // The epoch of the newest connection served.
  uint64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  // The pool terms of the newest connection served, kept while the daemon
  // is away: a cudaMalloc in the gap rounds to its chunks and waits in
  // Acquire for the next daemon (chunk_bytes 0 there was a division by
  // zero, SIGFPE).
  PoolTerms terms() const ABSL_LOCKS_EXCLUDED(mu_);

  // `rpc` (a unary Allocd method) with `request` on the current session,
  // which it names (NameSession), with a deadline `timeout` away.
  // Unavailable when not connected; the daemon's error otherwise.
  template <typename Request, typename Response>
  absl::Status Call(absl::Duration timeout,
                    grpc::Status (v1::Allocd::Stub::*rpc)(
                        grpc::ClientContext*, const Request&, Response*),
                    Request request) const {
    std::shared_ptr<Connection> c = Current();
    if (c == nullptr) return absl::UnavailableError("not connected to allocd");
    NameSession(*c, request);
    grpc::ClientContext context;
    SetDeadline(context, timeout);
    Response response;
    return FromGrpc(((*c->stub).*rpc)(&context, request, &response));
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  PoolTerms terms_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_CONNECTION_H_
