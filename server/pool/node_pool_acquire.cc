// NodePool's acquire path: Acquire, AcquireCached and their steps
// (node_pool.h), and the node shortage they report.
#include "server/pool/node_pool.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

// ResourceExhausted(`message`) that other sessions releasing `short_by`
// bytes could turn into a grant (IsNodeShortage).
absl::Status Shortage(uint64_t short_by, absl::string_view message) {
  absl::Status status = absl::ResourceExhaustedError(message);
  status.SetPayload(kShortfallPayloadUrl, absl::Cord(absl::StrCat(short_by)));
  return status;
}

absl::Status NodeShortage(uint64_t need, uint64_t available,
                          uint64_t capacity) {
  const uint64_t short_by = need - available;
  return Shortage(short_by,
                  absl::StrCat("node pool exhausted: need ", FormatSize(need),
                               ", free ", FormatSize(available),
                               " of capacity ", FormatSize(capacity),
                               " (short by ", FormatSize(short_by), ")"));
}

// Takes the cached chunks of `tenant` of sizes `sizes` from `chunks` for
// session `id` (`s`) and grant `serial`, the most recently freed of each
// size, appended to `grant`. Returns the sizes left to create.
std::vector<uint64_t> TakeFree(const absl::Mutex& pool_mu, ChunkTable& chunks,
                               SessionId id, SessionLedger::Session& s,
                               const std::vector<uint64_t>& sizes,
                               uint64_t serial, Grant& grant)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu) {
  std::vector<uint64_t> to_create;
  for (uint64_t size : sizes) {
    if (std::optional<uint64_t> chunk_id =
            chunks.TakeCached(pool_mu, s.tenant, size, id, serial)) {
      s.chunks.insert(*chunk_id);
      grant.chunk_ids.push_back(*chunk_id);
      grant.chunk_sizes.push_back(size);
      continue;
    }
    // Another tenant's cached chunk is never taken: a process the pool
    // never gave it to (a fork child, an FD passed on) may still map it.
    to_create.push_back(size);
  }
  return to_create;
}

// A chunk of `size` for session `id` (`s`) to make itself, in `chunks`,
// appended to `grant` (of serial `serial`): counted, no memory here.
void AddClientMade(const absl::Mutex& pool_mu, ChunkTable& chunks,
                   SessionId id, SessionLedger::Session& s, uint64_t serial,
                   uint64_t size, Grant& grant)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu) {
  const uint64_t chunk_id =
      chunks.AddClientMade(pool_mu, size, s.tenant, id, serial);
  s.chunks.insert(chunk_id);
  grant.chunk_ids.push_back(chunk_id);
  grant.chunk_sizes.push_back(size);
  ++grant.client_made;
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

absl::StatusOr<Grant> NodePool::AcquireCached(SessionId id, uint64_t bytes,
                                              uint64_t max_chunk_bytes,
                                              uint32_t max_count,
                                              bool client_creates) {
  if (bytes == 0 || max_count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a cached acquire needs bytes and a count; got ", bytes, " bytes, ",
        max_count, " grants"));
  }
  Grant grant;
  if (bytes > capacity_.load()) return grant;
  const uint64_t rounded = classes_.RoundUp(bytes);
  const std::vector<uint64_t> sizes =
      classes_.Split(rounded, max_chunk_bytes);
  absl::flat_hash_map<uint64_t, uint64_t> per_grant;  // chunks of each size
  for (uint64_t size : sizes) ++per_grant[size];
  // Outside the lock: a syscall (and wasted when nothing is cached).
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) return token.status();

  absl::MutexLock lock(&mu_);
  absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
  if (!found.ok()) return found.status();
  SessionLedger::Session& state = **found;
  uint64_t count = max_count;
  for (const auto& [size, needed] : per_grant) {
    count = std::min<uint64_t>(
        count, chunks_.CachedCount(mu_, state.tenant, size) / needed);
  }
  auto fits = [&](uint64_t grants) {
    mu_.AssertHeld();
    return sessions_.CheckQuotas(mu_, id, state, grants * rounded).ok();
  };
  while (count > 0 && !fits(count)) --count;
  // The rest for the client to make, in the room no cached chunk fills.
  uint64_t made =
      client_creates
          ? std::min<uint64_t>(
                max_count - count,
                chunks_.UncreatedRoom(mu_, capacity_.load()) / rounded)
          : 0;
  while (made > 0 && !fits(count + made)) --made;
  if (count + made == 0) return grant;
  const uint64_t serial = sessions_.NewGrant(mu_);
  for (uint64_t i = 0; i < count; ++i) {
    // All cached: creates none.
    TakeFree(mu_, chunks_, id, state, sizes, serial, grant);
  }
  const std::vector<uint64_t> cached = grant.chunk_ids;
  for (uint64_t i = 0; i < made; ++i) {
    for (uint64_t size : sizes) {
      AddClientMade(mu_, chunks_, id, state, serial, size, grant);
    }
  }
  grant.bytes = (count + made) * rounded;
  grant.reused_chunks = static_cast<uint32_t>(cached.size());
  sessions_.AddHeld(mu_, state, grant.bytes);
  grant.token = AddClaim(id, state, *std::move(token), serial, cached);
  return grant;
}

absl::StatusOr<Grant> NodePool::Acquire(SessionId id, uint64_t bytes,
                                        uint64_t max_chunk_bytes,
                                        bool client_creates) {
  if (bytes == 0) return absl::InvalidArgumentError("acquire of 0 bytes");
  if (bytes > capacity_.load()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node pool exhausted: asks ", FormatSize(bytes),
        ", more than its capacity of ", FormatSize(capacity_.load())));
  }
  AcquireInFlight a{.id = id, .grant = {.bytes = classes_.RoundUp(bytes)}};
  const std::vector<uint64_t> sizes =
      classes_.Split(a.grant.bytes, max_chunk_bytes);
  // Outside the lock: a syscall.
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) return token.status();
  a.token = *std::move(token);

  // Cached chunks destroyed to make room: released before creating, outside
  // the lock.
  std::vector<ChunkMemory> doomed;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<SessionLedger::Session*> found = sessions_.Find(mu_, id);
    if (!found.ok()) return found.status();
    SessionLedger::Session& state = **found;
    if (absl::Status taken = TakeCached(a, state, sizes); !taken.ok()) {
      return taken;
    }
    if (a.to_create.empty()) {  // all cached: done
      a.grant.token = AddClaim(id, state, std::move(a.token), a.serial,
                               a.grant.chunk_ids);
      return std::move(a.grant);
    }
    MakeRoom(a.create_bytes, doomed);
    if (client_creates) {
      return GrantClientMade(a, state);  // `doomed` is released after the lock
    }
    // The chunks taken are not the session's to release until the rest is
    // created; what is being created counts against the capacity.
    for (uint64_t chunk_id : a.grant.chunk_ids) {
      chunks_.SetPending(mu_, chunk_id, true);
    }
    chunks_.BeginCreating(mu_, a.create_bytes);
    a.incarnation = state.incarnation;
  }
  doomed.clear();
  std::vector<ChunkMemory> created;
  const absl::Status failure = CreateChunks(a.to_create, created);
  absl::MutexLock lock(&mu_);
  return CommitCreated(a, std::move(created), failure);
}

absl::Status NodePool::TakeCached(AcquireInFlight& a,
                                  SessionLedger::Session& s,
                                  const std::vector<uint64_t>& sizes) {
  const uint64_t rounded = a.grant.bytes;
  if (absl::Status q = sessions_.CheckQuotas(mu_, a.id, s, rounded); !q.ok()) {
    return q;
  }
  const uint64_t capacity = capacity_.load();
  // Every cached byte can become room, whatever its chunk's size.
  const uint64_t available =
      chunks_.free_bytes(mu_) + chunks_.UncreatedRoom(mu_, capacity);
  if (rounded > available) return NodeShortage(rounded, available, capacity);
  a.serial = sessions_.NewGrant(mu_);
  a.tenant = s.tenant;
  a.to_create = TakeFree(mu_, chunks_, a.id, s, sizes, a.serial, a.grant);
  a.create_bytes =
      std::accumulate(a.to_create.begin(), a.to_create.end(), uint64_t{0});
  a.grant.reused_chunks = static_cast<uint32_t>(a.grant.chunk_ids.size());
  sessions_.AddHeld(mu_, s, rounded);
  return absl::OkStatus();
}

void NodePool::MakeRoom(uint64_t create_bytes,
                        std::vector<ChunkMemory>& doomed) {
  const uint64_t room = chunks_.UncreatedRoom(mu_, capacity_.load());
  if (create_bytes <= room) return;
  const uint64_t needed = create_bytes - room;
  chunks_.Trim(
      mu_,
      [&](const ChunkTable::Chunk&, uint64_t trimmed) {
        return trimmed < needed;
      },
      doomed);
}

Grant NodePool::GrantClientMade(AcquireInFlight& a,
                                SessionLedger::Session& s) {
  // Counted now, made by the client: no memory here until GiveMemory.
  const std::vector<uint64_t> with_memory = a.grant.chunk_ids;
  for (uint64_t size : a.to_create) {
    AddClientMade(mu_, chunks_, a.id, s, a.serial, size, a.grant);
  }
  a.grant.token = AddClaim(a.id, s, std::move(a.token), a.serial, with_memory);
  return std::move(a.grant);
}

absl::Status NodePool::CreateChunks(const std::vector<uint64_t>& sizes,
                                    std::vector<ChunkMemory>& created) {
  created.reserve(sizes.size());
  bool trimmed_for_device = false;
  for (size_t i = 0; i < sizes.size();) {
    absl::StatusOr<ChunkMemory> memory = source_->CreateChunk(sizes[i]);
    if (memory.ok()) {
      created.push_back(*std::move(memory));
      ++i;
      continue;
    }
    // The device is full below the capacity (its processes' contexts and
    // the headroom the source keeps take what the capacity counted on):
    // the cache's chunks of other sizes, given back to the device, make
    // the room, once. (Without this a DDP rank on an H200 that switched to
    // expandable segments ran out of memory beside 120 GiB of its own
    // former segments, cached whole.)
    if (absl::IsResourceExhausted(memory.status()) && !trimmed_for_device) {
      trimmed_for_device = true;
      const uint64_t missing =
          std::accumulate(sizes.begin() + i, sizes.end(), uint64_t{0});
      if (TrimFree(missing) > 0) continue;
    }
    return memory.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<Grant> NodePool::CommitCreated(
    AcquireInFlight& a, std::vector<ChunkMemory> created,
    const absl::Status& failure) {
  chunks_.EndCreating(mu_, a.create_bytes);
  SessionLedger::Session* const alive =
      sessions_.FindIncarnation(mu_, a.id, a.incarnation);
  if (alive == nullptr || !failure.ok()) {
    return UndoAcquire(a, alive, std::move(created), failure);
  }
  // Its chunks are the session's now, no longer being created.
  sessions_.NoteChange(mu_);
  for (uint64_t chunk_id : a.grant.chunk_ids) {
    chunks_.SetPending(mu_, chunk_id, false);
  }
  for (size_t i = 0; i < created.size(); ++i) {
    const uint64_t size = a.to_create[i];
    const uint64_t chunk_id = chunks_.AddCreated(
        mu_, size, std::move(created[i]), a.tenant, a.id, a.serial);
    alive->chunks.insert(chunk_id);
    a.grant.chunk_ids.push_back(chunk_id);
    a.grant.chunk_sizes.push_back(size);
  }
  a.grant.token = AddClaim(a.id, *alive, std::move(a.token), a.serial,
                           a.grant.chunk_ids);
  return std::move(a.grant);
}

absl::Status NodePool::UndoAcquire(AcquireInFlight& a,
                                   SessionLedger::Session* alive,
                                   std::vector<ChunkMemory> created,
                                   const absl::Status& failure) {
  // What was created is cached for whoever asks next; the reused chunks go
  // back (EndSession already took them back from a dead session).
  uint64_t created_bytes = 0;
  for (size_t i = 0; i < created.size(); ++i) {
    const uint64_t chunk_id =
        chunks_.AddCreated(mu_, a.to_create[i], std::move(created[i]),
                           a.tenant, ChunkTable::kNobody, /*grant=*/0);
    created_bytes += a.to_create[i];
    chunks_.Cache(mu_, chunk_id);
  }
  chunks_.UncountReused(mu_, a.grant.reused_chunks);
  if (alive == nullptr) {
    return absl::AbortedError(absl::StrCat(
        "session ", a.id, " ended while its chunks were being created"));
  }
  for (uint64_t chunk_id : a.grant.chunk_ids) {
    alive->chunks.erase(chunk_id);
    chunks_.Cache(mu_, chunk_id);
  }
  sessions_.SubtractHeld(mu_, *alive, a.grant.bytes);
  const std::string why =
      absl::StrCat("creating chunk ", created.size() + 1, " of ",
                   a.to_create.size(), " from the ", source_->Name(),
                   " source: ", failure.message());
  if (absl::IsResourceExhausted(failure)) {
    // The device is full below the pool's capacity (other processes'
    // contexts and native memory took what the capacity counted on): what
    // other sessions cache, given back, is memory the cache can serve.
    return Shortage(a.create_bytes - created_bytes, why);
  }
  return absl::Status(failure.code(), why);
}

}  // namespace allocd
