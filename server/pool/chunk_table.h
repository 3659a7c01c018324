// ChunkTable: a node pool's live chunks -- who holds each, the cache of
// those nobody holds, and the bytes they count against the capacity.
//
// A chunk is live from its creation (or its adoption, or the grant of a
// chunk its client makes) until it is destroyed (Trim) or, with no memory
// here, given up (Cache). Live, it is held by a session (pending while the
// Acquire that took it still creates the rest), held by opens of shares
// only (nobody's, yet not cached), or cached: nobody's, ready for the next
// Acquire of the tenant that last held it, most recently freed first, and
// trimmed coldest first. Chunks being created outside the lock count
// against the capacity before they are live (BeginCreating).
//
// This part keeps the chunks, the cache and the pool's chunk totals; the
// pool decides who may take which chunk (sessions, quotas, tenants,
// shares), and creates and destroys memory outside its lock.
//
// Thread-safety: as ChunkShares, state of the pool under the pool's lock,
// which every method takes, held, as `pool_mu`.
#ifndef ALLOCD_SERVER_POOL_CHUNK_TABLE_H_
#define ALLOCD_SERVER_POOL_CHUNK_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pool/chunk_source.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

class ChunkTable {
 public:
  // The owner of a chunk no session holds.
  static constexpr SessionId kNobody = 0;

  struct Chunk {
    ChunkMemory memory;
    uint64_t bytes = 0;
    // kNobody: cached, or held by opens of shares only.
    SessionId owner = kNobody;
    // Reserved by an Acquire still creating the rest of its chunks: owned,
    // but not yet the session's to release.
    bool pending = false;
    // When it was last returned to the cache (for TrimIdle), and its place
    // in the cache while cached.
    absl::Time freed_at;
    uint64_t free_order = 0;
    // The Acquire that handed it out (0 while nobody's): an unclaimed
    // grant that expires takes back only its own chunks, not ones its
    // session released and got again through a later grant.
    uint64_t grant = 0;
    // The tenant that last held it, whose data it may hold: whose cache
    // it is in while cached.
    TenantId tenant;

    // False for a chunk the pool holds no memory of (made by its client,
    // or adopted on a client's word): the pool counts it but has nothing
    // to cache, share or hand out again.
    bool has_memory() const { return memory.file != nullptr; }
  };

  // What the pool's chunks went through, for its stats.
  struct Totals {
    uint64_t created_chunks = 0;
    // Taken from the cache by grants that stood (UncountReused).
    uint64_t reused_chunks = 0;
    uint64_t client_made_chunks = 0;
    uint64_t trimmed_bytes = 0;
    uint64_t adopted_bytes = 0;
  };

  // New chunk ids carry `epoch` in their top 24 bits (the rest counts from
  // 1); `now` stamps a chunk when it is cached.
  ChunkTable(uint32_t epoch, std::function<absl::Time()> now);

  // Live chunk `chunk_id`; null for none.
  const Chunk* Find(const absl::Mutex& pool_mu, uint64_t chunk_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Live chunk `chunk_id`, which must be live.
  const Chunk& Get(const absl::Mutex& pool_mu, uint64_t chunk_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // The bytes of the live chunks `chunk_ids`.
  uint64_t BytesOf(const absl::Mutex& pool_mu,
                   const absl::flat_hash_set<uint64_t>& chunk_ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // A new live chunk of `size` with `memory`, of `tenant`, held by `owner`
  // (kNobody: for the caller to Cache) for grant `grant`; returns its id,
  // one no live chunk has. Counts as created.
  uint64_t AddCreated(const absl::Mutex& pool_mu, uint64_t size,
                      ChunkMemory memory, const TenantId& tenant,
                      SessionId owner, uint64_t grant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // As AddCreated, without memory: a chunk `owner`'s client makes itself.
  // Counts as client-made.
  uint64_t AddClientMade(const absl::Mutex& pool_mu, uint64_t size,
                         const TenantId& tenant, SessionId owner,
                         uint64_t grant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Makes chunk `chunk_id`, which is not live, live with `memory` (none on
  // a client's word), `bytes` of `tenant`, held by `owner`. Counts as
  // adopted.
  void Adopt(const absl::Mutex& pool_mu, uint64_t chunk_id, ChunkMemory memory,
             uint64_t bytes, SessionId owner, const TenantId& tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Gives live chunk `chunk_id`, which has none, its `memory`.
  void GiveMemory(const absl::Mutex& pool_mu, uint64_t chunk_id,
                  ChunkMemory memory) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Takes the most recently cached chunk of `tenant` of `size` for `owner`
  // and grant `grant`; returns its id, nullopt when `tenant` has none of
  // that size cached. Counts as reused.
  std::optional<uint64_t> TakeCached(const absl::Mutex& pool_mu,
                                     const TenantId& tenant, uint64_t size,
                                     SessionId owner, uint64_t grant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // `chunks` TakeCached took count as not reused: their grant failed.
  void UncountReused(const absl::Mutex& pool_mu, uint64_t chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // How many chunks of `tenant` of `size` are cached.
  size_t CachedCount(const absl::Mutex& pool_mu, const TenantId& tenant,
                     uint64_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Marks live chunk `chunk_id` pending (or no longer).
  void SetPending(const absl::Mutex& pool_mu, uint64_t chunk_id, bool pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Live chunk `chunk_id`, not cached, goes to nobody and into the cache,
  // the most recently freed; one without memory is no longer live.
  void Cache(const absl::Mutex& pool_mu, uint64_t chunk_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Live chunk `chunk_id` goes to nobody without being cached: opens of
  // shares still hold it (the caller Caches it when the last closes).
  void Disown(const absl::Mutex& pool_mu, uint64_t chunk_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Destroys cached chunks, coldest first, while `more(coldest, bytes
  // destroyed so far)` says so: moves their memory to `doomed`, for the
  // caller to drop outside the lock (on a GPU, cuMemRelease). Returns the
  // bytes destroyed, which count as trimmed.
  uint64_t Trim(const absl::Mutex& pool_mu,
                absl::FunctionRef<bool(const Chunk& coldest, uint64_t trimmed)>
                    more,
                std::vector<ChunkMemory>& doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // `bytes` of chunks are being created outside the lock (Begin), or no
  // longer (End, before the created ones are added).
  void BeginCreating(const absl::Mutex& pool_mu, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  void EndCreating(const absl::Mutex& pool_mu, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Of `capacity`, what is neither live nor being created.
  uint64_t UncreatedRoom(const absl::Mutex& pool_mu, uint64_t capacity) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Bytes of live chunks (held + cached), of cached ones, and of chunks
  // being created.
  uint64_t live_bytes(const absl::Mutex& pool_mu) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  uint64_t free_bytes(const absl::Mutex& pool_mu) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  uint64_t creating_bytes(const absl::Mutex& pool_mu) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  Totals totals(const absl::Mutex& pool_mu) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Live chunks with memory by its identity (`source`'s Identity; those
  // without one left out), for a declaration's proofs to be matched
  // against.
  absl::flat_hash_map<std::string, uint64_t> LiveIdentities(
      const absl::Mutex& pool_mu, const ChunkSource& source) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

 private:
  // A chunk id no live chunk has: the next of this table's epoch that no
  // adopted chunk took.
  uint64_t NewChunkId();
  // Takes cached `chunk` out of the cache.
  void RemoveFromCache(const Chunk& chunk);

  const std::function<absl::Time()> now_;
  uint64_t next_chunk_id_;
  absl::flat_hash_map<uint64_t, Chunk> chunks_;
  // Cached chunks by Chunk::free_order: the most recently freed last,
  // reused first (still warm); trimmed from the front (coldest).
  std::map<uint64_t, uint64_t> free_;
  // The same chunks by their tenant and size, then free_order.
  absl::flat_hash_map<std::pair<TenantId, uint64_t>,
                      std::map<uint64_t, uint64_t>>
      free_by_tenant_;
  uint64_t next_free_order_ = 1;
  uint64_t live_bytes_ = 0;
  uint64_t free_bytes_ = 0;
  uint64_t creating_bytes_ = 0;
  Totals totals_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CHUNK_TABLE_H_
