// NodePool: the node's physical memory as chunks, owned by sessions.
//
// Chunks a session releases (or leaves behind when it ends) stay in the
// pool, cached, and are handed to the next Acquire of any session without
// creating memory again. Live chunks (held + cached) never exceed the
// capacity. Acquire is all-or-nothing; so is Release. Every chunk is held by
// at most one session at a time, which Stats() lets a test check.
//
// An Acquire returns a one-time claim token bound to the session's pid: the
// FDs go only to a caller that the kernel says is that pid (Claim).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_POOL_NODE_POOL_H_
#define ALLOCD_SERVER_POOL_NODE_POOL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/pool/chunk_source.h"

namespace allocd {

using SessionId = uint64_t;

struct Grant {
  std::vector<uint64_t> chunk_ids;
  uint64_t bytes = 0;
  std::string token;
  // Chunks that came from the cache rather than new memory.
  uint32_t reused_chunks = 0;
};

// One chunk's FD for SCM_RIGHTS (a dup() the caller owns) and where in it
// the chunk starts.
struct ChunkFd {
  uint64_t id;
  UniqueFd fd;
  uint64_t offset;
};

struct SessionHolding {
  uint64_t bytes = 0;
  uid_t uid = 0;
  pid_t pid = 0;
  std::optional<uint64_t> quota;
};

struct PoolStats {
  uint64_t capacity = 0;
  uint64_t chunk_bytes = 0;
  // Held by sessions, and cached free; their sum is the live memory.
  uint64_t in_use_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t chunks_created_total = 0;
  uint64_t chunks_reused_total = 0;
  std::map<SessionId, SessionHolding> sessions;
};

// True for the ResourceExhausted that Acquire returns when the node itself
// is short (not a quota): memory other sessions cache could help.
bool IsNodeShortage(const absl::Status& status);

class NodePool {
 public:
  struct Options {
    uint64_t capacity = 0;
    // How long a claim token lives.
    absl::Duration token_ttl = absl::Seconds(30);
    // The clock (tests move it).
    std::function<absl::Time()> now = [] { return absl::Now(); };
  };

  // `source` outlives the pool.
  NodePool(ChunkSource* source, Options options);
  NodePool(ChunkSource* source, uint64_t capacity)
      : NodePool(source, Options{.capacity = capacity}) {}

  // AlreadyExists for a live session's id.
  absl::Status AddSession(SessionId id, uid_t uid, pid_t pid);
  // Every chunk the session holds goes back to the cache; its tokens die.
  // Returns the bytes returned (0 for an unknown session).
  uint64_t EndSession(SessionId id);

  // Whole chunks covering `bytes`: cached ones first, then new ones up to
  // the capacity. ResourceExhausted naming the limit (node capacity,
  // session quota, uid quota); NotFound for an unknown session.
  absl::StatusOr<Grant> Acquire(SessionId id, uint64_t bytes);
  // The FDs of a grant, for the process `claimer_pid`. NotFound for an
  // unknown, used or expired token; PermissionDenied when the grant is
  // another pid's (the token stays valid for its owner).
  absl::StatusOr<std::vector<ChunkFd>> Claim(absl::string_view token,
                                             pid_t claimer_pid);
  // PermissionDenied, changing nothing, when any id is not held by `id`;
  // InvalidArgument for an id listed twice.
  absl::Status Release(SessionId id, absl::Span<const uint64_t> chunk_ids);

  // Quotas on held bytes; nullopt clears. Lowering one below what is held
  // revokes nothing, it only refuses further Acquires.
  void SetSessionQuota(SessionId id, std::optional<uint64_t> bytes);
  void SetUidQuota(uid_t uid, std::optional<uint64_t> bytes);

  // Closes up to `bytes` of cached chunks (memory back to the device);
  // returns the bytes closed.
  uint64_t TrimFree(uint64_t bytes);

  PoolStats Stats() const;

 private:
  struct Chunk {
    ChunkMemory memory;
    // 0: cached free.
    SessionId owner = 0;
  };
  struct SessionState {
    uid_t uid;
    pid_t pid;
    uint64_t held = 0;
    std::optional<uint64_t> quota;
  };
  struct PendingClaim {
    SessionId session;
    pid_t pid;
    absl::Time expires;
    std::vector<uint64_t> chunk_ids;
  };

  absl::Status CheckQuotas(const SessionState& s, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t UidHeld(uid_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpiredTokens() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ChunkSource* const source_;
  const Options options_;
  const uint64_t chunk_bytes_;
  mutable absl::Mutex mu_;
  uint64_t next_chunk_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  // Cached chunks, most recently freed last (reused first: still warm).
  std::vector<uint64_t> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, SessionState> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint64_t> uid_quotas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PendingClaim> claims_ ABSL_GUARDED_BY(mu_);
  uint64_t created_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_NODE_POOL_H_
