#include "client/chunk_grants.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

// The chunks a claim's answer carries, with their FDs.
absl::StatusOr<ReceivedChunks> ChunksOfClaim(const Connection& c,
                                             const v1::SideResponse& answer,
                                             std::vector<UniqueFd> fds) {
  ReceivedChunks chunks{
      .epoch = c.epoch,
      .ids = {answer.chunk_ids().begin(), answer.chunk_ids().end()},
      .fds = std::move(fds),
      .offsets = {answer.offsets().begin(), answer.offsets().end()},
      .sizes = {answer.sizes().begin(), answer.sizes().end()},
      .reused = answer.reused_chunks()};
  if (chunks.sizes.empty()) {  // a daemon before sized chunks
    chunks.sizes.assign(chunks.ids.size(), c.pool.chunk_bytes);
  }
  if (chunks.fds.size() != chunks.ids.size() ||
      chunks.offsets.size() != chunks.ids.size() ||
      chunks.sizes.size() != chunks.ids.size() ||
      answer.client_made_sizes_size() != answer.client_made_ids_size()) {
    // Not DataLoss, which says the connection broke (Acquire asks again).
    return absl::InternalError(absl::StrCat(
        "daemon sent ", chunks.fds.size(), " FDs for ", chunks.ids.size(),
        " chunks, and ", answer.client_made_sizes_size(), " sizes for ",
        answer.client_made_ids_size(), " chunks to make"));
  }
  for (int i = 0; i < answer.client_made_ids_size(); ++i) {
    chunks.ids.push_back(answer.client_made_ids(i));
    chunks.fds.emplace_back();
    chunks.offsets.push_back(0);
    chunks.sizes.push_back(answer.client_made_sizes(i));
  }
  chunks.client_made = static_cast<uint32_t>(answer.client_made_ids_size());
  return chunks;
}

// Claims the FDs of a grant (an AcquireChunks or OpenShare answer) over the
// lease of `c`.
absl::StatusOr<ReceivedChunks> ClaimGrant(
    Connection& c, const v1::AcquireChunksResponse& response) {
  v1::SideRequest claim;
  claim.set_claim_token(response.claim_token());
  std::vector<UniqueFd> fds;
  absl::StatusOr<v1::SideResponse> answer = LeaseCall(c, claim, &fds);
  if (!answer.ok()) return answer.status();
  answer->set_reused_chunks(response.reused_chunks());
  *answer->mutable_client_made_ids() = response.client_made_ids();
  *answer->mutable_client_made_sizes() = response.client_made_sizes();
  return ChunksOfClaim(c, *answer, std::move(fds));
}

// A grant on the lease of `c` (lease_acquires), FDs included: nullopt when
// the daemon would have to wait for it (ask over gRPC), or, `read_ahead`
// (up to that many grants of `bytes`), when its cache holds too little or
// it would leave the pool less than as much again.
absl::StatusOr<std::optional<ReceivedChunks>> AcquireOnLease(
    Connection& c, uint64_t bytes, uint64_t max_chunk_bytes,
    uint32_t read_ahead, bool client_creates, bool prewarm) {
  v1::SideRequest request;
  request.mutable_acquire()->set_client_creates(client_creates);
  request.mutable_acquire()->set_prewarm(prewarm);
  request.mutable_acquire()->set_bytes(bytes);
  request.mutable_acquire()->set_max_chunk_bytes(max_chunk_bytes);
  request.mutable_acquire()->set_read_ahead(read_ahead > 0);
  request.mutable_acquire()->set_count(read_ahead);
  std::vector<UniqueFd> fds;
  absl::StatusOr<v1::SideResponse> answer = LeaseCall(c, request, &fds);
  if (!answer.ok()) return answer.status();
  if (answer->would_wait()) return std::nullopt;
  return ChunksOfClaim(c, *answer, std::move(fds));
}

}  // namespace

ChunkGrants::ChunkGrants(const DaemonClientOptions& options,
                         ActiveConnection& active, HeldChunks& held,
                         std::function<void(uint64_t bytes)> report_read_ahead)
    : options_(options),
      active_(active),
      held_(held),
      report_read_ahead_(std::move(report_read_ahead)) {
  if (options_.release_in_background) {
    releaser_ = std::make_unique<ChunkReleaser>(
        [this](const std::shared_ptr<Connection>& owner,
               std::vector<uint64_t> ids) { (void)ReleaseOn(owner, ids); });
  }
  if (options_.read_ahead_keep <= absl::ZeroDuration()) return;
  read_ahead_ = std::make_unique<GrantReadAhead>(
      [this](const GrantReadAhead::Key& key,
             uint32_t count) -> std::vector<ReceivedChunks> {
        std::vector<ReceivedChunks> grants = AcquireAhead(
            key.bytes, key.max_chunk_bytes, count, key.client_creates);
        uint64_t bytes = 0;
        for (const ReceivedChunks& grant : grants) bytes += grant.bytes();
        if (bytes != 0) report_read_ahead_(bytes);
        return grants;
      },
      [this](ReceivedChunks chunks) {
        report_read_ahead_(0);
        (void)Release(chunks.epoch, chunks.ids);
      },
      options_.read_ahead_keep);
}

ChunkGrants::~ChunkGrants() {
  read_ahead_.reset();
  releaser_.reset();
}

uint64_t ChunkGrants::GiveBackForReclaim() {
  const uint64_t given = read_ahead_ != nullptr ? read_ahead_->Drop() : 0;
  FlushReleases();
  return given;
}

absl::StatusOr<ReceivedChunks> ChunkGrants::Acquire(uint64_t bytes,
                                                    uint64_t max_chunk_bytes,
                                                    bool client_creates) {
  const GrantReadAhead::Key key{.bytes = bytes,
                                .max_chunk_bytes = max_chunk_bytes,
                                .client_creates = client_creates};
  GrantReadAhead* const ahead = read_ahead_.get();
  if (std::optional<ReceivedChunks> parked =
          TakeParked(bytes, max_chunk_bytes, client_creates)) {
    ahead->Granted(key, /*readable_ahead=*/true);
    return *std::move(parked);
  }
  own_acquires_.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<std::optional<ReceivedChunks>> got =
      AcquireGrant(bytes, max_chunk_bytes, /*read_ahead=*/0, client_creates,
                   /*prewarm=*/false);
  if (!got.ok()) return got.status();
  if (ahead != nullptr) {
    // The daemon made none of it (cached chunks, or budget for a caller
    // that makes its own, as when a reclaim brought memory back): a fetch
    // would be given its like now.
    ahead->Granted(key,
                   (*got)->reused + (*got)->client_made == (*got)->ids.size());
  }
  return **std::move(got);
}

absl::Status ChunkGrants::Prewarm(uint64_t bytes, uint64_t max_chunk_bytes,
                                  bool client_creates) {
  GrantReadAhead* const ahead = read_ahead_.get();
  if (ahead == nullptr) {
    return absl::FailedPreconditionError(
        "grants are not read ahead here (read_ahead_keep is zero): a grant "
        "asked for ahead would have nowhere to wait for its use");
  }
  const GrantReadAhead::Key key{.bytes = bytes,
                                .max_chunk_bytes = max_chunk_bytes,
                                .client_creates = client_creates};
  ahead->BeginPark(key);
  absl::StatusOr<std::optional<ReceivedChunks>> got =
      AcquireGrant(bytes, max_chunk_bytes, /*read_ahead=*/0, client_creates,
                   /*prewarm=*/true);
  if (!got.ok()) {
    ahead->Park(key, std::nullopt);
    return got.status();
  }
  if (!ahead->Park(key, **std::move(got))) {
    return absl::AbortedError(
        "the daemon asked for memory back while the grant was asked for: "
        "it went back");
  }
  report_read_ahead_(ahead->parked_bytes());
  return absl::OkStatus();
}

std::optional<ReceivedChunks> ChunkGrants::TakeParked(
    uint64_t bytes, uint64_t max_chunk_bytes, bool client_creates) {
  GrantReadAhead* const ahead = read_ahead_.get();
  if (ahead == nullptr) return std::nullopt;
  std::optional<ReceivedChunks> parked =
      ahead->Take({.bytes = bytes,
                   .max_chunk_bytes = max_chunk_bytes,
                   .client_creates = client_creates});
  if (parked.has_value()) report_read_ahead_(ahead->parked_bytes());
  return parked;
}

std::vector<ReceivedChunks> ChunkGrants::AcquireAhead(uint64_t bytes,
                                                      uint64_t max_chunk_bytes,
                                                      uint32_t count,
                                                      bool client_creates) {
  absl::StatusOr<std::optional<ReceivedChunks>> got =
      AcquireGrant(bytes, max_chunk_bytes, std::max<uint32_t>(count, 1),
                   client_creates, /*prewarm=*/false);
  if (!got.ok() || !got->has_value()) return {};
  const uint64_t epoch = (*got)->epoch;
  const std::vector<uint64_t> ids = (*got)->ids;
  const uint64_t unit = active_.terms().chunk_bytes;
  absl::StatusOr<std::vector<ReceivedChunks>> grants =
      SplitGrant(**std::move(got), (bytes + unit - 1) / unit * unit);
  if (!grants.ok()) {  // not the daemon's grants of `bytes`: unusable
    (void)Release(epoch, ids);
    return {};
  }
  return *std::move(grants);
}

absl::StatusOr<ReceivedChunks> ChunkGrants::AcquireOverRpc(
    Connection& c, uint64_t bytes, uint64_t max_chunk_bytes,
    bool client_creates, bool prewarm) {
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  v1::AcquireChunksRequest request;
  NameSession(c, request);
  request.set_bytes(bytes);
  request.set_max_chunk_bytes(max_chunk_bytes);
  request.set_client_creates(client_creates);
  request.set_prewarm(prewarm);
  v1::AcquireChunksResponse response;
  grpc::Status status = c.stub->AcquireChunks(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::UnavailableError(status.error_message());
  }
  if (!status.ok()) return FromGrpc(status);
  absl::StatusOr<ReceivedChunks> claimed = ClaimGrant(c, response);
  if (!claimed.ok() && !absl::IsUnavailable(claimed.status()) &&
      !absl::IsDataLoss(claimed.status())) {
    // Unusable here, so not ours to keep: the session must not hold
    // them. (A lease acquire's daemon takes them back itself.)
    std::vector<uint64_t> ids(response.chunk_ids().begin(),
                              response.chunk_ids().end());
    (void)Release(c.epoch, ids);
  }
  return claimed;
}

absl::StatusOr<std::optional<ReceivedChunks>> ChunkGrants::AcquireGrant(
    uint64_t bytes, uint64_t max_chunk_bytes, uint32_t read_ahead,
    bool client_creates, bool prewarm) {
  const bool may_wait = read_ahead == 0;
  const absl::Time deadline =
      may_wait ? absl::Now() + options_.reconnect_wait : absl::Now();
  for (;;) {
    std::shared_ptr<Connection> c = active_.WaitConnected(deadline);
    if (c == nullptr && !may_wait) return std::nullopt;
    if (c == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "the allocd daemon at ", options_.socket,
          " did not come back within ",
          absl::FormatDuration(options_.reconnect_wait)));
    }
    // Releases handed over before the ask: a refusal may predate them,
    // even when they are delivered by the time it comes back.
    const bool releases_before = ReleasesPending();
    // One round trip on the lease when the daemon can grant at once; over
    // gRPC when it has to wait (or speaks no lease acquires).
    absl::StatusOr<std::optional<ReceivedChunks>> on_lease = std::nullopt;
    if (c->lease_acquires) {
      on_lease = AcquireOnLease(*c, bytes, max_chunk_bytes, read_ahead,
                                client_creates, prewarm);
    }
    if (on_lease.ok() && !on_lease->has_value()) {
      if (!may_wait) return std::nullopt;
      // Before the daemon waits for other sessions to give memory back,
      // this process gives back what it freed.
      if (releases_before) {
        FlushReleases();
        continue;
      }
    }
    absl::StatusOr<ReceivedChunks> chunks =
        !on_lease.ok()          ? on_lease.status()
        : on_lease->has_value() ? **std::move(on_lease)
                                : AcquireOverRpc(*c, bytes, max_chunk_bytes,
                                                 client_creates, prewarm);
    if (absl::IsUnavailable(chunks.status()) ||
        absl::IsDataLoss(chunks.status())) {
      // The daemon died mid-call: the grant died with it. Ask the next.
      active_.Lost(c);
      if (!may_wait) return std::nullopt;
      continue;
    }
    if (may_wait && absl::IsResourceExhausted(chunks.status()) && releases_before) {
      FlushReleases();
      continue;  // a quota or the node may have room now
    }
    if (!chunks.ok()) return chunks.status();
    if (!held_.Record(*c, *chunks)) {
      // The daemon restarted meanwhile and the new one has heard what
      // this process holds already: these are nobody's now. Ask again.
      if (!may_wait) return std::nullopt;
      continue;
    }
    return std::optional<ReceivedChunks>(*std::move(chunks));
  }
}

absl::StatusOr<std::shared_ptr<Connection>> ChunkGrants::Owner(
    uint64_t epoch, absl::Span<const uint64_t> ids, absl::string_view refused) {
  std::shared_ptr<Connection> c = active_.Current();
  if (c == nullptr || !held_.OwnedBy(*c, epoch, ids)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "these chunks came from an allocd daemon this process is no longer "
        "connected to (and the daemon now did not adopt them): ",
        refused));
  }
  return c;
}

absl::Status ChunkGrants::ReleaseOn(const std::shared_ptr<Connection>& c,
                                    absl::Span<const uint64_t> ids) {
  absl::Status s = ReleaseChunks(*c, ids, options_.rpc_timeout);
  if (absl::IsUnavailable(s)) {
    active_.Lost(c);
    return absl::OkStatus();  // the daemon takes them back when it ends
  }
  return s;
}

absl::Status ChunkGrants::Release(uint64_t epoch,
                                  absl::Span<const uint64_t> ids) {
  HeldChunks::Forgotten owned = held_.Forget(epoch, ids, active_);
  if (owned.ids.empty()) return absl::OkStatus();
  return ReleaseOn(owned.owner, owned.ids);
}

void ChunkGrants::ReleaseSoon(uint64_t epoch, absl::Span<const uint64_t> ids) {
  if (releaser_ == nullptr) {
    (void)Release(epoch, ids);
    return;
  }
  HeldChunks::Forgotten owned = held_.Forget(epoch, ids, active_);
  releaser_->Add(std::move(owned.owner), std::move(owned.ids));
}

bool ChunkGrants::FlushReleases() {
  return releaser_ != nullptr && releaser_->Flush();
}

bool ChunkGrants::ReleasesPending() const {
  return releaser_ != nullptr && releaser_->pending_chunks() > 0;
}

uint64_t ChunkGrants::background_release_calls() const {
  return releaser_ == nullptr ? 0 : releaser_->deliveries();
}

absl::StatusOr<std::string> ChunkGrants::Share(
    uint64_t epoch, absl::Span<const uint64_t> ids) {
  absl::StatusOr<std::shared_ptr<Connection>> owner =
      Owner(epoch, ids, "they cannot be shared");
  if (!owner.ok()) return owner.status();
  const std::shared_ptr<Connection>& c = *owner;
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  v1::ShareChunksRequest request;
  NameSession(*c, request);
  for (uint64_t id : ids) request.add_chunk_ids(id);
  v1::ShareChunksResponse response;
  if (grpc::Status s = c->stub->ShareChunks(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  return response.share_token();
}

absl::Status ChunkGrants::GiveMemory(uint64_t epoch,
                                     absl::Span<const uint64_t> ids,
                                     absl::Span<const int> fds,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (ids.size() != fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " FDs for ", ids.size(), " chunks"));
  }
  absl::StatusOr<std::shared_ptr<Connection>> owner =
      Owner(epoch, ids, "their memory cannot be given to it");
  if (!owner.ok()) return owner.status();
  Connection& c = **owner;
  for (size_t begin = 0; begin < ids.size(); begin += kMaxFdsPerMessage) {
    const size_t n = std::min(ids.size() - begin, kMaxFdsPerMessage);
    v1::SideRequest request;
    for (uint64_t id : ids.subspan(begin, n)) {
      request.mutable_give_memory()->add_chunk_ids(id);
    }
    absl::StatusOr<v1::SideResponse> answer =
        LeaseCall(c, request, nullptr, fds.subspan(begin, n),
                  deadline - absl::Now());
    if (!answer.ok()) return answer.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedChunks> ChunkGrants::OpenShare(
    const std::string& share_token) {
  std::shared_ptr<Connection> c = active_.Current();
  if (c == nullptr) return absl::UnavailableError("not connected to allocd");
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  v1::OpenShareRequest request;
  NameSession(*c, request);
  request.set_share_token(share_token);
  v1::AcquireChunksResponse response;
  if (grpc::Status s = c->stub->OpenShare(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  absl::StatusOr<ReceivedChunks> chunks = ClaimGrant(*c, response);
  if (!chunks.ok()) (void)CloseShare(c->epoch, share_token);
  return chunks;
}

absl::Status ChunkGrants::CloseShare(uint64_t epoch,
                                     const std::string& share_token) {
  std::shared_ptr<Connection> c = active_.Current();
  if (c == nullptr || c->epoch != epoch) return absl::OkStatus();
  v1::CloseShareRequest request;
  request.set_share_token(share_token);
  return active_.Call(options_.rpc_timeout, &v1::Allocd::Stub::CloseShare,
                      std::move(request));
}

}  // namespace allocd
