#include "client/daemon_connection.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_env.h"
#include "grpcpp/create_channel_posix.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

// The side socket that RegisterResponse names, as this process reaches it.
// The daemon names it by its own path, in its gRPC socket's directory; a
// client in another mount namespace (a container that mounts the socket
// directory elsewhere, the host outside the daemon's container) finds it
// under that name beside the socket it connected to, and uses the announced
// path only when there is nothing there.
std::string SideSocketPath(const std::string& client_socket,
                           const std::string& announced) {
  const size_t dir_end = client_socket.rfind('/');
  const size_t name_start = announced.rfind('/');
  if (dir_end == std::string::npos || name_start == std::string::npos) {
    return announced;
  }
  std::string beside =
      client_socket.substr(0, dir_end) + announced.substr(name_start);
  return access(beside.c_str(), F_OK) == 0 ? beside : announced;
}

// The daemon's answer on the side socket `fd`, gathered from its frames
// (their FDs to `fds` unless it is null) by `deadline`, the daemon's error
// in it. An error status says the answer did not arrive whole:
// DeadlineExceeded when the rest of it is still to come, DataLoss when it
// does not parse, ReceiveMessage's others.
absl::StatusOr<v1::SideResponse> ReceiveAnswer(int fd,
                                               std::vector<UniqueFd>* fds,
                                               absl::Time deadline) {
  v1::SideResponse all;
  for (;;) {
    absl::StatusOr<ReceivedMessage> frame = ReceiveMessage(
        fd, kMaxSideMessageBytes,
        std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!frame.ok()) return frame.status();
    v1::SideResponse response;
    if (!response.ParseFromString(frame->payload)) {
      return absl::DataLossError("malformed answer on the side socket");
    }
    if (!response.error().empty()) return response;
    if (fds != nullptr) {
      for (UniqueFd& f : frame->fds) fds->push_back(std::move(f));
    }
    const bool more = response.more();
    all.MergeFrom(response);
    if (!more) break;
  }
  all.set_more(false);
  return all;
}

// Sends `request` on `fd` (with `send_fds`) and gathers its answer by
// `deadline`, as ReceiveAnswer: DeadlineExceeded only for an answer not
// (wholly) come, since sending waits for the socket however long it takes.
absl::StatusOr<v1::SideResponse> Exchange(int fd, const v1::SideRequest& request,
                                          std::vector<UniqueFd>* fds,
                                          absl::Span<const int> send_fds,
                                          absl::Time deadline) {
  if (absl::Status s = SendMessage(fd, request.SerializeAsString(), send_fds);
      !s.ok()) {
    return s;
  }
  return ReceiveAnswer(fd, fds, deadline);
}

// `answer` (ReceiveAnswer's) with the daemon's error as its status.
absl::StatusOr<v1::SideResponse> WithDaemonError(
    absl::StatusOr<v1::SideResponse> answer) {
  if (answer.ok() && !answer->error().empty()) {
    return absl::Status(static_cast<absl::StatusCode>(answer->code()),
                        answer->error());
  }
  return answer;
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<v1::SideResponse> SideCall(int fd,
                                          const v1::SideRequest& request,
                                          std::vector<UniqueFd>* fds,
                                          absl::Span<const int> send_fds,
                                          absl::Duration timeout) {
  return WithDaemonError(
      Exchange(fd, request, fds, send_fds, absl::Now() + timeout));
}

absl::StatusOr<v1::SideResponse> LeaseCall(Connection& c,
                                           const v1::SideRequest& request,
                                           std::vector<UniqueFd>* fds,
                                           absl::Span<const int> send_fds,
                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int lease;
  int unread;
  {
    absl::MutexLock lock(&c.lease_mu);
    if (!c.lease_mu.AwaitWithDeadline(absl::Condition(&c.lease_idle),
                                      deadline)) {
      return absl::DeadlineExceededError(
          "another call held the lease to the allocd daemon past the deadline");
    }
    c.lease_idle = false;
    lease = c.lease.get();
    unread = c.unread_answers;
  }
  absl::StatusOr<v1::SideResponse> answer =
      absl::DeadlineExceededError("no time left to ask the allocd daemon");
  // The daemon answers in order: those of calls that stopped waiting come
  // first.
  for (; unread > 0; --unread) {
    if (absl::Status s = ReceiveAnswer(lease, nullptr, deadline).status();
        !s.ok()) {
      answer = s;
      break;
    }
  }
  if (unread == 0 && absl::Now() < deadline) {
    answer = Exchange(lease, request, fds, send_fds, deadline);
    if (absl::IsDeadlineExceeded(answer.status())) ++unread;  // sent, not answered
  }
  absl::MutexLock lock(&c.lease_mu);
  c.unread_answers = unread;
  c.lease_idle = true;
  return WithDaemonError(std::move(answer));
}

absl::StatusOr<std::shared_ptr<Connection>> Register(
    const DaemonClientOptions& o, uint64_t epoch,
    const RunningConfig& running) {
  absl::StatusOr<UniqueFd> socket = ConnectUnix(o.socket);
  if (!socket.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no allocd daemon at ", o.socket, ": ", socket.status().message()));
  }
  const int fd = socket->get();
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto c = std::make_shared<Connection>();
  c->epoch = epoch;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 22);
  c->channel = grpc::CreateCustomInsecureChannelFromFd("allocd", socket->release(), args);
  c->stub = v1::Allocd::NewStub(c->channel);

  grpc::ClientContext context;
  SetDeadline(context, o.rpc_timeout);
  v1::RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_device(o.device);
  request.set_gpu_uuid(o.gpu_uuid);
  request.set_job(o.job);
  request.set_initial_config(o.initial_config);
  request.set_client(o.description);
  if (running.version != 0) {
    request.set_current_config(running.config);
    request.set_current_config_version(running.version);
  }
  // Once: a later registration (the daemon restarted) declares what a push
  // or the first registration gave it, and version 0 is its own config.
  if (epoch == 1 && running.version == 0 && !o.started_on_learned.empty()) {
    request.set_current_config(o.started_on_learned);
    request.set_started_on_learned(true);
  }
  *request.mutable_autotune() = o.autotune;
  if (o.features.ByteSizeLong() > 0) *request.mutable_features() = o.features;
  *request.mutable_rank() = o.rank;
  v1::RegisterResponse response;
  if (grpc::Status s = c->stub->Register(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  c->session_id = response.session_id();
  c->session_secret = response.session_secret();
  c->pool = PoolTerms{response.chunk_bytes(), response.capacity_bytes(), response.gpu_uuid()};
  c->running_version = response.current_config_version();
  c->declare_fds = response.declare_fds();
  c->adopts_chunks = response.adopts_chunks();
  c->lease_acquires = response.lease_acquires();
  c->start_config_source = response.start_config_source();
  c->stream_from_reserved = response.stream_from_reserved();
  c->working_set.assign(response.working_set().segment_bytes().begin(),
                        response.working_set().segment_bytes().end());

  absl::StatusOr<UniqueFd> lease = ConnectUnix(SideSocketPath(o.socket, response.fd_socket()));
  if (!lease.ok()) return lease.status();
  v1::SideRequest lease_request;
  lease_request.set_lease_session_id(c->session_id);
  lease_request.set_session_secret(c->session_secret);
  if (auto r = SideCall(lease->get(), lease_request, nullptr); !r.ok()) {
    return r.status();
  }
  absl::MutexLock lock(&c->lease_mu);
  c->lease = std::move(*lease);
  return c;
}

absl::StatusOr<std::string> AskLearnedConfig(const std::string& socket,
                                             const std::string& job,
                                             absl::Duration timeout,
                                             const std::string& start_config,
                                             std::string* source) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket);
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no allocd daemon at ", socket, ": ", fd.status().message()));
  }
  std::unique_ptr<v1::Allocd::Stub> stub = v1::Allocd::NewStub(
      grpc::CreateCustomInsecureChannelFromFd("allocd", fd->release(),
                                              grpc::ChannelArguments()));
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::LearnedConfigRequest request;
  request.set_job(job);
  request.set_start_config(start_config);
  *request.mutable_features() = StartFeatures();
  v1::LearnedConfigResponse response;
  if (grpc::Status s = stub->LearnedConfig(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  if (source != nullptr) *source = response.source();
  return response.config();
}

absl::StatusOr<std::string> StartOnLearnedConfig(const std::string& socket,
                                                 const std::string& job,
                                                 absl::Duration timeout) {
  const char* cuda = std::getenv(env::kPytorchCudaAllocConf);
  const char* generic = std::getenv(env::kPytorchAllocConf);
  const std::string own = cuda != nullptr      ? cuda
                          : generic != nullptr ? generic
                                               : "";
  std::string source;
  absl::StatusOr<std::string> learned = AskLearnedConfig(socket, job, timeout, own, &source);
  if (!learned.ok() || learned->empty()) return learned;
  setenv(env::kInitialAllocConf, own.c_str(), /*overwrite=*/1);
  setenv(env::kStartConfigSource, source.c_str(), /*overwrite=*/1);
  setenv(env::kLearnedAllocConf, learned->c_str(), /*overwrite=*/1);
  setenv(env::kPytorchCudaAllocConf, learned->c_str(), /*overwrite=*/1);
  if (generic != nullptr) {
    setenv(env::kPytorchAllocConf, learned->c_str(), /*overwrite=*/1);
  }
  return learned;
}

absl::Status ReleaseChunks(Connection& c, absl::Span<const uint64_t> ids,
                           absl::Duration rpc_timeout) {
  for (size_t begin = 0; begin < ids.size(); begin += kMaxChunkIdsPerRequest) {
    const size_t end = std::min(ids.size(), begin + kMaxChunkIdsPerRequest);
    v1::ReleaseChunksRequest request;
    NameSession(c, request);
    for (size_t i = begin; i < end; ++i) request.add_chunk_ids(ids[i]);
    absl::Status s;
    if (c.lease_acquires) {
      v1::SideRequest on_lease;
      *on_lease.mutable_release() = std::move(request);
      s = LeaseCall(c, on_lease, nullptr).status();
      // A lease that broke (DataLoss) is a daemon gone, as Unavailable.
      if (absl::IsDataLoss(s)) s = absl::UnavailableError(s.message());
    } else {
      grpc::ClientContext context;
      SetDeadline(context, rpc_timeout);
      v1::ReleaseChunksResponse response;
      s = FromGrpc(c.stub->ReleaseChunks(&context, request, &response));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

ActiveConnection::ActiveConnection(std::shared_ptr<Connection> first) {
  (void)Serve(std::move(first));
}

std::shared_ptr<Connection> ActiveConnection::Current() const {
  absl::MutexLock lock(&mu_);
  return connection_;
}

std::shared_ptr<Connection> ActiveConnection::WaitConnected(
    absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return connection_ != nullptr || stopping_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return connection_;
}

bool ActiveConnection::Serve(std::shared_ptr<Connection> c) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  terms_ = c->pool;
  epoch_ = c->epoch;
  connection_ = std::move(c);
  return true;
}

void ActiveConnection::Lost(const std::shared_ptr<Connection>& c) {
  absl::MutexLock lock(&mu_);
  if (connection_ != c) return;
  connection_ = nullptr;
  if (watch_ != nullptr) watch_->TryCancel();
}

bool ActiveConnection::Watch(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  watch_ = context;
  return true;
}

void ActiveConnection::Unwatch() {
  absl::MutexLock lock(&mu_);
  watch_ = nullptr;
}

void ActiveConnection::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  if (watch_ != nullptr) watch_->TryCancel();
}

bool ActiveConnection::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool ActiveConnection::AwaitStop(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  return mu_.AwaitWithTimeout(absl::Condition(&stop), timeout);
}

uint64_t ActiveConnection::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

PoolTerms ActiveConnection::terms() const {
  absl::MutexLock lock(&mu_);
  return terms_;
}

}  // namespace allocd
