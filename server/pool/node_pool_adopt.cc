// NodePool's adoption: the memory it takes from clients rather than
// creating it -- chunks declared after a restart (Adopt) and chunks
// their clients made (GiveMemory) -- and the checks that nothing is
// owned twice.
#include "server/pool/node_pool.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

// Why `bytes` more would take session `id` (`s`) past a quota, or the live
// chunks of `chunks` past `capacity` ("" when they fit): Adopt's limits.
std::string RefuseOverLimits(const absl::Mutex& pool_mu,
                             const SessionLedger& sessions,
                             const ChunkTable& chunks, uint64_t capacity,
                             SessionId id, const SessionLedger::Session& s,
                             uint64_t bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu) {
  if (absl::Status quota = sessions.CheckQuotas(pool_mu, id, s, bytes);
      !quota.ok()) {
    return std::string(quota.message());
  }
  const uint64_t room = chunks.UncreatedRoom(pool_mu, capacity);
  if (room < bytes) {
    return absl::StrCat("the node pool has ", FormatSize(room),
                        " of its capacity ", FormatSize(capacity),
                        " left, for a chunk of ", FormatSize(bytes));
  }
  return "";
}

// Why a chunk a client declares cannot be adopted by a pool of `classes`
// before its proof is looked at ("" when it can so far): its id and size.
std::string RefuseDeclared(const ChunkClasses& classes,
                           const DeclaredChunk& chunk) {
  if (chunk.id == 0) return "chunk id 0 is no chunk";
  if (!classes.Contains(chunk.bytes)) {
    return absl::StrCat("declared as ", FormatSize(chunk.bytes),
                        "; this pool's chunks are ", classes.Describe());
  }
  return "";
}

}  // namespace

absl::Status NodePool::GiveMemory(SessionId id,
                                  absl::Span<const uint64_t> chunk_ids,
                                  std::vector<UniqueFd> fds) {
  if (fds.size() != chunk_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " FDs for ", chunk_ids.size(), " chunks; nothing was taken"));
  }
  // Which chunks, unlocked again while the source checks the FDs (syscalls,
  // on a device driver calls); checked again after.
  auto memoryless = [&](absl::string_view what) -> absl::StatusOr<std::vector<uint64_t>> {
    mu_.AssertHeld();
    if (absl::Status found = sessions_.Find(mu_, id).status(); !found.ok()) {
      return found;
    }
    if (absl::Status held = HeldBy(id, chunk_ids, what).status(); !held.ok()) {
      return held;
    }
    std::vector<uint64_t> sizes;
    for (uint64_t chunk_id : chunk_ids) {
      const ChunkTable::Chunk& chunk = chunks_.Get(mu_, chunk_id);
      if (chunk.has_memory()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the pool holds the memory of chunk ", chunk_id,
            " already; nothing was ", what));
      }
      sizes.push_back(chunk.bytes);
    }
    return sizes;
  };
  absl::StatusOr<std::vector<uint64_t>> sizes;
  {
    absl::MutexLock lock(&mu_);
    sizes = memoryless("taken");
  }
  if (!sizes.ok()) return sizes.status();
  // Refused memory is dropped after the lock is released.
  std::vector<ChunkMemory> memories;
  std::vector<std::string> identities;
  for (size_t i = 0; i < chunk_ids.size(); ++i) {
    absl::StatusOr<ChunkMemory> memory =
        source_->AdoptChunk(std::move(fds[i]), /*offset=*/0, (*sizes)[i]);
    if (!memory.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk_ids[i], ": ", memory.status().message(),
          "; nothing was taken"));
    }
    identities.push_back(source_->Identity(*memory));
    memories.push_back(*std::move(memory));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status again = memoryless("taken").status(); !again.ok()) {
    return again;  // released or given meanwhile
  }
  absl::flat_hash_map<std::string, uint64_t> live =
      chunks_.LiveIdentities(mu_, *source_);
  for (size_t i = 0; i < chunk_ids.size(); ++i) {
    if (identities[i].empty()) continue;
    auto [same, fresh] = live.try_emplace(identities[i], chunk_ids[i]);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk_ids[i], ": its FD is the memory of chunk ",
          same->second, "; nothing was taken"));
    }
  }
  for (size_t i = 0; i < chunk_ids.size(); ++i) {
    chunks_.GiveMemory(mu_, chunk_ids[i], std::move(memories[i]));
  }
  return absl::OkStatus();
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
    std::string why = RefuseDeclared(classes_, declared);
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
  absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
  if (!found.ok()) return found.status();
  SessionLedger::Session& state = **found;
  absl::flat_hash_map<std::string, uint64_t> identities;
  if (proves) identities = chunks_.LiveIdentities(mu_, *source_);
  for (Candidate& candidate : candidates) {
    std::string why;
    if (const ChunkTable::Chunk* live = chunks_.Find(mu_, candidate.id)) {
      const SessionId owner = live->owner;
      why = owner == ChunkTable::kNobody ? "its id is a cached chunk's"
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
    if (why.empty()) {
      why = RefuseOverLimits(mu_, sessions_, chunks_, capacity_.load(), id,
                             state, candidate.bytes);
    }
    if (!why.empty()) {
      outcome.refused.emplace_back(candidate.id, std::move(why));
      dropped.push_back(std::move(candidate.memory));
      continue;
    }
    chunks_.Adopt(mu_, candidate.id, std::move(candidate.memory),
                  candidate.bytes, id, state.tenant);
    state.chunks.insert(candidate.id);
    sessions_.AddHeld(mu_, state, candidate.bytes);
    outcome.adopted.push_back(candidate.id);
    outcome.adopted_bytes += candidate.bytes;
  }
  return outcome;
}

std::vector<HeldChunk> NodePool::HeldChunks() const {
  absl::MutexLock lock(&mu_);
  std::vector<HeldChunk> held;
  sessions_.ForEach(mu_, [&](SessionId, const SessionLedger::Session& s) {
    mu_.AssertHeld();
    for (uint64_t chunk_id : s.chunks) {
      const ChunkTable::Chunk* chunk = chunks_.Find(mu_, chunk_id);
      if (chunk == nullptr || chunk->pending) continue;
      held.push_back({.tenant = s.tenant, .id = chunk_id, .bytes = chunk->bytes});
    }
  });
  return held;
}

}  // namespace allocd
