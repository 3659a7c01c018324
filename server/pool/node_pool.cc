// NodePool's sessions, claims, releases, shares, quotas and trims; the
// acquire path is in node_pool_acquire.cc, adoption in node_pool_adopt.cc.
#include "server/pool/node_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace allocd {

NodePool::NodePool(ChunkSource* source, Options options)
    : source_(source),
      options_(std::move(options)),
      classes_(options_.chunk_classes, source->Granularity()),
      capacity_(options_.capacity),
      next_chunk_id_(
          (uint64_t{options_.chunk_id_epoch & 0xFFFFFF} << 40) + 1),
      claims_(options_.token_ttl, options_.now) {}

uint64_t NodePool::NewChunkId() {
  uint64_t id;
  do {
    id = next_chunk_id_++;
  } while (chunks_.contains(id));
  return id;
}

absl::Status NodePool::AddSession(SessionId id, uid_t uid, pid_t pid,
                                  TenantId tenant) {
  if (id == kNoSession) {
    return absl::InvalidArgumentError("session id 0 is reserved");
  }
  if (tenant.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", id, " has no tenant"));
  }
  SessionState state;
  state.uid = uid;
  state.pid = pid;
  state.tenant = std::move(tenant);
  absl::MutexLock lock(&mu_);
  state.incarnation = next_incarnation_;
  if (!sessions_.try_emplace(id, std::move(state)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " is already in the node pool"));
  }
  ++next_incarnation_;
  return absl::OkStatus();
}

void NodePool::AddHeld(SessionState& s, uint64_t bytes) {
  ++holdings_version_;
  s.held += bytes;
  uid_held_[s.uid] += bytes;
  tenant_held_[s.tenant] += bytes;
}

void NodePool::SubtractHeld(SessionState& s, uint64_t bytes) {
  if (bytes == 0) return;
  ++holdings_version_;
  s.held -= bytes;
  auto it = uid_held_.find(s.uid);  // present: it counts s.held
  it->second -= bytes;
  if (it->second == 0) uid_held_.erase(it);
  auto t = tenant_held_.find(s.tenant);  // present, as above
  t->second -= bytes;
  if (t->second == 0) tenant_held_.erase(t);
}

void NodePool::ReturnToCache(uint64_t chunk_id, Chunk& chunk) {
  if (!HasMemory(chunk)) {
    // Adopted on a client's word: no memory here to hand out again.
    live_bytes_ -= chunk.bytes;
    chunks_.erase(chunk_id);
    return;
  }
  chunk.owner = kNoSession;
  chunk.pending = false;
  chunk.grant = 0;
  chunk.freed_at = options_.now();
  chunk.free_order = next_free_order_++;
  free_.emplace(chunk.free_order, chunk_id);
  free_by_tenant_[{chunk.tenant, chunk.bytes}].emplace(chunk.free_order,
                                                       chunk_id);
  free_bytes_ += chunk.bytes;
}

void NodePool::RemoveFromCache(const Chunk& chunk) {
  free_.erase(chunk.free_order);
  auto same_kind = free_by_tenant_.find(std::pair(chunk.tenant, chunk.bytes));
  same_kind->second.erase(chunk.free_order);
  if (same_kind->second.empty()) free_by_tenant_.erase(same_kind);
  free_bytes_ -= chunk.bytes;
}

uint64_t NodePool::BytesOf(
    const absl::flat_hash_set<uint64_t>& chunk_ids) const {
  uint64_t bytes = 0;
  for (uint64_t chunk_id : chunk_ids) bytes += chunks_.at(chunk_id).bytes;
  return bytes;
}

uint64_t NodePool::EndSession(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return 0;
  SessionState& state = s->second;
  const uint64_t returned = BytesOf(state.chunks);
  for (uint64_t chunk_id : state.chunks) {
    Disown(chunk_id, chunks_.at(chunk_id));
  }
  CacheUnowned(shares_.EndSession(mu_, id));
  // Including chunks an Acquire of this session is still creating: that
  // Acquire sees the session gone and caches them.
  SubtractHeld(state, state.held);
  claims_.EndSession(mu_, id);
  sessions_.erase(s);
  return returned;
}

void NodePool::DropExpiredClaims() {
  for (const PendingClaim& claim : claims_.TakeExpired(mu_)) {
    ReturnUnclaimed(claim);
  }
}

absl::StatusOr<NodePool::SessionState*> NodePool::FindSession(SessionId id) {
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, " in the node pool"));
  }
  return &s->second;
}

NodePool::SessionState* NodePool::SameSession(SessionId id,
                                              uint64_t incarnation) {
  auto s = sessions_.find(id);
  return s != sessions_.end() && s->second.incarnation == incarnation
             ? &s->second
             : nullptr;
}

uint64_t NodePool::ReturnUnclaimed(const PendingClaim& claim) {
  SessionState* s = SameSession(claim.session, claim.incarnation);
  if (s == nullptr) return 0;  // EndSession took the chunks back already.
  if (!claim.share.empty()) {  // an open: the chunks stay their owner's
    if (std::optional<std::vector<uint64_t>> unheld =
            shares_.Close(mu_, claim.session, claim.share)) {
      CacheUnowned(*unheld);
    }
    return 0;
  }
  uint64_t returned = 0;
  for (uint64_t chunk_id : claim.chunk_ids) {
    auto chunk = chunks_.find(chunk_id);
    if (chunk == chunks_.end() || chunk->second.grant != claim.grant ||
        chunk->second.owner != claim.session || chunk->second.pending) {
      continue;
    }
    s->chunks.erase(chunk_id);
    Disown(chunk_id, chunk->second);
    returned += chunk->second.bytes;
  }
  SubtractHeld(*s, returned);
  return returned;
}

uint64_t NodePool::Abandon(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  std::optional<PendingClaim> claim = claims_.Take(mu_, token);
  return claim ? ReturnUnclaimed(*claim) : 0;
}

std::string NodePool::AddClaim(SessionId id, const SessionState& s,
                               std::string token, uint64_t grant,
                               const std::vector<uint64_t>& chunk_ids,
                               std::string share) {
  DropExpiredClaims();
  claims_.Add(mu_, token,
              PendingClaim{.grant = grant,
                           .session = id,
                           .incarnation = s.incarnation,
                           .pid = s.pid,
                           .chunk_ids = chunk_ids,
                           .share = std::move(share)});
  return token;
}

absl::Status NodePool::Claim(absl::string_view token, pid_t claimer_pid,
                            size_t batch_size, ClaimSink sink) {
  // The files are copied under the lock and opened outside it; the
  // shared_ptrs keep them open even if the chunks are trimmed meanwhile.
  struct File {
    uint64_t chunk_id;
    ChunkMemory memory;
    uint64_t bytes;
  };
  std::vector<File> files;
  PendingClaim claim;
  {
    absl::MutexLock lock(&mu_);
    DropExpiredClaims();
    absl::StatusOr<PendingClaim> taken =
        claims_.TakeFor(mu_, token, claimer_pid);
    if (!taken.ok()) return taken.status();
    claim = *std::move(taken);
    // EndSession forgets its claims: never.  (Kept as a check.)
    if (SameSession(claim.session, claim.incarnation) == nullptr) {
      return absl::NotFoundError("the claim's session ended");
    }
    for (uint64_t chunk_id : claim.chunk_ids) {
      auto chunk = chunks_.find(chunk_id);
      // Released (or its session ended) since the Acquire: not sent. An
      // open's chunks are another session's, and live while it is open.
      if (chunk == chunks_.end() ||
          (claim.share.empty() && chunk->second.owner != claim.session)) {
        continue;
      }
      files.push_back({chunk_id, chunk->second.memory, chunk->second.bytes});
    }
  }
  batch_size = std::max<size_t>(batch_size, 1);
  std::vector<ChunkFd> batch;
  for (size_t begin = 0; begin == 0 || begin < files.size();
       begin += batch_size) {
    const size_t end = std::min(files.size(), begin + batch_size);
    batch.clear();
    for (size_t i = begin; i < end; ++i) {
      const auto& [chunk_id, memory, bytes] = files[i];
      absl::StatusOr<UniqueFd> copy = source_->OpenForClient(memory);
      if (!copy.ok()) {
        if (begin > 0) {
          return absl::Status(copy.status().code(),
                              absl::StrCat("chunk ", chunk_id, ": ",
                                           copy.status().message()));
        }
        // Nothing went out yet: give the token back, so the client can retry.
        absl::MutexLock lock(&mu_);
        if (SameSession(claim.session, claim.incarnation) != nullptr) {
          claims_.PutBack(mu_, std::string(token), std::move(claim));
        }
        return absl::Status(
            copy.status().code(),
            absl::StrCat("chunk ", chunk_id, ": ", copy.status().message(),
                         " (the claim token stays valid)"));
      }
      batch.push_back(ChunkFd{.id = chunk_id,
                              .fd = *std::move(copy),
                              .offset = memory.offset,
                              .bytes = bytes});
    }
    if (absl::Status s = sink(batch, end == files.size()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::flat_hash_set<uint64_t>> NodePool::HeldBy(
    SessionId id, absl::Span<const uint64_t> chunk_ids,
    absl::string_view what) const {
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(chunk_ids.size());
  for (uint64_t chunk_id : chunk_ids) {
    if (!seen.insert(chunk_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk_id, " is listed twice"));
    }
    auto chunk = chunks_.find(chunk_id);
    if (chunk == chunks_.end() || chunk->second.owner != id ||
        chunk->second.pending) {
      return absl::PermissionDeniedError(
          absl::StrCat("chunk ", chunk_id, " is not held by session ", id,
                       "; nothing was ", what));
    }
  }
  return seen;
}

absl::Status NodePool::Release(SessionId id,
                               absl::Span<const uint64_t> chunk_ids) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<SessionState*> found = FindSession(id);
  if (!found.ok()) return found.status();
  SessionState& state = **found;
  absl::StatusOr<absl::flat_hash_set<uint64_t>> released_ids =
      HeldBy(id, chunk_ids, "released");
  if (!released_ids.ok()) return released_ids.status();
  uint64_t released = 0;
  for (uint64_t chunk_id : chunk_ids) {
    state.chunks.erase(chunk_id);
    Chunk& chunk = chunks_.at(chunk_id);
    released += chunk.bytes;
    Disown(chunk_id, chunk);
  }
  SubtractHeld(state, released);
  shares_.EndShares(mu_, *released_ids);
  return absl::OkStatus();
}

absl::StatusOr<std::string> NodePool::Share(
    SessionId id, absl::Span<const uint64_t> chunk_ids) {
  if (chunk_ids.empty()) {
    return absl::InvalidArgumentError("a share of no chunks");
  }
  absl::StatusOr<std::string> token = NewToken();  // a syscall: unlocked
  if (!token.ok()) return token.status();
  absl::MutexLock lock(&mu_);
  if (absl::Status found = FindSession(id).status(); !found.ok()) return found;
  if (absl::Status held = HeldBy(id, chunk_ids, "shared").status();
      !held.ok()) {
    return held;
  }
  for (uint64_t chunk_id : chunk_ids) {
    if (!HasMemory(chunks_.at(chunk_id))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon holds no memory of chunk ", chunk_id,
          " (made by its client, or adopted on the client's word after a "
          "daemon restart) to give another process; nothing was shared "
          "(the client gives it first: GiveMemory)"));
    }
  }
  if (absl::Status added = shares_.Add(mu_, id, *token, chunk_ids);
      !added.ok()) {
    return added;
  }
  return token;
}

absl::StatusOr<Grant> NodePool::OpenShare(SessionId id,
                                          absl::string_view share_token) {
  absl::StatusOr<std::string> claim_token = NewToken();
  if (!claim_token.ok()) return claim_token.status();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<SessionState*> found = FindSession(id);
  if (!found.ok()) return found.status();
  if (std::optional<SessionId> owner = shares_.OwnerOf(mu_, share_token)) {
    auto owner_state = sessions_.find(*owner);
    if (owner_state != sessions_.end() &&
        owner_state->second.tenant != (*found)->tenant) {
      return absl::PermissionDeniedError(
          "the share is another tenant's: memory is shared only within a "
          "tenant (allocd serve --tenancy node makes the node one tenant)");
    }
  }
  absl::StatusOr<std::vector<uint64_t>> chunk_ids =
      shares_.Open(mu_, id, share_token);
  if (!chunk_ids.ok()) return chunk_ids.status();
  Grant grant{.chunk_ids = *std::move(chunk_ids)};
  for (uint64_t chunk_id : grant.chunk_ids) {
    const uint64_t bytes = chunks_.at(chunk_id).bytes;  // open: live
    grant.chunk_sizes.push_back(bytes);
    grant.bytes += bytes;
  }
  grant.token = AddClaim(id, **found, *std::move(claim_token), /*grant=*/0,
                         grant.chunk_ids, std::string(share_token));
  return grant;
}

absl::Status NodePool::CloseShare(SessionId id, absl::string_view share_token) {
  absl::MutexLock lock(&mu_);
  std::optional<std::vector<uint64_t>> unheld =
      shares_.Close(mu_, id, share_token);
  if (!unheld) {
    return absl::NotFoundError(
        absl::StrCat("session ", id, " has no open of that share token"));
  }
  CacheUnowned(*unheld);
  return absl::OkStatus();
}

void NodePool::Disown(uint64_t chunk_id, Chunk& chunk) {
  if (!shares_.IsOpen(mu_, chunk_id)) {
    ReturnToCache(chunk_id, chunk);
    return;
  }
  chunk.owner = kNoSession;
  chunk.pending = false;
  chunk.grant = 0;
}

void NodePool::CacheUnowned(absl::Span<const uint64_t> chunk_ids) {
  for (uint64_t chunk_id : chunk_ids) {
    Chunk& chunk = chunks_.at(chunk_id);  // held by an open until now: live
    if (chunk.owner == kNoSession) ReturnToCache(chunk_id, chunk);
  }
}

bool NodePool::SetSessionQuota(SessionId id, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return false;
  s->second.quota = bytes;
  return true;
}

void NodePool::SetUidQuota(uid_t uid, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes) {
    uid_quotas_[uid] = *bytes;
  } else {
    uid_quotas_.erase(uid);
  }
}

void NodePool::SetTenantQuota(const TenantId& tenant,
                              std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes) {
    tenant_quotas_[tenant] = *bytes;
  } else {
    tenant_quotas_.erase(tenant);
  }
}

void NodePool::SetDefaultTenantQuota(std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  default_tenant_quota_ = bytes;
}

uint64_t NodePool::TrimColdestLocked(
    absl::FunctionRef<bool(const Chunk&, uint64_t trimmed)> more,
    std::vector<ChunkMemory>& doomed) {
  uint64_t trimmed = 0;
  while (!free_.empty()) {
    auto chunk = chunks_.find(free_.begin()->second);
    if (!more(chunk->second, trimmed)) break;
    RemoveFromCache(chunk->second);
    trimmed += chunk->second.bytes;
    live_bytes_ -= chunk->second.bytes;
    doomed.push_back(std::move(chunk->second.memory));
    chunks_.erase(chunk);
  }
  return trimmed;
}

uint64_t NodePool::TrimColdest(
    absl::FunctionRef<bool(const Chunk&, uint64_t trimmed)> more) {
  // Destroyed when this returns, after the lock is released: on a GPU that
  // is cuMemRelease.
  std::vector<ChunkMemory> doomed;
  absl::MutexLock lock(&mu_);
  const uint64_t trimmed = TrimColdestLocked(more, doomed);
  trimmed_total_ += trimmed;
  return trimmed;
}

uint64_t NodePool::TrimFree(uint64_t bytes) {
  return TrimColdest([&](const Chunk&, uint64_t trimmed) { return trimmed < bytes; });
}

uint64_t NodePool::TrimIdle(const TrimPolicy& policy) {
  const absl::Time cutoff = options_.now() - policy.idle_after;
  return TrimColdest([&](const Chunk& coldest, uint64_t) {
    mu_.AssertHeld();
    return coldest.freed_at <= cutoff || free_bytes_ > policy.high_water;
  });
}

void NodePool::SetCapacity(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

uint64_t NodePool::UncreatedRoom(uint64_t capacity) const {
  return capacity - std::min(live_bytes_ + creating_bytes_, capacity);
}

uint64_t NodePool::AvailableBytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_ + UncreatedRoom(capacity_.load());
}

PoolStats NodePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats{.capacity = capacity_.load(),
                  .chunk_bytes = classes_.smallest(),
                  .created_bytes = live_bytes_,
                  .free_bytes = free_bytes_,
                  .creating_bytes = creating_bytes_,
                  .chunks_created_total = created_total_,
                  .chunks_reused_total = reused_total_,
                  .chunks_client_made_total = client_made_total_,
                  .trimmed_bytes_total = trimmed_total_,
                  .adopted_bytes_total = adopted_total_};
  stats.in_use_bytes = stats.created_bytes - stats.free_bytes;
  for (const auto& [id, s] : sessions_) {
    stats.sessions[id] = SessionHolding{.bytes = s.held,
                                        .uid = s.uid,
                                        .pid = s.pid,
                                        .tenant = s.tenant,
                                        .quota = s.quota};
  }
  return stats;
}

absl::StatusOr<std::vector<ChunkFd>> ClaimAll(NodePool& pool,
                                              absl::string_view token,
                                              pid_t claimer_pid) {
  std::vector<ChunkFd> all;
  absl::Status s = pool.Claim(token, claimer_pid, SIZE_MAX,
                              [&](std::vector<ChunkFd>& batch, bool) {
                                for (ChunkFd& c : batch) {
                                  all.push_back(std::move(c));
                                }
                                return absl::OkStatus();
                              });
  if (!s.ok()) return s;
  return all;
}

}  // namespace allocd
