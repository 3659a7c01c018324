#include "client/daemon_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocd.grpc.pb.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"

namespace allocd {
namespace {

constexpr uint32_t kProtocolVersion = 1;
// A claim answer: ids of up to a few thousand chunks.
constexpr size_t kMaxSideResponse = 1 << 20;
constexpr size_t kMaxReleaseBatch = 65536;

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

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

// One registered session over one connection to one daemon.
struct Connection {
  uint64_t epoch = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Allocd::Stub> stub;
  uint64_t session_id = 0;
  uint64_t chunk_bytes = 0;
  uint64_t capacity = 0;
  // The lease; claims travel over it, one at a time.
  absl::Mutex lease_mu;
  UniqueFd lease ABSL_GUARDED_BY(lease_mu);
};

// Sends `request` and gathers the answer, which may span several frames
// (a claim of more chunks than one frame carries FDs for).
absl::StatusOr<v1::SideResponse> SideCall(int fd,
                                          const v1::SideRequest& request,
                                          std::vector<UniqueFd>* fds) {
  if (absl::Status s = SendMessage(fd, request.SerializeAsString()); !s.ok()) {
    return s;
  }
  v1::SideResponse all;
  for (;;) {
    absl::StatusOr<ReceivedMessage> frame =
        ReceiveMessage(fd, kMaxSideResponse, absl::Seconds(10));
    if (!frame.ok()) return frame.status();
    v1::SideResponse response;
    if (!response.ParseFromString(frame->payload)) {
      return absl::DataLossError("malformed answer on the side socket");
    }
    if (!response.error().empty()) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()),
                          response.error());
    }
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

absl::StatusOr<std::shared_ptr<Connection>> Establish(
    const DaemonClientOptions& o, uint64_t epoch) {
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
  request.set_job(o.job);
  request.set_initial_config(o.initial_config);
  request.set_client(o.description);
  v1::RegisterResponse response;
  if (grpc::Status s = c->stub->Register(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  c->session_id = response.session_id();
  c->chunk_bytes = response.chunk_bytes();
  c->capacity = response.capacity_bytes();

  absl::StatusOr<UniqueFd> lease = ConnectUnix(SideSocketPath(o.socket, response.fd_socket()));
  if (!lease.ok()) return lease.status();
  v1::SideRequest lease_request;
  lease_request.set_lease_session_id(c->session_id);
  if (auto r = SideCall(lease->get(), lease_request, nullptr); !r.ok()) {
    return r.status();
  }
  absl::MutexLock lock(&c->lease_mu);
  c->lease = std::move(*lease);
  return c;
}

}  // namespace

struct DaemonClient::State {
  explicit State(DaemonClientOptions o) : options(std::move(o)) {}

  // The live connection, or nullptr while the daemon is away.
  std::shared_ptr<Connection> Current() {
    absl::MutexLock lock(&mu);
    return connection;
  }

  // Waits until connected or `deadline`.
  std::shared_ptr<Connection> WaitConnected(absl::Time deadline) {
    absl::MutexLock lock(&mu);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      return connection != nullptr || stopping;
    };
    mu.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return connection;
  }

  // The daemon stopped answering on `c`: drop it so the session thread
  // reconnects.
  void Lost(const std::shared_ptr<Connection>& c) {
    absl::MutexLock lock(&mu);
    if (connection != c) return;
    connection = nullptr;
    if (watch_context != nullptr) watch_context->TryCancel();
  }

  void SessionLoop();
  void TelemetryLoop();

  const DaemonClientOptions options;
  absl::Mutex mu;
  std::shared_ptr<Connection> connection ABSL_GUARDED_BY(mu);
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* watch_context ABSL_GUARDED_BY(mu) = nullptr;
  grpc::ClientContext* telemetry_context ABSL_GUARDED_BY(mu) = nullptr;
  std::deque<v1::ControlMessage> control ABSL_GUARDED_BY(mu);
  v1::TelemetryReport stats ABSL_GUARDED_BY(mu);
  uint64_t stats_published ABSL_GUARDED_BY(mu) = 0;
  uint64_t stats_sent ABSL_GUARDED_BY(mu) = 0;
  bool flush ABSL_GUARDED_BY(mu) = false;
  std::thread session_thread;
  std::thread telemetry_thread;
};

void DaemonClient::State::SessionLoop() {
  absl::Duration backoff = options.reconnect_min;
  for (;;) {
    std::shared_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      c = connection;
    }
    if (c == nullptr) {
      uint64_t next_epoch;
      {
        absl::MutexLock lock(&mu);
        next_epoch = epoch + 1;
      }
      absl::StatusOr<std::shared_ptr<Connection>> fresh =
          Establish(options, next_epoch);
      absl::MutexLock lock(&mu);
      if (stopping) return;
      if (fresh.ok()) {
        connection = *fresh;
        epoch = next_epoch;
        backoff = options.reconnect_min;
      } else {
        auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
          return stopping;
        };
        mu.AwaitWithTimeout(absl::Condition(&stop), backoff);
        backoff = std::min(backoff * 2, options.reconnect_max);
      }
      continue;
    }
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      watch_context = &context;
    }
    v1::WatchConfigRequest request;
    request.set_session_id(c->session_id);
    std::unique_ptr<grpc::ClientReader<v1::ControlMessage>> reader =
        c->stub->WatchConfig(&context, request);
    v1::ControlMessage message;
    while (reader->Read(&message)) {
      absl::MutexLock lock(&mu);
      control.push_back(std::move(message));
    }
    (void)reader->Finish();
    {
      absl::MutexLock lock(&mu);
      watch_context = nullptr;
    }
    // The stream ends only when the daemon or the session went away.
    Lost(c);
  }
}

void DaemonClient::State::TelemetryLoop() {
  std::shared_ptr<Connection> streaming;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientWriter<v1::TelemetryReport>> writer;
  v1::TelemetryAck ack;
  auto close_stream = [&] {
    if (writer != nullptr) {
      writer->WritesDone();
      (void)writer->Finish();
    }
    {
      absl::MutexLock lock(&mu);
      telemetry_context = nullptr;
    }
    writer.reset();
    context.reset();
    streaming.reset();
  };
  for (;;) {
    v1::TelemetryReport report;
    uint64_t sequence;
    std::shared_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
        return stopping || flush;
      };
      mu.AwaitWithTimeout(absl::Condition(&wake), options.telemetry_period);
      if (stopping) break;
      c = connection;
      sequence = stats_published;
      if (c == nullptr || sequence == stats_sent) {
        if (sequence == stats_sent) flush = false;
        continue;
      }
      report = stats;
    }
    if (streaming != c) {
      close_stream();
      context = std::make_unique<grpc::ClientContext>();
      {
        absl::MutexLock lock(&mu);
        telemetry_context = context.get();
      }
      writer = c->stub->StreamTelemetry(context.get(), &ack);
      streaming = c;
    }
    report.set_session_id(c->session_id);
    if (!writer->Write(report)) {
      close_stream();
      continue;
    }
    absl::MutexLock lock(&mu);
    stats_sent = sequence;
    if (stats_sent == stats_published) flush = false;
  }
  close_stream();
}

absl::StatusOr<std::unique_ptr<DaemonClient>> DaemonClient::Connect(
    DaemonClientOptions options) {
  auto state = std::make_unique<State>(std::move(options));
  absl::StatusOr<std::shared_ptr<Connection>> c =
      Establish(state->options, 1);
  if (!c.ok()) return c.status();
  {
    absl::MutexLock lock(&state->mu);
    state->connection = *c;
    state->epoch = 1;
  }
  State* s = state.get();
  s->session_thread = std::thread([s] { s->SessionLoop(); });
  s->telemetry_thread = std::thread([s] { s->TelemetryLoop(); });
  return std::unique_ptr<DaemonClient>(new DaemonClient(std::move(state)));
}

DaemonClient::DaemonClient(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

DaemonClient::~DaemonClient() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    if (state_->watch_context != nullptr) state_->watch_context->TryCancel();
    if (state_->telemetry_context != nullptr) {
      state_->telemetry_context->TryCancel();
    }
  }
  state_->session_thread.join();
  state_->telemetry_thread.join();
}

absl::StatusOr<ReceivedChunks> DaemonClient::Acquire(uint64_t bytes) {
  const absl::Time deadline = absl::Now() + state_->options.reconnect_wait;
  for (;;) {
    std::shared_ptr<Connection> c = state_->WaitConnected(deadline);
    if (c == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "the allocd daemon at ", state_->options.socket,
          " did not come back within ",
          absl::FormatDuration(state_->options.reconnect_wait)));
    }
    grpc::ClientContext context;
    SetDeadline(context, state_->options.rpc_timeout);
    v1::AcquireChunksRequest request;
    request.set_session_id(c->session_id);
    request.set_bytes(bytes);
    v1::AcquireChunksResponse response;
    grpc::Status status = c->stub->AcquireChunks(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The daemon died, or restarted and no longer knows the session.
      state_->Lost(c);
      continue;
    }
    if (!status.ok()) return FromGrpc(status);

    ReceivedChunks chunks{.epoch = c->epoch,
                          .ids = {response.chunk_ids().begin(),
                                  response.chunk_ids().end()},
                          .chunk_bytes = c->chunk_bytes,
                          .reused = response.reused_chunks()};
    v1::SideRequest claim;
    claim.set_claim_token(response.claim_token());
    absl::StatusOr<v1::SideResponse> answer;
    {
      absl::MutexLock lock(&c->lease_mu);
      answer = SideCall(c->lease.get(), claim, &chunks.fds);
    }
    absl::Status claimed = answer.status();
    if (claimed.ok()) {
      chunks.offsets.assign(answer->offsets().begin(),
                            answer->offsets().end());
      if (chunks.fds.size() != chunks.ids.size() ||
          chunks.offsets.size() != chunks.ids.size()) {
        claimed = absl::DataLossError(
            absl::StrCat("daemon sent ", chunks.fds.size(), " FDs for ",
                         chunks.ids.size(), " chunks"));
      }
    }
    if (!claimed.ok()) {
      // Unusable here, so not ours to keep: the session must not hold them.
      (void)Release(c->epoch, chunks.ids);
      return claimed;
    }
    return chunks;
  }
}

absl::Status DaemonClient::Release(uint64_t epoch,
                                   absl::Span<const uint64_t> ids) {
  std::shared_ptr<Connection> c = state_->Current();
  if (c == nullptr || c->epoch != epoch) return absl::OkStatus();
  for (size_t begin = 0; begin < ids.size(); begin += kMaxReleaseBatch) {
    const size_t end = std::min(ids.size(), begin + kMaxReleaseBatch);
    grpc::ClientContext context;
    SetDeadline(context, state_->options.rpc_timeout);
    v1::ReleaseChunksRequest request;
    request.set_session_id(c->session_id);
    for (size_t i = begin; i < end; ++i) request.add_chunk_ids(ids[i]);
    v1::ReleaseChunksResponse response;
    grpc::Status s = c->stub->ReleaseChunks(&context, request, &response);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      state_->Lost(c);
      return absl::OkStatus();  // the daemon takes them back when it ends
    }
    if (!s.ok()) return FromGrpc(s);
  }
  return absl::OkStatus();
}

std::vector<v1::ControlMessage> DaemonClient::TakeControl() {
  absl::MutexLock lock(&state_->mu);
  std::vector<v1::ControlMessage> out(
      std::make_move_iterator(state_->control.begin()),
      std::make_move_iterator(state_->control.end()));
  state_->control.clear();
  return out;
}

// One unary RPC for the current session: `rpc(stub, context, session)`.
template <typename Rpc>
absl::Status CallOnSession(DaemonClient::State& state, Rpc&& rpc) {
  std::shared_ptr<Connection> c = state.Current();
  if (c == nullptr) return absl::UnavailableError("not connected to allocd");
  grpc::ClientContext context;
  SetDeadline(context, state.options.rpc_timeout);
  return FromGrpc(rpc(*c->stub, &context, c->session_id));
}

absl::Status DaemonClient::Ack(uint64_t version, bool applied,
                               absl::string_view error) {
  return CallOnSession(*state_, [&](v1::Allocd::Stub& stub,
                                    grpc::ClientContext* context,
                                    uint64_t session) {
    v1::ConfigAck request;
    request.set_session_id(session);
    request.set_version(version);
    request.set_applied(applied);
    request.set_error(std::string(error));
    v1::AckResponse response;
    return stub.AckConfig(context, request, &response);
  });
}

absl::Status DaemonClient::ReportOom(uint64_t requested_bytes,
                                     absl::string_view message,
                                     uint64_t config_version) {
  return CallOnSession(*state_, [&](v1::Allocd::Stub& stub,
                                    grpc::ClientContext* context,
                                    uint64_t session) {
    v1::OomReport request;
    request.set_session_id(session);
    request.set_requested_bytes(requested_bytes);
    request.set_message(std::string(message.substr(0, 4096)));
    request.set_config_version(config_version);
    v1::OomResponse response;
    return stub.ReportOom(context, request, &response);
  });
}

void DaemonClient::PublishStats(std::map<std::string, int64_t> stats,
                                uint64_t config_version) {
  absl::MutexLock lock(&state_->mu);
  state_->stats.clear_stats();
  for (auto& [k, v] : stats) (*state_->stats.mutable_stats())[k] = v;
  state_->stats.set_config_version(config_version);
  ++state_->stats_published;
}

absl::Status DaemonClient::FlushTelemetry() {
  absl::MutexLock lock(&state_->mu);
  state_->flush = true;
  auto sent = [this]() ABSL_SHARED_LOCKS_REQUIRED(state_->mu) {
    return state_->stats_sent == state_->stats_published || state_->stopping;
  };
  if (!state_->mu.AwaitWithTimeout(absl::Condition(&sent),
                                   state_->options.rpc_timeout)) {
    return absl::DeadlineExceededError("telemetry not sent");
  }
  return absl::OkStatus();
}

uint64_t DaemonClient::session_id() const {
  std::shared_ptr<Connection> c = state_->Current();
  return c == nullptr ? 0 : c->session_id;
}

uint64_t DaemonClient::epoch() const {
  absl::MutexLock lock(&state_->mu);
  return state_->epoch;
}

bool DaemonClient::connected() const { return state_->Current() != nullptr; }

uint64_t DaemonClient::chunk_bytes() const {
  std::shared_ptr<Connection> c = state_->Current();
  return c == nullptr ? 0 : c->chunk_bytes;
}

uint64_t DaemonClient::capacity_bytes() const {
  std::shared_ptr<Connection> c = state_->Current();
  return c == nullptr ? 0 : c->capacity;
}

}  // namespace allocd
