#include "server/pool/chunk_table.h"

#include <algorithm>
#include <utility>

namespace allocd {

ChunkTable::ChunkTable(uint32_t epoch, std::function<absl::Time()> now)
    : now_(std::move(now)),
      next_chunk_id_((uint64_t{epoch & 0xFFFFFF} << 40) + 1) {}

uint64_t ChunkTable::NewChunkId() {
  uint64_t id;
  do {
    id = next_chunk_id_++;
  } while (chunks_.contains(id));
  return id;
}

const ChunkTable::Chunk* ChunkTable::Find(const absl::Mutex&,
                                          uint64_t chunk_id) const {
  auto chunk = chunks_.find(chunk_id);
  return chunk == chunks_.end() ? nullptr : &chunk->second;
}

const ChunkTable::Chunk& ChunkTable::Get(const absl::Mutex&,
                                         uint64_t chunk_id) const {
  return chunks_.at(chunk_id);
}

uint64_t ChunkTable::BytesOf(
    const absl::Mutex&, const absl::flat_hash_set<uint64_t>& chunk_ids) const {
  uint64_t bytes = 0;
  for (uint64_t chunk_id : chunk_ids) bytes += chunks_.at(chunk_id).bytes;
  return bytes;
}

uint64_t ChunkTable::AddCreated(const absl::Mutex&, uint64_t size,
                                ChunkMemory memory, const TenantId& tenant,
                                SessionId owner, uint64_t grant) {
  const uint64_t chunk_id = NewChunkId();
  chunks_.emplace(chunk_id, Chunk{.memory = std::move(memory),
                                  .bytes = size,
                                  .owner = owner,
                                  .grant = grant,
                                  .tenant = tenant});
  live_bytes_ += size;
  ++totals_.created_chunks;
  return chunk_id;
}

uint64_t ChunkTable::AddClientMade(const absl::Mutex&, uint64_t size,
                                   const TenantId& tenant, SessionId owner,
                                   uint64_t grant) {
  const uint64_t chunk_id = NewChunkId();
  chunks_.emplace(chunk_id, Chunk{.bytes = size,
                                  .owner = owner,
                                  .grant = grant,
                                  .tenant = tenant});
  live_bytes_ += size;
  ++totals_.client_made_chunks;
  return chunk_id;
}

void ChunkTable::Adopt(const absl::Mutex&, uint64_t chunk_id,
                       ChunkMemory memory, uint64_t bytes, SessionId owner,
                       const TenantId& tenant) {
  chunks_.emplace(chunk_id, Chunk{.memory = std::move(memory),
                                  .bytes = bytes,
                                  .owner = owner,
                                  .tenant = tenant});
  live_bytes_ += bytes;
  totals_.adopted_bytes += bytes;
}

void ChunkTable::GiveMemory(const absl::Mutex&, uint64_t chunk_id,
                            ChunkMemory memory) {
  chunks_.at(chunk_id).memory = std::move(memory);
}

std::optional<uint64_t> ChunkTable::TakeCached(const absl::Mutex&,
                                               const TenantId& tenant,
                                               uint64_t size, SessionId owner,
                                               uint64_t grant) {
  auto cached = free_by_tenant_.find(std::pair(tenant, size));
  if (cached == free_by_tenant_.end()) return std::nullopt;
  const uint64_t chunk_id = cached->second.rbegin()->second;
  Chunk& chunk = chunks_.at(chunk_id);
  RemoveFromCache(chunk);
  chunk.owner = owner;
  chunk.grant = grant;
  ++totals_.reused_chunks;
  return chunk_id;
}

void ChunkTable::UncountReused(const absl::Mutex&, uint64_t chunks) {
  totals_.reused_chunks -= chunks;
}

size_t ChunkTable::CachedCount(const absl::Mutex&, const TenantId& tenant,
                               uint64_t size) const {
  auto cached = free_by_tenant_.find(std::pair(tenant, size));
  return cached == free_by_tenant_.end() ? 0 : cached->second.size();
}

void ChunkTable::SetPending(const absl::Mutex&, uint64_t chunk_id,
                            bool pending) {
  chunks_.at(chunk_id).pending = pending;
}

void ChunkTable::Cache(const absl::Mutex&, uint64_t chunk_id) {
  auto live = chunks_.find(chunk_id);
  Chunk& chunk = live->second;
  if (!chunk.has_memory()) {
    // Adopted on a client's word: no memory here to hand out again.
    live_bytes_ -= chunk.bytes;
    chunks_.erase(live);
    return;
  }
  chunk.owner = kNobody;
  chunk.pending = false;
  chunk.grant = 0;
  chunk.freed_at = now_();
  chunk.free_order = next_free_order_++;
  free_.emplace(chunk.free_order, chunk_id);
  free_by_tenant_[{chunk.tenant, chunk.bytes}].emplace(chunk.free_order,
                                                       chunk_id);
  free_bytes_ += chunk.bytes;
}

void ChunkTable::Disown(const absl::Mutex&, uint64_t chunk_id) {
  Chunk& chunk = chunks_.at(chunk_id);
  chunk.owner = kNobody;
  chunk.pending = false;
  chunk.grant = 0;
}

void ChunkTable::RemoveFromCache(const Chunk& chunk) {
  free_.erase(chunk.free_order);
  auto same_kind = free_by_tenant_.find(std::pair(chunk.tenant, chunk.bytes));
  same_kind->second.erase(chunk.free_order);
  if (same_kind->second.empty()) free_by_tenant_.erase(same_kind);
  free_bytes_ -= chunk.bytes;
}

uint64_t ChunkTable::Trim(
    const absl::Mutex&,
    absl::FunctionRef<bool(const Chunk& coldest, uint64_t trimmed)> more,
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
  totals_.trimmed_bytes += trimmed;
  return trimmed;
}

void ChunkTable::BeginCreating(const absl::Mutex&, uint64_t bytes) {
  creating_bytes_ += bytes;
}

void ChunkTable::EndCreating(const absl::Mutex&, uint64_t bytes) {
  creating_bytes_ -= bytes;
}

uint64_t ChunkTable::UncreatedRoom(const absl::Mutex&,
                                   uint64_t capacity) const {
  return capacity - std::min(live_bytes_ + creating_bytes_, capacity);
}

uint64_t ChunkTable::live_bytes(const absl::Mutex&) const { return live_bytes_; }

uint64_t ChunkTable::free_bytes(const absl::Mutex&) const { return free_bytes_; }

uint64_t ChunkTable::creating_bytes(const absl::Mutex&) const {
  return creating_bytes_;
}

ChunkTable::Totals ChunkTable::totals(const absl::Mutex&) const {
  return totals_;
}

absl::flat_hash_map<std::string, uint64_t> ChunkTable::LiveIdentities(
    const absl::Mutex&, const ChunkSource& source) const {
  absl::flat_hash_map<std::string, uint64_t> identities;
  for (const auto& [chunk_id, chunk] : chunks_) {
    if (!chunk.has_memory()) continue;
    if (std::string identity = source.Identity(chunk.memory);
        !identity.empty()) {
      identities.emplace(std::move(identity), chunk_id);
    }
  }
  return identities;
}

}  // namespace allocd
