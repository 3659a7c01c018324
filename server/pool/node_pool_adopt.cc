// NodePool's adoption: the memory it takes from clients rather than
// creating it -- chunks declared after a restart (Adopt) and chunks
// their clients made (GiveMemory) -- and the checks that nothing is
// owned twice.
#include "server/pool/node_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {

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
    absl::StatusOr<SessionState*> found = FindSession(id);
    if (!found.ok()) return found.status();
    if (absl::Status held = HeldBy(id, chunk_ids, what).status(); !held.ok()) {
      return held;
    }
    std::vector<uint64_t> sizes;
    for (uint64_t chunk_id : chunk_ids) {
      const Chunk& chunk = chunks_.at(chunk_id);
      if (HasMemory(chunk)) {
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
  absl::flat_hash_map<std::string, uint64_t> live = LiveIdentities();
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
    chunks_.at(chunk_ids[i]).memory = std::move(memories[i]);
  }
  return absl::OkStatus();
}

std::string NodePool::RefuseOverLimits(SessionId id, const SessionState& s,
                                       uint64_t bytes) const {
  if (absl::Status quota = CheckQuotas(id, s, bytes); !quota.ok()) {
    return std::string(quota.message());
  }
  const uint64_t capacity = capacity_.load();
  if (UncreatedRoom(capacity) < bytes) {
    return absl::StrCat("the node pool has ", FormatSize(UncreatedRoom(capacity)),
                        " of its capacity ", FormatSize(capacity),
                        " left, for a chunk of ", FormatSize(bytes));
  }
  return "";
}

std::string NodePool::RefuseDeclared(const DeclaredChunk& chunk) const {
  if (chunk.id == 0) return "chunk id 0 is no chunk";
  if (!classes_.Contains(chunk.bytes)) {
    return absl::StrCat("declared as ", FormatSize(chunk.bytes),
                        "; this pool's chunks are ", classes_.Describe());
  }
  return "";
}

absl::flat_hash_map<std::string, uint64_t> NodePool::LiveIdentities() const {
  absl::flat_hash_map<std::string, uint64_t> identities;
  for (const auto& [chunk_id, chunk] : chunks_) {
    if (!HasMemory(chunk)) continue;
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
  absl::StatusOr<SessionState*> found = FindSession(id);
  if (!found.ok()) return found.status();
  SessionState& state = **found;
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
    if (why.empty()) why = RefuseOverLimits(id, state, candidate.bytes);
    if (!why.empty()) {
      outcome.refused.emplace_back(candidate.id, std::move(why));
      dropped.push_back(std::move(candidate.memory));
      continue;
    }
    chunks_.emplace(candidate.id, Chunk{.memory = std::move(candidate.memory),
                                        .bytes = candidate.bytes,
                                        .owner = id,
                                        .tenant = state.tenant});
    live_bytes_ += candidate.bytes;
    state.chunks.insert(candidate.id);
    AddHeld(state, candidate.bytes);
    outcome.adopted.push_back(candidate.id);
    outcome.adopted_bytes += candidate.bytes;
  }
  adopted_total_ += outcome.adopted_bytes;
  return outcome;
}

std::vector<HeldChunk> NodePool::HeldChunks() const {
  absl::MutexLock lock(&mu_);
  std::vector<HeldChunk> held;
  for (const auto& [id, s] : sessions_) {
    for (uint64_t chunk_id : s.chunks) {
      auto chunk = chunks_.find(chunk_id);
      if (chunk == chunks_.end() || chunk->second.pending) continue;
      held.push_back(
          {.tenant = s.tenant, .id = chunk_id, .bytes = chunk->second.bytes});
    }
  }
  return held;
}

}  // namespace allocd
