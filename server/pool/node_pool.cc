#include "server/pool/node_pool.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

// 128 random bits from the kernel, as 32 hex digits.
absl::StatusOr<std::string> NewToken() {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("getrandom for a claim token: ", strerror(errno)));
    }
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof bytes));
}

absl::Status NodeShortage(uint64_t need, uint64_t available,
                          uint64_t capacity) {
  const uint64_t short_by = need - available;
  absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "node pool exhausted: need ", FormatSize(need), ", free ",
      FormatSize(available), " of capacity ", FormatSize(capacity),
      " (short by ", FormatSize(short_by), ")"));
  status.SetPayload(kShortfallPayloadUrl, absl::Cord(absl::StrCat(short_by)));
  return status;
}

}  // namespace

std::optional<uint64_t> ShortfallBytes(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return std::nullopt;
  const auto payload = status.GetPayload(kShortfallPayloadUrl);
  uint64_t bytes = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

bool IsNodeShortage(const absl::Status& status) {
  return ShortfallBytes(status).has_value();
}

NodePool::NodePool(ChunkSource* source, Options options)
    : source_(source),
      options_(std::move(options)),
      chunk_bytes_(source->Granularity()),
      capacity_(options_.capacity),
      next_chunk_id_(
          (uint64_t{options_.chunk_id_epoch & 0xFFFFFF} << 40) + 1) {}

uint64_t NodePool::NewChunkId() {
  uint64_t id;
  do {
    id = next_chunk_id_++;
  } while (chunks_.contains(id));
  return id;
}

absl::Status NodePool::AddSession(SessionId id, uid_t uid, pid_t pid) {
  if (id == kNoSession) {
    return absl::InvalidArgumentError("session id 0 is reserved");
  }
  absl::MutexLock lock(&mu_);
  SessionState state;
  state.uid = uid;
  state.pid = pid;
  state.incarnation = next_incarnation_;
  if (!sessions_.try_emplace(id, std::move(state)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " is already in the node pool"));
  }
  ++next_incarnation_;
  return absl::OkStatus();
}

void NodePool::AddHeld(SessionState& s, uint64_t bytes) {
  s.held += bytes;
  uid_held_[s.uid] += bytes;
}

void NodePool::SubtractHeld(SessionState& s, uint64_t bytes) {
  if (bytes == 0) return;
  s.held -= bytes;
  auto it = uid_held_.find(s.uid);  // present: it counts s.held
  it->second -= bytes;
  if (it->second == 0) uid_held_.erase(it);
}

void NodePool::ReturnToCache(uint64_t chunk_id, Chunk& chunk) {
  if (chunk.memory.file == nullptr) {
    // Adopted on a client's word: no memory here to hand out again.
    chunks_.erase(chunk_id);
    return;
  }
  chunk.owner = kNoSession;
  chunk.pending = false;
  chunk.grant = 0;
  chunk.freed_at = options_.now();
  free_.push_back(chunk_id);
}

uint64_t NodePool::EndSession(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return 0;
  SessionState& state = s->second;
  const uint64_t returned = state.chunks.size() * chunk_bytes_;
  for (uint64_t chunk_id : state.chunks) {
    ReturnToCache(chunk_id, chunks_.at(chunk_id));
  }
  // Including chunks an Acquire of this session is still creating: that
  // Acquire sees the session gone and caches them.
  SubtractHeld(state, state.held);
  absl::erase_if(claims_, [id](const auto& c) { return c.second.session == id; });
  sessions_.erase(s);
  return returned;
}

absl::Status NodePool::CheckQuotas(SessionId id, const SessionState& s,
                                   uint64_t bytes) const {
  if (s.quota && s.held + bytes > *s.quota) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session quota exceeded: session ", id, " holds ", FormatSize(s.held),
        ", asks ", FormatSize(bytes), ", quota ", FormatSize(*s.quota)));
  }
  if (auto q = uid_quotas_.find(s.uid); q != uid_quotas_.end()) {
    auto h = uid_held_.find(s.uid);
    const uint64_t held = h == uid_held_.end() ? 0 : h->second;
    if (held + bytes > q->second) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid quota exceeded: the sessions of uid ", s.uid, " hold ",
          FormatSize(held), ", asks ", FormatSize(bytes), ", quota ",
          FormatSize(q->second)));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> NodePool::TakeFree(SessionId id, SessionState& s,
                                         size_t count, bool pending,
                                         uint64_t grant) {
  std::vector<uint64_t> taken;
  taken.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t chunk_id = free_.back();
    free_.pop_back();
    Chunk& chunk = chunks_.at(chunk_id);
    chunk.owner = id;
    chunk.pending = pending;
    chunk.grant = grant;
    s.chunks.insert(chunk_id);
    taken.push_back(chunk_id);
  }
  return taken;
}

void NodePool::DropExpiredClaims() {
  const absl::Time now = options_.now();
  absl::erase_if(claims_, [&](const auto& c) {
    if (c.second.expires > now) return false;
    ReturnUnclaimed(c.second);
    return true;
  });
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
  uint64_t returned = 0;
  for (uint64_t chunk_id : claim.chunk_ids) {
    auto chunk = chunks_.find(chunk_id);
    if (chunk == chunks_.end() || chunk->second.grant != claim.grant ||
        chunk->second.owner != claim.session || chunk->second.pending) {
      continue;
    }
    s->chunks.erase(chunk_id);
    ReturnToCache(chunk_id, chunk->second);
    returned += chunk_bytes_;
  }
  SubtractHeld(*s, returned);
  return returned;
}

uint64_t NodePool::Abandon(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  auto it = claims_.find(token);
  if (it == claims_.end()) return 0;
  const uint64_t returned = ReturnUnclaimed(it->second);
  claims_.erase(it);
  return returned;
}

std::string NodePool::AddClaim(SessionId id, const SessionState& s,
                               std::string token, uint64_t grant,
                               const std::vector<uint64_t>& chunk_ids) {
  DropExpiredClaims();
  claims_[token] = PendingClaim{.grant = grant,
                                .session = id,
                                .incarnation = s.incarnation,
                                .pid = s.pid,
                                .expires = options_.now() + options_.token_ttl,
                                .chunk_ids = chunk_ids};
  return token;
}

absl::StatusOr<Grant> NodePool::Acquire(SessionId id, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("acquire of 0 bytes");
  if (bytes > capacity_.load()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node pool exhausted: asks ", FormatSize(bytes),
        ", more than its capacity of ", FormatSize(capacity_.load())));
  }
  // bytes <= capacity: no overflow below.
  const uint64_t count = bytes / chunk_bytes_ + (bytes % chunk_bytes_ != 0);
  const uint64_t rounded = count * chunk_bytes_;
  // Outside the lock: a syscall.
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) return token.status();

  Grant grant{.bytes = rounded};
  uint64_t to_create = 0;
  uint64_t incarnation = 0;
  uint64_t serial = 0;
  {
    absl::MutexLock lock(&mu_);
    auto s = sessions_.find(id);
    if (s == sessions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no session ", id, " in the node pool"));
    }
    SessionState& state = s->second;
    if (absl::Status q = CheckQuotas(id, state, rounded); !q.ok()) return q;
    const uint64_t live = chunks_.size() + creating_chunks_;
    const uint64_t room = capacity_.load() / chunk_bytes_ -
                          std::min(live, capacity_.load() / chunk_bytes_);
    const uint64_t reuse = std::min<uint64_t>(free_.size(), count);
    to_create = count - reuse;
    if (to_create > room) {
      return NodeShortage(rounded, (free_.size() + room) * chunk_bytes_,
                          capacity_.load());
    }
    grant.reused_chunks = static_cast<uint32_t>(reuse);
    serial = next_grant_++;
    grant.chunk_ids =
        TakeFree(id, state, reuse, /*pending=*/to_create > 0, serial);
    AddHeld(state, rounded);
    reused_total_ += reuse;
    if (to_create == 0) {  // all from the cache: done
      grant.token =
          AddClaim(id, state, *std::move(token), serial, grant.chunk_ids);
      return grant;
    }
    creating_chunks_ += to_create;
    incarnation = state.incarnation;
  }

  // New memory, outside the lock (on a GPU, cuMemCreate + export).
  std::vector<ChunkMemory> created;
  created.reserve(to_create);
  absl::Status failure;
  for (uint64_t i = 0; i < to_create; ++i) {
    absl::StatusOr<ChunkMemory> memory = source_->CreateChunk();
    if (!memory.ok()) {
      failure = memory.status();
      break;
    }
    created.push_back(*std::move(memory));
  }

  absl::MutexLock lock(&mu_);
  creating_chunks_ -= to_create;
  created_total_ += created.size();
  SessionState* const alive = SameSession(id, incarnation);
  if (alive != nullptr && failure.ok()) {
    SessionState& state = *alive;
    for (uint64_t chunk_id : grant.chunk_ids) chunks_.at(chunk_id).pending = false;
    for (ChunkMemory& memory : created) {
      const uint64_t chunk_id = NewChunkId();
      chunks_.emplace(chunk_id, Chunk{.memory = std::move(memory),
                                      .owner = id,
                                      .grant = serial});
      state.chunks.insert(chunk_id);
      grant.chunk_ids.push_back(chunk_id);
    }
    grant.token =
        AddClaim(id, state, *std::move(token), serial, grant.chunk_ids);
    return grant;
  }
  // Undo: what was created is cached for whoever asks next; the reused
  // chunks go back (EndSession already took them back from a dead session).
  for (ChunkMemory& memory : created) {
    const uint64_t chunk_id = NewChunkId();
    Chunk& chunk = chunks_[chunk_id];
    chunk.memory = std::move(memory);
    ReturnToCache(chunk_id, chunk);
  }
  reused_total_ -= grant.reused_chunks;
  if (alive == nullptr) {
    return absl::AbortedError(absl::StrCat(
        "session ", id, " ended while its chunks were being created"));
  }
  SessionState& state = *alive;
  for (uint64_t chunk_id : grant.chunk_ids) {
    state.chunks.erase(chunk_id);
    ReturnToCache(chunk_id, chunks_.at(chunk_id));
  }
  SubtractHeld(state, rounded);
  return absl::Status(failure.code(),
                      absl::StrCat("creating chunk ", created.size() + 1,
                                   " of ", to_create, " from the ",
                                   source_->Name(), " source: ",
                                   failure.message()));
}

absl::Status NodePool::Claim(absl::string_view token, pid_t claimer_pid,
                            size_t batch_size, ClaimSink sink) {
  // The files are copied under the lock and opened outside it; the
  // shared_ptrs keep them open even if the chunks are trimmed meanwhile.
  std::vector<std::pair<uint64_t, ChunkMemory>> files;
  PendingClaim claim;
  std::string key;
  {
    absl::MutexLock lock(&mu_);
    DropExpiredClaims();
    auto it = claims_.find(token);
    if (it == claims_.end()) {
      return absl::NotFoundError("unknown, used or expired claim token");
    }
    if (it->second.pid != claimer_pid) {
      return absl::PermissionDeniedError(
          absl::StrCat("the claim token was granted to pid ", it->second.pid,
                       "; pid ", claimer_pid, " may not claim it"));
    }
    for (uint64_t chunk_id : it->second.chunk_ids) {
      auto chunk = chunks_.find(chunk_id);
      // Released (or its session ended) since the Acquire: not sent.
      if (chunk == chunks_.end() || chunk->second.owner != it->second.session) {
        continue;
      }
      files.emplace_back(chunk_id, chunk->second.memory);
    }
    key = it->first;
    claim = std::move(it->second);
    claims_.erase(it);
  }
  batch_size = std::max<size_t>(batch_size, 1);
  std::vector<ChunkFd> batch;
  for (size_t begin = 0; begin == 0 || begin < files.size();
       begin += batch_size) {
    const size_t end = std::min(files.size(), begin + batch_size);
    batch.clear();
    for (size_t i = begin; i < end; ++i) {
      const auto& [chunk_id, memory] = files[i];
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
          claims_.emplace(std::move(key), std::move(claim));
        }
        return absl::Status(
            copy.status().code(),
            absl::StrCat("chunk ", chunk_id, ": ", copy.status().message(),
                         " (the claim token stays valid)"));
      }
      batch.push_back(ChunkFd{.id = chunk_id,
                              .fd = *std::move(copy),
                              .offset = memory.offset,
                              .bytes = chunk_bytes_});
    }
    if (absl::Status s = sink(batch, end == files.size()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NodePool::Release(SessionId id,
                               absl::Span<const uint64_t> chunk_ids) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no session ", id, " in the node pool"));
  }
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
      return absl::PermissionDeniedError(absl::StrCat(
          "chunk ", chunk_id, " is not held by session ", id,
          "; nothing was released"));
    }
  }
  for (uint64_t chunk_id : chunk_ids) {
    s->second.chunks.erase(chunk_id);
    ReturnToCache(chunk_id, chunks_.at(chunk_id));
  }
  SubtractHeld(s->second, chunk_ids.size() * chunk_bytes_);
  return absl::OkStatus();
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

uint64_t NodePool::TrimColdest(
    absl::FunctionRef<bool(const Chunk&, uint64_t trimmed)> more) {
  // Destroyed when this returns, after the lock is released: on a GPU that
  // is cuMemRelease.
  std::vector<ChunkMemory> doomed;
  absl::MutexLock lock(&mu_);
  while (!free_.empty() &&
         more(chunks_.at(free_.front()), doomed.size() * chunk_bytes_)) {
    auto chunk = chunks_.find(free_.front());
    free_.pop_front();
    doomed.push_back(std::move(chunk->second.memory));
    chunks_.erase(chunk);
  }
  const uint64_t trimmed = doomed.size() * chunk_bytes_;
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
    return coldest.freed_at <= cutoff ||
           free_.size() * chunk_bytes_ > policy.high_water;
  });
}

void NodePool::SetCapacity(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

std::string NodePool::RefuseDeclared(const DeclaredChunk& chunk) const {
  if (chunk.id == 0) return "chunk id 0 is no chunk";
  if (chunk.bytes != chunk_bytes_) {
    return absl::StrCat("declared as ", FormatSize(chunk.bytes),
                        "; this pool's chunks are ", FormatSize(chunk_bytes_));
  }
  return "";
}

absl::flat_hash_map<std::string, uint64_t> NodePool::LiveIdentities() const {
  absl::flat_hash_map<std::string, uint64_t> identities;
  for (const auto& [chunk_id, chunk] : chunks_) {
    if (chunk.memory.file == nullptr) continue;
    if (std::string identity = source_->Identity(chunk.memory);
        !identity.empty()) {
      identities.emplace(std::move(identity), chunk_id);
    }
  }
  return identities;
}

absl::StatusOr<AdoptOutcome> NodePool::Adopt(
    SessionId id, std::vector<DeclaredChunk> chunks) {
  struct Candidate {
    uint64_t id = 0;
    uint64_t bytes = 0;
    ChunkMemory memory;
    std::string identity;
  };
  AdoptOutcome outcome;
  // Proofs are checked outside the lock: syscalls (on a device, driver
  // calls) per chunk.
  const bool proves = source_->ProvesChunks();
  std::vector<Candidate> candidates;
  candidates.reserve(chunks.size());
  absl::flat_hash_set<uint64_t> listed;
  for (DeclaredChunk& declared : chunks) {
    std::string why = RefuseDeclared(declared);
    if (why.empty() && !listed.insert(declared.id).second) {
      why = "listed twice in the declaration";
    }
    Candidate candidate{.id = declared.id, .bytes = declared.bytes};
    if (why.empty() && proves) {
      absl::StatusOr<ChunkMemory> memory = source_->AdoptChunk(
          std::move(declared.fd), declared.offset, declared.bytes);
      if (memory.ok()) {
        candidate.identity = source_->Identity(*memory);
        candidate.memory = *std::move(memory);
      } else {
        why = std::string(memory.status().message());
      }
    }
    if (!why.empty()) {
      outcome.refused.emplace_back(declared.id, std::move(why));
      continue;
    }
    candidates.push_back(std::move(candidate));
  }

  // Refused proofs' memory is dropped after the lock is released.
  std::vector<ChunkMemory> dropped;
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no session ", id, " in the node pool"));
  }
  SessionState& state = s->second;
  absl::flat_hash_map<std::string, uint64_t> identities;
  if (proves) identities = LiveIdentities();
  for (Candidate& candidate : candidates) {
    std::string why;
    if (auto live = chunks_.find(candidate.id); live != chunks_.end()) {
      const SessionId owner = live->second.owner;
      why = owner == kNoSession ? "its id is a cached chunk's"
            : owner == id       ? "this session holds it already"
                                : absl::StrCat("session ", owner,
                                               " holds a chunk of that id");
    } else if (!candidate.identity.empty()) {
      auto [same, fresh] =
          identities.try_emplace(candidate.identity, candidate.id);
      if (!fresh) {
        why = absl::StrCat("its memory is chunk ", same->second, "'s");
      }
    }
    if (!why.empty()) {
      outcome.refused.emplace_back(candidate.id, std::move(why));
      dropped.push_back(std::move(candidate.memory));
      continue;
    }
    chunks_.emplace(candidate.id,
                    Chunk{.memory = std::move(candidate.memory), .owner = id});
    state.chunks.insert(candidate.id);
    outcome.adopted.push_back(candidate.id);
    outcome.adopted_bytes += candidate.bytes;
  }
  AddHeld(state, outcome.adopted_bytes);
  adopted_total_ += outcome.adopted_bytes;
  return outcome;
}

PoolStats NodePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats{.capacity = capacity_.load(),
                  .chunk_bytes = chunk_bytes_,
                  .created_bytes = chunks_.size() * chunk_bytes_,
                  .free_bytes = free_.size() * chunk_bytes_,
                  .creating_bytes = creating_chunks_ * chunk_bytes_,
                  .chunks_created_total = created_total_,
                  .chunks_reused_total = reused_total_,
                  .trimmed_bytes_total = trimmed_total_,
                  .adopted_bytes_total = adopted_total_};
  stats.in_use_bytes = stats.created_bytes - stats.free_bytes;
  for (const auto& [id, s] : sessions_) {
    stats.sessions[id] = SessionHolding{
        .bytes = s.held, .uid = s.uid, .pid = s.pid, .quota = s.quota};
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
