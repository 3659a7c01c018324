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
      chunks_(options_.chunk_id_epoch, options_.now),
      claims_(options_.token_ttl, options_.now) {}

absl::Status NodePool::AddSession(SessionId id, uid_t uid, pid_t pid,
                                  TenantId tenant) {
  absl::MutexLock lock(&mu_);
  return sessions_.Add(mu_, id, uid, pid, std::move(tenant));
}

uint64_t NodePool::EndSession(SessionId id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
  if (!found.ok()) return 0;
  const uint64_t returned = chunks_.BytesOf(mu_, (*found)->chunks);
  for (uint64_t chunk_id : (*found)->chunks) Disown(chunk_id);
  CacheUnowned(shares_.EndSession(mu_, id));
  claims_.EndSession(mu_, id);
  // Including chunks an Acquire of this session is still creating: that
  // Acquire sees the session gone and caches them.
  sessions_.End(mu_, id);
  return returned;
}

void NodePool::DropExpiredClaims() {
  for (const PendingClaim& claim : claims_.TakeExpired(mu_)) {
    ReturnUnclaimed(claim);
  }
}

uint64_t NodePool::ReturnUnclaimed(const PendingClaim& claim) {
  SessionLedger::Session* s =
      sessions_.FindIncarnation(mu_, claim.session, claim.incarnation);
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
    const ChunkTable::Chunk* chunk = chunks_.Find(mu_, chunk_id);
    if (chunk == nullptr || chunk->grant != claim.grant ||
        chunk->owner != claim.session || chunk->pending) {
      continue;
    }
    s->chunks.erase(chunk_id);
    returned += chunk->bytes;
    Disown(chunk_id);
  }
  sessions_.SubtractHeld(mu_, *s, returned);
  return returned;
}

uint64_t NodePool::Abandon(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  std::optional<PendingClaim> claim = claims_.Take(mu_, token);
  return claim ? ReturnUnclaimed(*claim) : 0;
}

std::string NodePool::AddClaim(SessionId id, const SessionLedger::Session& s,
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
    if (sessions_.FindIncarnation(mu_, claim.session, claim.incarnation) ==
        nullptr) {
      return absl::NotFoundError("the claim's session ended");
    }
    for (uint64_t chunk_id : claim.chunk_ids) {
      const ChunkTable::Chunk* chunk = chunks_.Find(mu_, chunk_id);
      // Released (or its session ended) since the Acquire: not sent. An
      // open's chunks are another session's, and live while it is open.
      if (chunk == nullptr ||
          (claim.share.empty() && chunk->owner != claim.session)) {
        continue;
      }
      files.push_back({chunk_id, chunk->memory, chunk->bytes});
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
        if (sessions_.FindIncarnation(mu_, claim.session, claim.incarnation) !=
            nullptr) {
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
    const ChunkTable::Chunk* chunk = chunks_.Find(mu_, chunk_id);
    if (chunk == nullptr || chunk->owner != id || chunk->pending) {
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
  absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
  if (!found.ok()) return found.status();
  SessionLedger::Session& state = **found;
  absl::StatusOr<absl::flat_hash_set<uint64_t>> released_ids =
      HeldBy(id, chunk_ids, "released");
  if (!released_ids.ok()) return released_ids.status();
  uint64_t released = 0;
  for (uint64_t chunk_id : chunk_ids) {
    state.chunks.erase(chunk_id);
    released += chunks_.Get(mu_, chunk_id).bytes;
    Disown(chunk_id);
  }
  sessions_.SubtractHeld(mu_, state, released);
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
  if (absl::Status found = sessions_.Find(mu_, id).status(); !found.ok()) {
    return found;
  }
  if (absl::Status held = HeldBy(id, chunk_ids, "shared").status();
      !held.ok()) {
    return held;
  }
  for (uint64_t chunk_id : chunk_ids) {
    if (!chunks_.Get(mu_, chunk_id).has_memory()) {
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
  absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
  if (!found.ok()) return found.status();
  if (std::optional<SessionId> owner = shares_.OwnerOf(mu_, share_token)) {
    absl::StatusOr<SessionLedger::Session*> owner_state =
        sessions_.Find(mu_, *owner);
    if (owner_state.ok() && (**owner_state).tenant != (*found)->tenant) {
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
    const uint64_t bytes = chunks_.Get(mu_, chunk_id).bytes;  // open: live
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

void NodePool::Disown(uint64_t chunk_id) {
  if (shares_.IsOpen(mu_, chunk_id)) {
    chunks_.Disown(mu_, chunk_id);
  } else {
    chunks_.Cache(mu_, chunk_id);
  }
}

void NodePool::CacheUnowned(absl::Span<const uint64_t> chunk_ids) {
  for (uint64_t chunk_id : chunk_ids) {
    // Held by an open until now: live.
    if (chunks_.Get(mu_, chunk_id).owner == ChunkTable::kNobody) {
      chunks_.Cache(mu_, chunk_id);
    }
  }
}

bool NodePool::SetSessionQuota(SessionId id, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  return sessions_.SetSessionQuota(mu_, id, bytes);
}

void NodePool::SetUidQuota(uid_t uid, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  sessions_.SetUidQuota(mu_, uid, bytes);
}

void NodePool::SetTenantQuota(const TenantId& tenant,
                              std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  sessions_.SetTenantQuota(mu_, tenant, bytes);
}

void NodePool::SetDefaultTenantQuota(std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  sessions_.SetDefaultTenantQuota(mu_, bytes);
}

uint64_t NodePool::TrimColdest(
    absl::FunctionRef<bool(const ChunkTable::Chunk&, uint64_t trimmed)>
        more) {
  // Destroyed when this returns, after the lock is released: on a GPU that
  // is cuMemRelease.
  std::vector<ChunkMemory> doomed;
  absl::MutexLock lock(&mu_);
  return chunks_.Trim(mu_, more, doomed);
}

uint64_t NodePool::TrimFree(uint64_t bytes) {
  return TrimColdest([&](const ChunkTable::Chunk&, uint64_t trimmed) {
    return trimmed < bytes;
  });
}

uint64_t NodePool::TrimIdle(const TrimPolicy& policy) {
  const absl::Time cutoff = options_.now() - policy.idle_after;
  return TrimColdest([&](const ChunkTable::Chunk& coldest, uint64_t) {
    mu_.AssertHeld();
    return coldest.freed_at <= cutoff ||
           chunks_.free_bytes(mu_) > policy.high_water;
  });
}

void NodePool::SetCapacity(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

uint64_t NodePool::AvailableBytes() const {
  absl::MutexLock lock(&mu_);
  return chunks_.free_bytes(mu_) + chunks_.UncreatedRoom(mu_, capacity_.load());
}

PoolStats NodePool::Stats() const {
  absl::MutexLock lock(&mu_);
  const ChunkTable::Totals totals = chunks_.totals(mu_);
  PoolStats stats{.capacity = capacity_.load(),
                  .chunk_bytes = classes_.smallest(),
                  .created_bytes = chunks_.live_bytes(mu_),
                  .free_bytes = chunks_.free_bytes(mu_),
                  .creating_bytes = chunks_.creating_bytes(mu_),
                  .chunks_created_total = totals.created_chunks,
                  .chunks_reused_total = totals.reused_chunks,
                  .chunks_client_made_total = totals.client_made_chunks,
                  .trimmed_bytes_total = totals.trimmed_bytes,
                  .adopted_bytes_total = totals.adopted_bytes};
  stats.in_use_bytes = stats.created_bytes - stats.free_bytes;
  sessions_.ForEach(mu_, [&](SessionId id, const SessionLedger::Session& s) {
    stats.sessions[id] = SessionHolding{.bytes = s.held,
                                        .uid = s.uid,
                                        .pid = s.pid,
                                        .tenant = s.tenant,
                                        .quota = s.quota};
  });
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
