#include "server/pool/node_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <utility>

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
  state.process = WatchedProcess::Watch(pid);  // a syscall: unlocked
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
  s.held += bytes;
  uid_held_[s.uid] += bytes;
  tenant_held_[s.tenant] += bytes;
}

void NodePool::SubtractHeld(SessionState& s, uint64_t bytes) {
  if (bytes == 0) return;
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

const std::map<uint64_t, uint64_t>* NodePool::CachedOf(const TenantId& tenant,
                                                       uint64_t size) const {
  auto cached = free_by_tenant_.find(std::pair(tenant, size));
  return cached == free_by_tenant_.end() ? nullptr : &cached->second;
}

std::optional<uint64_t> NodePool::CrossableChunk(const TenantId& tenant,
                                                 uint64_t size,
                                                 CrossingScan& scan) {
  for (const auto& [kind, cached] : free_by_tenant_) {
    if (kind.second != size || kind.first == tenant) continue;
    auto [resume, unused] = scan.resume.try_emplace(kind, 0);
    for (auto it = cached.lower_bound(resume->second); it != cached.end();
         ++it) {
      const Chunk& chunk = chunks_.at(it->second);
      const bool mapped = std::any_of(
          chunk.mappers.begin(), chunk.mappers.end(), [&](const auto& p) {
            if (scan.alive.contains(p.get())) return true;
            if (p->Exited()) return false;
            scan.alive.insert(p.get());
            return true;
          });
      if (!mapped) return it->second;
      resume->second = it->first + 1;
    }
  }
  return std::nullopt;
}

void NodePool::AddMapper(Chunk& chunk,
                         const std::shared_ptr<const WatchedProcess>& process) {
  std::vector<std::shared_ptr<const WatchedProcess>>& mappers = chunk.mappers;
  if (std::find(mappers.begin(), mappers.end(), process) != mappers.end()) {
    return;
  }
  // A chunk a tenant's processes reuse one after another would list them
  // all: the exited ones go once a few are listed (a poll() each).
  constexpr size_t kCheckedFrom = 4;
  if (mappers.size() >= kCheckedFrom) {
    std::erase_if(mappers, [](const auto& p) { return p->Exited(); });
  }
  mappers.push_back(process);
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
  std::optional<uint64_t> tenant_quota = default_tenant_quota_;
  if (auto q = tenant_quotas_.find(s.tenant); q != tenant_quotas_.end()) {
    tenant_quota = q->second;
  }
  if (tenant_quota) {
    auto h = tenant_held_.find(s.tenant);
    const uint64_t held = h == tenant_held_.end() ? 0 : h->second;
    if (held + bytes > *tenant_quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", s.tenant, " quota exceeded: its sessions hold ",
          FormatSize(held), ", asks ", FormatSize(bytes), ", quota ",
          FormatSize(*tenant_quota)));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> NodePool::TakeFree(SessionId id, SessionState& s,
                                         const std::vector<uint64_t>& sizes,
                                         uint64_t grant, Grant& grant_out,
                                         AcquireInFlight* crossing) {
  std::vector<uint64_t> to_create;
  CrossingScan scan;
  for (uint64_t size : sizes) {
    if (const std::map<uint64_t, uint64_t>* own = CachedOf(s.tenant, size)) {
      const uint64_t chunk_id = own->rbegin()->second;
      Chunk& chunk = chunks_.at(chunk_id);
      RemoveFromCache(chunk);
      chunk.owner = id;
      chunk.grant = grant;
      s.chunks.insert(chunk_id);
      grant_out.chunk_ids.push_back(chunk_id);
      grant_out.chunk_sizes.push_back(size);
      continue;
    }
    std::optional<uint64_t> other =
        crossing == nullptr ? std::nullopt
                            : CrossableChunk(s.tenant, size, scan);
    if (!other) {
      to_create.push_back(size);
      continue;
    }
    Chunk& chunk = chunks_.at(*other);
    RemoveFromCache(chunk);
    chunk.owner = id;
    chunk.grant = grant;
    chunk.pending = true;
    chunk.mappers.clear();  // every one has exited
    crossing->to_scrub.push_back(
        {.id = *other, .bytes = size, .memory = chunk.memory});
  }
  return to_create;
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
  absl::StatusOr<SessionState*> found = FindSession(id);
  if (!found.ok()) return found.status();
  SessionState& state = **found;
  uint64_t count = max_count;
  for (const auto& [size, needed] : per_grant) {
    const std::map<uint64_t, uint64_t>* cached = CachedOf(state.tenant, size);
    count = std::min<uint64_t>(count,
                               cached == nullptr ? 0 : cached->size() / needed);
  }
  while (count > 0 && !CheckQuotas(id, state, count * rounded).ok()) --count;
  // The rest for the client to make, in the room no cached chunk fills.
  uint64_t made = client_creates ? std::min<uint64_t>(
                                       max_count - count,
                                       UncreatedRoom(capacity_.load()) / rounded)
                                 : 0;
  while (made > 0 && !CheckQuotas(id, state, (count + made) * rounded).ok()) {
    --made;
  }
  if (count + made == 0) return grant;
  const uint64_t serial = next_grant_++;
  for (uint64_t i = 0; i < count; ++i) {
    TakeFree(id, state, sizes, serial, grant);  // all cached: creates none
  }
  const std::vector<uint64_t> cached = grant.chunk_ids;
  for (uint64_t i = 0; i < made; ++i) {
    for (uint64_t size : sizes) AddClientMade(id, state, serial, size, grant);
  }
  grant.bytes = (count + made) * rounded;
  grant.reused_chunks = static_cast<uint32_t>(cached.size());
  AddHeld(state, grant.bytes);
  reused_total_ += grant.reused_chunks;
  grant.token = AddClaim(id, state, *std::move(token), serial, cached);
  return grant;
}

void NodePool::AddClientMade(SessionId id, SessionState& s, uint64_t serial,
                             uint64_t size, Grant& grant) {
  const uint64_t chunk_id = NewChunkId();
  chunks_.emplace(chunk_id, Chunk{.bytes = size,
                                  .owner = id,
                                  .grant = serial,
                                  .tenant = s.tenant});
  live_bytes_ += size;
  s.chunks.insert(chunk_id);
  grant.chunk_ids.push_back(chunk_id);
  grant.chunk_sizes.push_back(size);
  ++grant.client_made;
  ++client_made_total_;
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
    absl::StatusOr<SessionState*> found = FindSession(id);
    if (!found.ok()) return found.status();
    SessionState& state = **found;
    if (absl::Status taken = TakeCached(a, state, sizes); !taken.ok()) {
      return taken;
    }
    if (a.to_create.empty() && a.to_scrub.empty()) {  // all cached: done
      a.grant.token = AddClaim(id, state, std::move(a.token), a.serial,
                               a.grant.chunk_ids);
      return std::move(a.grant);
    }
    MakeRoom(a.create_bytes, doomed);
    if (client_creates && a.to_scrub.empty()) {
      return GrantClientMade(a, state);  // `doomed` is released after the lock
    }
    // The chunks taken are not the session's to release until the rest is
    // scrubbed and created; what is being created (by the client too)
    // counts against the capacity.
    for (uint64_t chunk_id : a.grant.chunk_ids) {
      chunks_.at(chunk_id).pending = true;
    }
    creating_bytes_ += a.create_bytes;
    a.incarnation = state.incarnation;
  }
  doomed.clear();
  if (!a.to_scrub.empty() && !ScrubTaken(a).ok()) {
    {
      absl::MutexLock lock(&mu_);
      CreateInsteadOfScrub(a, doomed);
    }
    doomed.clear();
  }
  std::vector<ChunkMemory> created;
  const absl::Status failure =
      client_creates ? absl::OkStatus() : CreateChunks(a.to_create, created);
  absl::MutexLock lock(&mu_);
  return CommitCreated(a, std::move(created), failure, client_creates);
}

absl::Status NodePool::ScrubTaken(const AcquireInFlight& a) {
  std::vector<ChunkToScrub> chunks;
  chunks.reserve(a.to_scrub.size());
  for (const AcquireInFlight::Scrubbing& taken : a.to_scrub) {
    chunks.push_back({.memory = &taken.memory, .bytes = taken.bytes});
  }
  return source_->Scrub(chunks);
}

void NodePool::CreateInsteadOfScrub(AcquireInFlight& a,
                                    std::vector<ChunkMemory>& doomed) {
  // Its contents unknown, the memory cannot go to this tenant nor back to
  // the cache; new memory in its room costs a creation.
  for (AcquireInFlight::Scrubbing& taken : a.to_scrub) {
    live_bytes_ -= taken.bytes;
    doomed.push_back(std::move(chunks_.at(taken.id).memory));
    chunks_.erase(taken.id);
    a.to_create.push_back(taken.bytes);
    a.create_bytes += taken.bytes;
    creating_bytes_ += taken.bytes;
  }
  a.grant.reused_chunks -= static_cast<uint32_t>(a.to_scrub.size());
  reused_total_ -= a.to_scrub.size();
  a.to_scrub.clear();
}

absl::Status NodePool::TakeCached(AcquireInFlight& a, SessionState& s,
                                  const std::vector<uint64_t>& sizes) {
  const uint64_t rounded = a.grant.bytes;
  if (absl::Status q = CheckQuotas(a.id, s, rounded); !q.ok()) return q;
  const uint64_t capacity = capacity_.load();
  const uint64_t room = UncreatedRoom(capacity);
  // Every cached byte can become room, whatever its chunk's size.
  if (rounded > free_bytes_ + room) {
    return NodeShortage(rounded, free_bytes_ + room, capacity);
  }
  a.serial = next_grant_++;
  a.tenant = s.tenant;
  const bool scrubs =
      options_.cross_tenant_reuse == CrossTenantReuse::kScrub &&
      source_->ScrubsChunks();
  a.to_create = TakeFree(a.id, s, sizes, a.serial, a.grant,
                         scrubs ? &a : nullptr);
  a.create_bytes =
      std::accumulate(a.to_create.begin(), a.to_create.end(), uint64_t{0});
  a.grant.reused_chunks =
      static_cast<uint32_t>(a.grant.chunk_ids.size() + a.to_scrub.size());
  AddHeld(s, rounded);
  reused_total_ += a.grant.reused_chunks;
  return absl::OkStatus();
}

void NodePool::MakeRoom(uint64_t create_bytes,
                        std::vector<ChunkMemory>& doomed) {
  const uint64_t room = UncreatedRoom(capacity_.load());
  if (create_bytes <= room) return;
  const uint64_t needed = create_bytes - room;
  trimmed_total_ += TrimColdestLocked(
      [&](const Chunk&, uint64_t trimmed) { return trimmed < needed; },
      doomed);
}

Grant NodePool::GrantClientMade(AcquireInFlight& a, SessionState& s) {
  // Counted now, made by the client: no memory here until GiveMemory.
  const std::vector<uint64_t> with_memory = a.grant.chunk_ids;
  for (uint64_t size : a.to_create) {
    AddClientMade(a.id, s, a.serial, size, a.grant);
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

std::pair<const uint64_t, NodePool::Chunk>& NodePool::AddCreated(
    uint64_t size, ChunkMemory memory, const TenantId& tenant) {
  live_bytes_ += size;
  return *chunks_
              .emplace(NewChunkId(), Chunk{.memory = std::move(memory),
                                           .bytes = size,
                                           .tenant = tenant})
              .first;
}

absl::StatusOr<Grant> NodePool::CommitCreated(
    AcquireInFlight& a, std::vector<ChunkMemory> created,
    const absl::Status& failure, bool client_creates) {
  creating_bytes_ -= a.create_bytes;
  created_total_ += created.size();
  SessionState* const alive = SameSession(a.id, a.incarnation);
  if (alive == nullptr || !failure.ok()) {
    return UndoAcquire(a, alive, std::move(created), failure);
  }
  for (uint64_t chunk_id : a.grant.chunk_ids) {
    chunks_.at(chunk_id).pending = false;
  }
  for (const AcquireInFlight::Scrubbing& scrubbed : a.to_scrub) {
    Chunk& chunk = chunks_.at(scrubbed.id);
    chunk.pending = false;
    chunk.tenant = a.tenant;
    alive->chunks.insert(scrubbed.id);
    a.grant.chunk_ids.push_back(scrubbed.id);
    a.grant.chunk_sizes.push_back(scrubbed.bytes);
    scrubbed_bytes_total_ += scrubbed.bytes;
  }
  scrubbed_total_ += a.to_scrub.size();
  if (client_creates) return GrantClientMade(a, *alive);
  for (size_t i = 0; i < created.size(); ++i) {
    auto& [chunk_id, chunk] =
        AddCreated(a.to_create[i], std::move(created[i]), a.tenant);
    chunk.owner = a.id;
    chunk.grant = a.serial;
    alive->chunks.insert(chunk_id);
    a.grant.chunk_ids.push_back(chunk_id);
    a.grant.chunk_sizes.push_back(chunk.bytes);
  }
  a.grant.token = AddClaim(a.id, *alive, std::move(a.token), a.serial,
                           a.grant.chunk_ids);
  return std::move(a.grant);
}

absl::Status NodePool::UndoAcquire(AcquireInFlight& a, SessionState* alive,
                                   std::vector<ChunkMemory> created,
                                   const absl::Status& failure) {
  // What was created is cached for whoever asks next; the reused chunks go
  // back (EndSession already took them back from a dead session).
  uint64_t created_bytes = 0;
  for (size_t i = 0; i < created.size(); ++i) {
    auto& [chunk_id, chunk] =
        AddCreated(a.to_create[i], std::move(created[i]), a.tenant);
    created_bytes += chunk.bytes;
    ReturnToCache(chunk_id, chunk);
  }
  // Scrubbed: nothing of the tenant they came from is left in them.
  for (const AcquireInFlight::Scrubbing& scrubbed : a.to_scrub) {
    Chunk& chunk = chunks_.at(scrubbed.id);
    chunk.tenant = a.tenant;
    ReturnToCache(scrubbed.id, chunk);
  }
  reused_total_ -= a.grant.reused_chunks;
  if (alive == nullptr) {
    return absl::AbortedError(absl::StrCat(
        "session ", a.id, " ended while its chunks were being created"));
  }
  for (uint64_t chunk_id : a.grant.chunk_ids) {
    alive->chunks.erase(chunk_id);
    ReturnToCache(chunk_id, chunks_.at(chunk_id));
  }
  SubtractHeld(*alive, a.grant.bytes);
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
    const SessionState* claimer =
        SameSession(claim.session, claim.incarnation);
    if (claimer == nullptr) {  // EndSession forgets its claims: never
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
      // Before the FD goes out: a failed send leaves one mapper too many,
      // never one too few.
      AddMapper(chunk->second, claimer->process);
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
  const SessionState& giver = sessions_.at(id);  // memoryless found it
  for (size_t i = 0; i < chunk_ids.size(); ++i) {
    Chunk& chunk = chunks_.at(chunk_ids[i]);
    chunk.memory = std::move(memories[i]);
    AddMapper(chunk, giver.process);  // it made the memory: it maps it
  }
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
    if (!why.empty()) {
      outcome.refused.emplace_back(candidate.id, std::move(why));
      dropped.push_back(std::move(candidate.memory));
      continue;
    }
    Chunk& chunk = chunks_
                       .emplace(candidate.id,
                                Chunk{.memory = std::move(candidate.memory),
                                      .bytes = candidate.bytes,
                                      .owner = id,
                                      .tenant = state.tenant})
                       .first->second;
    AddMapper(chunk, state.process);
    live_bytes_ += candidate.bytes;
    state.chunks.insert(candidate.id);
    outcome.adopted.push_back(candidate.id);
    outcome.adopted_bytes += candidate.bytes;
  }
  AddHeld(state, outcome.adopted_bytes);
  adopted_total_ += outcome.adopted_bytes;
  return outcome;
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
                  .chunks_scrubbed_total = scrubbed_total_,
                  .scrubbed_bytes_total = scrubbed_bytes_total_,
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
