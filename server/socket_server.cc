#include "server/socket_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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
//
// A client writes each frame whole: one that started a frame and has not
// finished it within this is closed. Meanwhile the loop serves the others.
constexpr absl::Duration kFrameDeadline = absl::Seconds(2);
// A client reads its answers as they come (a claim's FDs a frame at a
// time): one whose unread answers have not moved for this long is closed,
// so that what they hold (a claim's FDs, counted in the daemon's open
// files) goes back. Meanwhile the loop serves the others.
constexpr absl::Duration kAnswerDeadline = absl::Seconds(5);
// How often the side channel looks for sessions that never leased, and
// for stalled frames.
constexpr absl::Duration kTickPeriod = absl::Milliseconds(250);

// Connections taken from a listener's backlog per round of its loop: the
// most a loop serves before it looks at its other events again.
constexpr int kAcceptBatch = 64;

// The pace and bound flags both sockets share.
constexpr absl::string_view kAcceptRateFlag = "--accept-rate-per-uid";
constexpr absl::string_view kPerTenantFlag = "--max-connections-per-tenant";
constexpr absl::string_view kTotalFlag = "--max-connections";

// Takes connections from the backlog of `listener` (non-blocking; the
// socket at `path`) until it is empty or kAcceptBatch went, each with its
// peer's credentials, and hands each to `admit` with whether its uid's
// `pacer` lets it in: the pace costs an accept and a credentials read, so
// that connections past it go at once. Failures are logged.
void AcceptBacklog(
    int listener, const std::string& path, AcceptPacer& pacer,
    absl::FunctionRef<void(UniqueFd, const PeerCredentials&, absl::Status)>
        admit) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    absl::StatusOr<UniqueFd> connection = AcceptUnix(listener);
    if (!connection.ok()) {
      if (!absl::IsUnavailable(connection.status())) {  // not just drained
        LogError(absl::StrCat("accept on ", path, ": ",
                              connection.status().message()));
      }
      return;
    }
    absl::StatusOr<PeerCredentials> peer =
        GetPeerCredentials(connection->get());
    if (!peer.ok()) {
      LogError(absl::StrCat("SO_PEERCRED on ", path, ": ",
                            peer.status().message()));
      continue;
    }
    absl::Status paced = pacer.Take(peer->uid, peer->pid, absl::Now());
    admit(*std::move(connection), *peer, std::move(paced));
  }
}

// `listener`, non-blocking: its loop drains the backlog without waiting.
absl::StatusOr<UniqueFd> NonBlocking(absl::StatusOr<UniqueFd> listener) {
  if (listener.ok() &&
      fcntl(listener->get(), F_SETFL,
            fcntl(listener->get(), F_GETFL) | O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("fcntl O_NONBLOCK: ", strerror(errno)));
  }
  return listener;
}

}  // namespace

WakeFd::WakeFd() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void WakeFd::Wake() {
  const uint64_t one = 1;
  (void)!write(fd_.get(), &one, sizeof one);
}

// ----------------------------------------------------------- GrpcAcceptor

absl::StatusOr<std::unique_ptr<GrpcAcceptor>> GrpcAcceptor::Start(
    const std::string& path, mode_t mode, bool admin_socket,
    grpc::Server* server, PeerTable* peers, const DaemonCore* core,
    std::optional<ConnectionLimits> connections) {
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) {
    return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  }
  absl::StatusOr<UniqueFd> listener = NonBlocking(ListenUnix(path, mode));
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<GrpcAcceptor>(new GrpcAcceptor(
      path, admin_socket, std::move(*listener), std::move(epoll), server,
      peers, core, connections));
}

GrpcAcceptor::GrpcAcceptor(std::string path, bool admin_socket,
                           UniqueFd listener, UniqueFd epoll,
                           grpc::Server* server, PeerTable* peers,
                           const DaemonCore* core,
                           std::optional<ConnectionLimits> connections)
    : path_(std::move(path)),
      admin_socket_(admin_socket),
      listener_(std::move(listener)),
      epoll_(std::move(epoll)),
      server_(server),
      peers_(peers),
      core_(core),
      pacer_("client-socket connection", std::string(kAcceptRateFlag),
             connections.has_value() ? connections->rate : AcceptRate{}) {
  if (connections.has_value()) {
    connections_.emplace("client-socket connection",
                         std::string(kPerTenantFlag), std::string(kTotalFlag),
                         connections->held);
  }
  for (const int fd : {listener_.get(), stop_.fd()}) {
    epoll_event e{.events = EPOLLIN, .data = {.fd = fd}};
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e);
  }
  thread_ = std::thread([this] { Loop(); });
}

GrpcAcceptor::~GrpcAcceptor() {
  stop_.Wake();
  thread_.join();
  unlink(path_.c_str());
}

void GrpcAcceptor::Loop() {
  constexpr int kEvents = 256;
  epoll_event events[kEvents];
  for (;;) {
    const int ready = epoll_wait(epoll_.get(), events, kEvents, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      LogError(absl::StrCat("epoll_wait on ", path_, ": ", strerror(errno)));
      return;
    }
    bool backlog = false;
    for (int i = 0; i < ready; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_.fd()) return;
      if (fd == listener_.get()) {
        backlog = true;
      } else {
        Forget(fd);
      }
    }
    // After the closes: what they held makes room for the new ones.
    if (!backlog) continue;
    AcceptBacklog(listener_.get(), path_, pacer_,
                  [&](UniqueFd connection, const PeerCredentials& peer,
                      absl::Status paced) {
                    if (paced.ok()) Admit(std::move(connection), peer);
                  });
  }
}

void GrpcAcceptor::Forget(int fd) {
  auto it = counted_.find(fd);
  if (it == counted_.end()) return;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  connections_->Give(it->second.tenant);
  counted_.erase(it);  // closes the duplicate
}

void GrpcAcceptor::Admit(UniqueFd connection, const PeerCredentials& peer) {
  const int fd = connection.get();
  if (connections_.has_value()) {
    // A peer with no tenant (pid 0) is refused at registration, saying
    // why; until then its connections count together.
    absl::StatusOr<TenantId> tenant = core_->TenantOf(peer);
    const TenantId counted = tenant.ok() ? *tenant : TenantId("unresolved");
    if (!connections_
             ->Take(counted, absl::StrCat("pid ", peer.pid, ", uid ", peer.uid))
             .ok()) {
      return;  // closed
    }
    // Events 0: a hang-up (or an error) is reported whatever is asked.
    absl::StatusOr<UniqueFd> duplicate = DuplicateFd(fd);
    epoll_event e{.events = 0,
                  .data = {.fd = duplicate.ok() ? duplicate->get() : -1}};
    if (!duplicate.ok() ||
        epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, duplicate->get(), &e) != 0) {
      LogError(absl::StrCat("closing a connection of pid ", peer.pid,
                            " on ", path_, ": cannot watch it: ",
                            duplicate.ok() ? strerror(errno)
                                           : duplicate.status().ToString()));
      connections_->Give(counted);
      return;
    }
    const int key = duplicate->get();
    counted_.emplace(key, Counted{.duplicate = *std::move(duplicate),
                                  .tenant = counted});
  }
  // gRPC's event engine expects a non-blocking socket.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  peers_->Add(fd, peer, admin_socket_);
  grpc::AddInsecureChannelFromFd(server_, connection.release());
}

// ------------------------------------------------------------ SideChannel

absl::StatusOr<std::unique_ptr<SideChannel>> SideChannel::Start(
    const std::string& path, mode_t mode, DaemonCore* core, Metrics* metrics,
    ConnectionLimits connections) {
  absl::StatusOr<UniqueFd> listener = NonBlocking(ListenUnix(path, mode));
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<SideChannel>(new SideChannel(
      path, std::move(*listener), core, metrics, connections));
}

SideChannel::SideChannel(std::string path, UniqueFd listener,
                         DaemonCore* core, Metrics* metrics,
                         ConnectionLimits connections)
    : path_(std::move(path)),
      listener_(std::move(listener)),
      core_(core),
      metrics_(metrics),
      pacer_("side-socket connection", std::string(kAcceptRateFlag),
             connections.rate),
      connections_("side-socket connection", std::string(kPerTenantFlag),
                   std::string(kTotalFlag), connections.held),
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
  // The secret the lease proved it with, for the requests on the lease.
  std::string secret;
  TenantId tenant;
  FrameAssembler input{kMaxSideMessageBytes};
  // When `input` began its partial frame.
  absl::Time frame_began = absl::InfiniteFuture();
  // The answers the peer has not read yet. While there are some, its next
  // request waits: one peer's unread answers never pile up.
  FrameQueue output;
  // Since when the peer has read none of `output`; InfiniteFuture while
  // nothing waits.
  absl::Time answer_stalled_since = absl::InfiniteFuture();

  // Queues `response`; false when the connection should close.
  bool Answer(const v1::SideResponse& response,
              std::vector<UniqueFd> fds = {}) {
    return output.Send(fd.get(), response.SerializeAsString(), std::move(fds))
        .ok();
  }
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
      core.DeclareChunks(c.peer, c.lease, c.secret, std::move(chunks),
                         !declare.more());
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
  request.set_session_secret(c.secret);
  return request;
}

// Sends the FDs of the grant `token` names, a frame per batch (SCM_RIGHTS
// carries at most kMaxFdsPerMessage FDs), the first frame starting from
// `first`; or why not (then `*claimed`, when given, says it). False when
// the connection should close.
bool SendClaim(DaemonCore& core, SideConnection& c,
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
        std::vector<UniqueFd> fds;
        for (ChunkFd& chunk : batch) {
          response.add_chunk_ids(chunk.id);
          response.add_offsets(chunk.offset);
          response.add_sizes(chunk.bytes);
          fds.push_back(std::move(chunk.fd));
        }
        response.set_more(!last);
        absl::Status sent = c.output.Send(
            c.fd.get(), response.SerializeAsString(), std::move(fds));
        connection_ok = sent.ok();
        return sent;
      });
  if (claimed_status != nullptr) *claimed_status = claimed;
  if (!connection_ok) return false;
  if (!claimed.ok()) return c.Answer(ErrorResponse(claimed));
  return true;
}

// An acquire on the lease: granted and claimed in one answer, or
// would_wait; `*ok` says whether it was not refused. False when the
// connection should close.
bool AcquireOnLease(DaemonCore& core, SideConnection& c,
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
    return c.Answer(response);
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
    *release.mutable_chunk_ids() = (*grant)->chunk_ids();
    (void)core.ReleaseChunks(c.peer, ForLease(c, release));
  }
  return connection_ok;
}

// Answers the request in `frame`. False when the connection should close.
bool Serve(DaemonCore& core, Metrics& metrics, SideConnection& c,
           ReceivedMessage frame) {
  v1::SideRequest request;
  if (!request.ParseFromString(frame.payload) ||
      (!frame.fds.empty() &&
       request.request_case() != v1::SideRequest::kDeclare &&
       request.request_case() != v1::SideRequest::kGiveMemory)) {
    (void)c.Answer(ErrorResponse(
        absl::InvalidArgumentError("malformed side-socket request")));
    return false;
  }
  switch (request.request_case()) {
    case v1::SideRequest::kLeaseSessionId: {
      absl::Status s = c.lease != 0
                           ? absl::AlreadyExistsError(
                                 "this connection already holds a lease")
                           : core.Lease(c.peer, request.lease_session_id(),
                                        request.session_secret());
      if (s.ok()) {
        c.lease = request.lease_session_id();
        c.secret = request.session_secret();
      }
      return c.Answer(ErrorResponse(s)) && s.ok();
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
      const bool open = c.Answer(response);
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
              : core.GiveMemory(c.peer, c.lease, c.secret,
                                {ids.data(), static_cast<size_t>(ids.size())},
                                std::move(frame.fds));
      return c.Answer(ErrorResponse(given));
    }
    case v1::SideRequest::kDeclare: {
      absl::StatusOr<v1::SideResponse> answer =
          Declare(core, c, request.declare(), std::move(frame.fds));
      return c.Answer(answer.ok() ? *answer : ErrorResponse(answer.status()));
    }
    default:
      (void)c.Answer(ErrorResponse(
          absl::InvalidArgumentError("empty side-socket request")));
      return false;
  }
}

}  // namespace

void SideChannel::Loop() {
  std::map<int, SideConnection> connections;
  auto close_connection = [&](std::map<int, SideConnection>::iterator it,
                              absl::string_view why) {
    if (it->second.lease != 0) core_->EndSession(it->second.lease, why);
    connections_.Give(it->second.tenant);
    connections.erase(it);
  };
  // Takes a connection, unless its uid opens them past its rate, or its
  // tenant or the daemon holds its limit.
  auto admit = [&](UniqueFd connection, const PeerCredentials& peer,
                   absl::Status paced) {
    absl::StatusOr<TenantId> tenant =
        paced.ok() ? core_->TenantOf(peer) : paced;
    absl::Status taken =
        tenant.ok()
            ? connections_.Take(*tenant, absl::StrCat("pid ", peer.pid,
                                                      ", uid ", peer.uid))
            : tenant.status();
    if (!taken.ok()) {
      // Told why before it goes: a fresh socket's buffer takes the frame.
      FrameQueue refusal;
      (void)refusal.Send(connection.get(),
                         ErrorResponse(taken).SerializeAsString());
      return;
    }
    const int fd = connection.get();
    connections.emplace(fd, SideConnection{.fd = std::move(connection),
                                           .peer = peer,
                                           .tenant = *std::move(tenant)});
  };
  absl::Time next_tick = absl::InfinitePast();
  for (;;) {
    // A connection with answers unread waits for the peer to read them; the
    // others for their next request.
    std::vector<pollfd> fds = {{listener_.get(), POLLIN, 0},
                               {stop_.fd(), POLLIN, 0}};
    for (const auto& [fd, c] : connections) {
      fds.push_back(
          {fd, static_cast<short>(c.output.pending() ? POLLOUT : POLLIN), 0});
    }
    const int ready =
        poll(fds.data(), fds.size(),
             static_cast<int>(absl::ToInt64Milliseconds(kTickPeriod)));
    if (ready < 0 && errno != EINTR) {
      LogError(absl::StrCat("poll on ", path_, ": ", strerror(errno)));
      return;
    }
    if (ready > 0 && fds[1].revents != 0) {
      while (!connections.empty()) {
        close_connection(connections.begin(), "daemon shutting down");
      }
      return;
    }
    const absl::Time now = absl::Now();
    if (now >= next_tick) {
      next_tick = now + kTickPeriod;
      core_->ExpireUnleased(now);
      core_->TrimIdle();
      for (auto it = connections.begin(); it != connections.end();) {
        auto next = std::next(it);
        const SideConnection& c = it->second;
        if (now - c.frame_began > kFrameDeadline) {
          LogError(absl::StrCat(
              "side socket: closing a connection of pid ", c.peer.pid, " (",
              c.tenant, "): it sent part of a request and not the rest "
              "within ", absl::FormatDuration(kFrameDeadline)));
          close_connection(it, "its lease connection stalled mid-request");
        } else if (now - c.answer_stalled_since > kAnswerDeadline) {
          LogError(absl::StrCat(
              "side socket: closing a connection of pid ", c.peer.pid, " (",
              c.tenant, "): it read nothing of its answers (",
              c.output.pending_bytes(), " bytes) within ",
              absl::FormatDuration(kAnswerDeadline)));
          close_connection(it, "its lease connection did not read its answers");
        }
        it = next;
      }
    }
    if (ready <= 0) continue;
    // At most one request per connection per round: a flooding peer waits
    // its turn like the others.
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      SideConnection& c = it->second;
      if (c.output.pending()) {
        const size_t unread = c.output.pending_bytes();
        if (!c.output.Flush(c.fd.get()).ok()) {
          close_connection(it, "lease connection closed");
          continue;
        }
        if (c.output.pending_bytes() < unread) {
          c.answer_stalled_since =
              c.output.pending() ? now : absl::InfiniteFuture();
        }
        continue;
      }
      absl::StatusOr<std::optional<ReceivedMessage>> frame =
          c.input.ReadReady(c.fd.get());
      if (!frame.ok()) {  // EOF, garbage, or over the size limit
        close_connection(it, "lease connection closed");
        continue;
      }
      if (!frame->has_value()) {
        if (c.input.partial() && c.frame_began == absl::InfiniteFuture()) {
          c.frame_began = now;
        }
        continue;
      }
      c.frame_began = absl::InfiniteFuture();
      if (!Serve(*core_, *metrics_, c, **std::move(frame))) {
        close_connection(it, "lease connection closed");
        continue;
      }
      if (c.output.pending()) c.answer_stalled_since = now;
    }
    if (fds[0].revents != 0) {
      AcceptBacklog(listener_.get(), path_, pacer_, admit);
    }
  }
}

}  // namespace allocd
