#include "server/pool/node_pool.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

// Marks the node-capacity shortage apart from quota errors.
constexpr absl::string_view kNodeShortage = "node pool exhausted";

std::string NewToken() {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof bytes));
}

}  // namespace

bool IsNodeShortage(const absl::Status& status) {
  return absl::IsResourceExhausted(status) &&
         absl::StartsWith(status.message(), kNodeShortage);
}

NodePool::NodePool(ChunkSource* source, Options options)
    : source_(source),
      options_(std::move(options)),
      chunk_bytes_(source->Granularity()) {}

absl::Status NodePool::AddSession(SessionId id, uid_t uid, pid_t pid) {
  absl::MutexLock lock(&mu_);
  if (!sessions_.try_emplace(id, SessionState{.uid = uid, .pid = pid}).second) {
    return absl::AlreadyExistsError(absl::StrCat("session ", id, " exists"));
  }
  return absl::OkStatus();
}

uint64_t NodePool::EndSession(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return 0;
  const uint64_t returned = s->second.held;
  for (auto& [chunk_id, chunk] : chunks_) {
    if (chunk.owner == id) {
      chunk.owner = 0;
      free_.push_back(chunk_id);
    }
  }
  absl::erase_if(claims_,
                 [id](const auto& c) { return c.second.session == id; });
  sessions_.erase(s);
  return returned;
}

uint64_t NodePool::UidHeld(uid_t uid) const {
  uint64_t held = 0;
  for (const auto& [id, s] : sessions_) {
    if (s.uid == uid) held += s.held;
  }
  return held;
}

absl::Status NodePool::CheckQuotas(const SessionState& s,
                                   uint64_t bytes) const {
  if (s.quota && s.held + bytes > *s.quota) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session quota exceeded: holds ", FormatSize(s.held), ", asks ",
        FormatSize(bytes), ", quota ", FormatSize(*s.quota)));
  }
  if (auto q = uid_quotas_.find(s.uid); q != uid_quotas_.end()) {
    const uint64_t held = UidHeld(s.uid);
    if (held + bytes > q->second) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", s.uid, " quota exceeded: its sessions hold ",
          FormatSize(held), ", asks ", FormatSize(bytes), ", quota ",
          FormatSize(q->second)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Grant> NodePool::Acquire(SessionId id, uint64_t bytes) {
  const uint64_t count = (bytes + chunk_bytes_ - 1) / chunk_bytes_;
  const uint64_t rounded = count * chunk_bytes_;
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, " in the pool"));
  }
  if (absl::Status q = CheckQuotas(s->second, rounded); !q.ok()) return q;
  const uint64_t live = chunks_.size() * chunk_bytes_;
  const uint64_t reusable = std::min<uint64_t>(free_.size(), count);
  const uint64_t to_create = count - reusable;
  if (live + to_create * chunk_bytes_ > options_.capacity) {
    const uint64_t available =
        free_.size() * chunk_bytes_ + (options_.capacity - live);
    return absl::ResourceExhaustedError(absl::StrCat(
        kNodeShortage, ": need ", FormatSize(rounded), ", ",
        FormatSize(available), " available of capacity ",
        FormatSize(options_.capacity)));
  }
  // Create first, so a failure leaves the cache as it was.
  std::vector<ChunkMemory> created;
  for (uint64_t i = 0; i < to_create; ++i) {
    absl::StatusOr<ChunkMemory> memory = source_->CreateChunk();
    if (!memory.ok()) return memory.status();
    created.push_back(std::move(*memory));
  }
  Grant grant{.bytes = rounded, .reused_chunks = static_cast<uint32_t>(reusable)};
  for (uint64_t i = 0; i < reusable; ++i) {
    const uint64_t chunk_id = free_.back();
    free_.pop_back();
    chunks_[chunk_id].owner = id;
    grant.chunk_ids.push_back(chunk_id);
  }
  for (ChunkMemory& memory : created) {
    const uint64_t chunk_id = next_chunk_id_++;
    chunks_.emplace(chunk_id, Chunk{.memory = std::move(memory), .owner = id});
    grant.chunk_ids.push_back(chunk_id);
  }
  s->second.held += rounded;
  created_total_ += to_create;
  reused_total_ += reusable;
  DropExpiredTokens();
  grant.token = NewToken();
  claims_[grant.token] = {.session = id,
                          .pid = s->second.pid,
                          .expires = options_.now() + options_.token_ttl,
                          .chunk_ids = grant.chunk_ids};
  return grant;
}

void NodePool::DropExpiredTokens() {
  const absl::Time now = options_.now();
  absl::erase_if(claims_,
                 [now](const auto& c) { return c.second.expires <= now; });
}

absl::StatusOr<std::vector<ChunkFd>> NodePool::Claim(absl::string_view token,
                                                     pid_t claimer_pid) {
  absl::MutexLock lock(&mu_);
  DropExpiredTokens();
  auto it = claims_.find(token);
  if (it == claims_.end()) {
    return absl::NotFoundError("unknown, used or expired claim token");
  }
  if (it->second.pid != claimer_pid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "claim token belongs to pid ", it->second.pid, ", not to pid ",
        claimer_pid));
  }
  std::vector<ChunkFd> out;
  for (uint64_t chunk_id : it->second.chunk_ids) {
    auto chunk = chunks_.find(chunk_id);
    // The session released it before claiming: nothing to send for it.
    if (chunk == chunks_.end() || chunk->second.owner != it->second.session) {
      continue;
    }
    const ChunkMemory& memory = chunk->second.memory;
    UniqueFd copy(fcntl(memory.file->get(), F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) {
      return absl::ResourceExhaustedError("out of file descriptors");
    }
    out.push_back(
        {.id = chunk_id, .fd = std::move(copy), .offset = memory.offset});
  }
  claims_.erase(it);
  return out;
}

absl::Status NodePool::Release(SessionId id,
                               absl::Span<const uint64_t> chunk_ids) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", id, " in the pool"));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t chunk_id : chunk_ids) {
    if (!seen.insert(chunk_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk_id, " listed twice"));
    }
    auto chunk = chunks_.find(chunk_id);
    if (chunk == chunks_.end() || chunk->second.owner != id) {
      return absl::PermissionDeniedError(absl::StrCat(
          "chunk ", chunk_id, " is not held by session ", id));
    }
  }
  for (uint64_t chunk_id : chunk_ids) {
    chunks_[chunk_id].owner = 0;
    free_.push_back(chunk_id);
  }
  s->second.held -= chunk_ids.size() * chunk_bytes_;
  return absl::OkStatus();
}

void NodePool::SetSessionQuota(SessionId id, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  if (auto s = sessions_.find(id); s != sessions_.end()) s->second.quota = bytes;
}

void NodePool::SetUidQuota(uid_t uid, std::optional<uint64_t> bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes) {
    uid_quotas_[uid] = *bytes;
  } else {
    uid_quotas_.erase(uid);
  }
}

uint64_t NodePool::TrimFree(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t closed = 0;
  // The coldest cached chunks go first.
  size_t drop = 0;
  while (drop < free_.size() && closed < bytes) {
    chunks_.erase(free_[drop]);
    closed += chunk_bytes_;
    ++drop;
  }
  free_.erase(free_.begin(), free_.begin() + static_cast<ptrdiff_t>(drop));
  return closed;
}

PoolStats NodePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolStats stats{.capacity = options_.capacity,
                  .chunk_bytes = chunk_bytes_,
                  .free_bytes = free_.size() * chunk_bytes_,
                  .chunks_created_total = created_total_,
                  .chunks_reused_total = reused_total_};
  stats.in_use_bytes = chunks_.size() * chunk_bytes_ - stats.free_bytes;
  for (const auto& [id, s] : sessions_) {
    stats.sessions[id] = {.bytes = s.held, .uid = s.uid, .pid = s.pid,
                          .quota = s.quota};
  }
  return stats;
}

}  // namespace allocd
