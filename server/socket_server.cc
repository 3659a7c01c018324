#include "server/socket_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocd.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "proto/protocol.h"
#include "server/log.h"

namespace allocd {
namespace {

// Largest side-socket request: a release of the most ids one ReleaseChunks
// takes (65,536 varints of up to 10 bytes); a lease, a claim token, an
// acquire or a declaration (up to kMaxFdsPerMessage chunks) are far less.
// A frame over it closes the connection, which ends a lease's session.
// A client must send a whole frame within this once it started one.
constexpr absl::Duration kFrameTimeout = absl::Seconds(1);
// How often the side channel looks for sessions that never leased.
constexpr int kExpiryPollMs = 250;

}  // namespace

WakeFd::WakeFd() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void WakeFd::Wake() {
  const uint64_t one = 1;
  (void)!write(fd_.get(), &one, sizeof one);
}

// ----------------------------------------------------------- GrpcAcceptor

absl::StatusOr<std::unique_ptr<GrpcAcceptor>> GrpcAcceptor::Start(
    const std::string& path, mode_t mode, grpc::Server* server,
    PeerTable* peers) {
  absl::StatusOr<UniqueFd> listener = ListenUnix(path, mode);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<GrpcAcceptor>(
      new GrpcAcceptor(path, std::move(*listener), server, peers));
}

GrpcAcceptor::GrpcAcceptor(std::string path, UniqueFd listener,
                           grpc::Server* server, PeerTable* peers)
    : path_(std::move(path)),
      listener_(std::move(listener)),
      server_(server),
      peers_(peers),
      thread_([this] { Loop(); }) {}

GrpcAcceptor::~GrpcAcceptor() {
  stop_.Wake();
  thread_.join();
  unlink(path_.c_str());
}

void GrpcAcceptor::Loop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LogError(absl::StrCat("poll on ", path_, ": ", strerror(errno)));
      return;
    }
    if (fds[1].revents != 0) return;
    absl::StatusOr<UniqueFd> connection = AcceptUnix(listener_.get());
    if (!connection.ok()) {
      LogError(absl::StrCat("accept on ", path_, ": ",
                            connection.status().message()));
      continue;
    }
    absl::StatusOr<PeerCredentials> peer =
        GetPeerCredentials(connection->get());
    if (!peer.ok()) {
      LogError(absl::StrCat("SO_PEERCRED: ", peer.status().message()));
      continue;
    }
    // gRPC's event engine expects a non-blocking socket.
    const int fd = connection->get();
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    peers_->Add(fd, *peer);
    grpc::AddInsecureChannelFromFd(server_, connection->release());
  }
}

// ------------------------------------------------------------ SideChannel

absl::StatusOr<std::unique_ptr<SideChannel>> SideChannel::Start(
    const std::string& path, mode_t mode, DaemonCore* core,
    Metrics* metrics) {
  absl::StatusOr<UniqueFd> listener = ListenUnix(path, mode);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<SideChannel>(
      new SideChannel(path, std::move(*listener), core, metrics));
}

SideChannel::SideChannel(std::string path, UniqueFd listener,
                         DaemonCore* core, Metrics* metrics)
    : path_(std::move(path)),
      listener_(std::move(listener)),
      core_(core),
      metrics_(metrics),
      thread_([this] { Loop(); }) {}

SideChannel::~SideChannel() {
  stop_.Wake();
  thread_.join();
  unlink(path_.c_str());
}

namespace {

struct SideConnection {
  UniqueFd fd;
  PeerCredentials peer;
  // The session this connection is the lease of; 0 for none.
  SessionId lease = 0;
};

v1::SideResponse ErrorResponse(const absl::Status& status) {
  v1::SideResponse response;
  response.set_error(std::string(status.message()));
  response.set_code(static_cast<int>(status.code()));
  return response;
}

// One frame of a reconnecting client's declaration, on its lease.
absl::StatusOr<v1::SideResponse> Declare(DaemonCore& core,
                                         const SideConnection& c,
                                         const v1::DeclareChunks& declare,
                                         std::vector<UniqueFd> fds) {
  if (c.lease == 0) {
    return absl::FailedPreconditionError(
        "chunks are declared on a lease connection, after the lease");
  }
  const int n = declare.chunk_ids_size();
  if (declare.sizes_size() != n ||
      (declare.offsets_size() != 0 && declare.offsets_size() != n) ||
      (!fds.empty() && fds.size() != static_cast<size_t>(n))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a declaration of ", n, " chunk ids needs as many sizes (got ",
        declare.sizes_size(), "), offsets (got ", declare.offsets_size(),
        ") and FDs, if any (got ", fds.size(), ")"));
  }
  if (static_cast<size_t>(n) > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a declaration frame holds at most ", kMaxFdsPerMessage,
        " chunks; got ", n));
  }
  std::vector<DeclaredChunk> chunks(n);
  for (int i = 0; i < n; ++i) {
    chunks[i].id = declare.chunk_ids(i);
    chunks[i].bytes = declare.sizes(i);
    if (declare.offsets_size() == n) chunks[i].offset = declare.offsets(i);
    if (!fds.empty()) chunks[i].fd = std::move(fds[i]);
  }
  absl::StatusOr<AdoptOutcome> outcome =
      core.DeclareChunks(c.peer, c.lease, std::move(chunks), !declare.more());
  if (!outcome.ok()) return outcome.status();
  v1::SideResponse response;
  for (uint64_t id : outcome->adopted) response.add_adopted_chunk_ids(id);
  for (const auto& [id, why] : outcome->refused) {
    response.add_refused_chunk_ids(id);
    response.add_refused_reasons(why);
  }
  return response;
}

// `request` for the session `c` is the lease of, whatever it names.
template <typename Request>
Request ForLease(const SideConnection& c, Request request) {
  request.set_session_id(c.lease);
  return request;
}

// Sends the FDs of the grant `token` names, a frame per batch (SCM_RIGHTS
// carries at most kMaxFdsPerMessage FDs), the first frame starting from
// `first`; or why not (then `*claimed`, when given, says it). False when
// the connection should close.
bool SendClaim(DaemonCore& core, const SideConnection& c,
               const std::string& token, v1::SideResponse first,
               absl::Status* claimed_status = nullptr) {
  bool connection_ok = true;
  bool first_frame = true;
  absl::Status claimed = core.Claim(
      c.peer, token, kMaxFdsPerMessage,
      [&](std::vector<ChunkFd>& batch, bool last) {
        v1::SideResponse response;
        if (first_frame) response = std::move(first);
        first_frame = false;
        std::vector<int> fds;
        for (const ChunkFd& chunk : batch) {
          response.add_chunk_ids(chunk.id);
          response.add_offsets(chunk.offset);
          response.add_sizes(chunk.bytes);
          fds.push_back(chunk.fd.get());
        }
        response.set_more(!last);
        absl::Status sent =
            SendMessage(c.fd.get(), response.SerializeAsString(), fds);
        connection_ok = sent.ok();
        return sent;
      });
  if (claimed_status != nullptr) *claimed_status = claimed;
  if (!connection_ok) return false;
  if (!claimed.ok()) {
    return SendMessage(c.fd.get(), ErrorResponse(claimed).SerializeAsString())
        .ok();
  }
  return true;
}

// An acquire on the lease: granted and claimed in one answer, or
// would_wait; `*ok` says whether it was not refused. False when the
// connection should close.
bool AcquireOnLease(DaemonCore& core, const SideConnection& c,
                    const v1::AcquireChunksRequest& request, bool* ok) {
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> grant =
      c.lease == 0 ? absl::FailedPreconditionError(
                         "chunks are acquired on a lease connection")
                   : core.AcquireChunksNow(c.peer, ForLease(c, request));
  *ok = grant.ok();
  if (!grant.ok() || !grant->has_value()) {
    v1::SideResponse response = grant.ok() ? v1::SideResponse()
                                           : ErrorResponse(grant.status());
    response.set_would_wait(grant.ok());
    return SendMessage(c.fd.get(), response.SerializeAsString()).ok();
  }
  const std::string& token = (*grant)->claim_token();
  v1::SideResponse first;
  first.set_reused_chunks((*grant)->reused_chunks());
  *first.mutable_client_made_ids() = (*grant)->client_made_ids();
  *first.mutable_client_made_sizes() = (*grant)->client_made_sizes();
  absl::Status claimed;
  const bool connection_ok =
      SendClaim(core, c, token, std::move(first), &claimed);
  *ok = claimed.ok();
  if (!claimed.ok() &&
      core.AbandonGrant(token, absl::StrCat("its claim failed: ",
                                            claimed.message())) == 0) {
    // Some frames went out before it failed (the token is used): the
    // client drops what it got, so the session must not keep the chunks.
    v1::ReleaseChunksRequest release;
    release.set_session_id(c.lease);
    *release.mutable_chunk_ids() = (*grant)->chunk_ids();
    (void)core.ReleaseChunks(c.peer, release);
  }
  return connection_ok;
}

// Answers one request. False when the connection should close.
bool Serve(DaemonCore& core, Metrics& metrics, SideConnection& c) {
  absl::StatusOr<ReceivedMessage> frame =
      ReceiveMessage(c.fd.get(), kMaxSideMessageBytes, kFrameTimeout);
  if (!frame.ok()) return false;  // EOF, garbage or a stalled frame
  v1::SideRequest request;
  if (!request.ParseFromString(frame->payload) ||
      (!frame->fds.empty() &&
       request.request_case() != v1::SideRequest::kDeclare &&
       request.request_case() != v1::SideRequest::kGiveMemory)) {
    (void)SendMessage(c.fd.get(),
                      ErrorResponse(absl::InvalidArgumentError(
                                        "malformed side-socket request"))
                          .SerializeAsString());
    return false;
  }
  switch (request.request_case()) {
    case v1::SideRequest::kLeaseSessionId: {
      absl::Status s = c.lease != 0
                           ? absl::AlreadyExistsError(
                                 "this connection already holds a lease")
                           : core.Lease(c.peer, request.lease_session_id());
      if (s.ok()) c.lease = request.lease_session_id();
      return SendMessage(c.fd.get(), ErrorResponse(s).SerializeAsString())
                 .ok() &&
             s.ok();
    }
    case v1::SideRequest::kClaimToken:
      return SendClaim(core, c, request.claim_token(), v1::SideResponse());
    case v1::SideRequest::kAcquire: {
      const absl::Time start = absl::Now();
      bool ok = false;
      const bool open = AcquireOnLease(core, c, request.acquire(), &ok);
      metrics.Rpc("AcquireChunks", absl::ToDoubleSeconds(absl::Now() - start),
                  ok);
      return open;
    }
    case v1::SideRequest::kRelease: {
      const absl::Time start = absl::Now();
      absl::StatusOr<v1::ReleaseChunksResponse> released =
          c.lease == 0
              ? absl::FailedPreconditionError(
                    "chunks are released on a lease connection")
              : core.ReleaseChunks(c.peer, ForLease(c, request.release()));
      v1::SideResponse response;
      if (released.ok()) {
        response.set_released_bytes(released->released_bytes());
      } else {
        response = ErrorResponse(released.status());
      }
      const bool open =
          SendMessage(c.fd.get(), response.SerializeAsString()).ok();
      metrics.Rpc("ReleaseChunks", absl::ToDoubleSeconds(absl::Now() - start),
                  released.ok());
      return open;
    }
    case v1::SideRequest::kGiveMemory: {
      const auto& ids = request.give_memory().chunk_ids();
      absl::Status given =
          c.lease == 0
              ? absl::FailedPreconditionError(
                    "memory is given on a lease connection, after the lease")
              : core.GiveMemory(c.peer, c.lease, {ids.data(), static_cast<size_t>(ids.size())},
                                std::move(frame->fds));
      return SendMessage(c.fd.get(), ErrorResponse(given).SerializeAsString())
          .ok();
    }
    case v1::SideRequest::kDeclare: {
      absl::StatusOr<v1::SideResponse> answer =
          Declare(core, c, request.declare(), std::move(frame->fds));
      return SendMessage(c.fd.get(), answer.ok()
                                         ? answer->SerializeAsString()
                                         : ErrorResponse(answer.status())
                                               .SerializeAsString())
          .ok();
    }
    default:
      (void)SendMessage(c.fd.get(),
                        ErrorResponse(absl::InvalidArgumentError(
                                          "empty side-socket request"))
                            .SerializeAsString());
      return false;
  }
}

}  // namespace

void SideChannel::Loop() {
  std::map<int, SideConnection> connections;
  auto close_connection = [&](std::map<int, SideConnection>::iterator it,
                              absl::string_view why) {
    if (it->second.lease != 0) {
      core_->EndSession(it->second.lease, why);
    }
    connections.erase(it);
  };
  for (;;) {
    std::vector<pollfd> fds = {{listener_.get(), POLLIN, 0},
                               {stop_.fd(), POLLIN, 0}};
    for (const auto& [fd, c] : connections) fds.push_back({fd, POLLIN, 0});
    const int ready = poll(fds.data(), fds.size(), kExpiryPollMs);
    if (ready < 0 && errno != EINTR) {
      LogError(absl::StrCat("poll on ", path_, ": ", strerror(errno)));
      return;
    }
    core_->ExpireUnleased(absl::Now());
    core_->TrimIdle();
    if (ready <= 0) continue;
    if (fds[1].revents != 0) {
      while (!connections.empty()) {
        close_connection(connections.begin(), "daemon shutting down");
      }
      return;
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections.find(fds[i].fd);
      if (!Serve(*core_, *metrics_, it->second)) {
        close_connection(it, "lease connection closed");
      }
    }
    if (fds[0].revents != 0) {
      absl::StatusOr<UniqueFd> connection = AcceptUnix(listener_.get());
      if (!connection.ok()) continue;
      absl::StatusOr<PeerCredentials> peer =
          GetPeerCredentials(connection->get());
      if (!peer.ok()) continue;
      // A client that stops reading must not stall the loop.
      timeval send_timeout{.tv_sec = 1, .tv_usec = 0};
      setsockopt(connection->get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout,
                 sizeof send_timeout);
      const int fd = connection->get();
      connections.emplace(
          fd, SideConnection{.fd = std::move(*connection), .peer = *peer});
    }
  }
}

}  // namespace allocd
