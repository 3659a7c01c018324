// ChunkShares: a node pool's shares, the part of it that lets sessions map
// chunks another session owns.
//
// Sharing (CUDA IPC: torch.multiprocessing sends a CUDA tensor as a handle
// of its segment): the owner of chunks names them with a share token
// (NodePool::Share), other sessions map them too (NodePool::OpenShare, then
// Claim, as for an Acquire) while the owner keeps them. A chunk goes back
// to the cache only when its owner released it (or ended) and every open of
// it is closed (NodePool::CloseShare, or the opener's EndSession).
//
// This part keeps the shares, who opened which how often, and how many
// opens hold each chunk; the pool keeps the chunks, checks what an owner
// may share, and caches the chunks this part says no open holds any more.
//
// Thread-safety: none of its own. It is state of the pool, guarded by the
// pool's lock: every method takes that lock, held, as `pool_mu` (named in
// its signature, so clang's -Wthread-safety checks each call holds it; an
// annotation on a member reference to the pool's mutex would name another
// expression than the one the pool locks, and clang cannot tell them apart).
// Its members are reached only through those methods.
#ifndef ALLOCD_SERVER_POOL_CHUNK_SHARES_H_
#define ALLOCD_SERVER_POOL_CHUNK_SHARES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/session_id.h"

namespace allocd {

class ChunkShares {
 public:
  // How many shares taking opens may name one chunk. A client shares a
  // segment once and passes its token on (the interposer keeps one per
  // segment), so a chunk is in one share; the bound keeps what one session
  // can make the pool keep, and what giving a chunk up walks, a small
  // multiple of what it holds.
  static constexpr size_t kMaxSharesPerChunk = 16;

  // Records share `token` of chunks `chunk_ids` of session `owner`, in that
  // order; the pool has checked that `owner` holds them all.
  // ResourceExhausted (and nothing recorded) when one of them is already in
  // kMaxSharesPerChunk shares that take opens.
  absl::Status Add(const absl::Mutex& pool_mu, SessionId owner,
                   std::string token, absl::Span<const uint64_t> chunk_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Session `opener` opens share `token`: its chunks, in the share's order,
  // held by the open (IsOpen) until it closes. NotFound for a share that is
  // unknown or no longer open to new opens.
  absl::StatusOr<std::vector<uint64_t>> Open(const absl::Mutex& pool_mu,
                                             SessionId opener,
                                             absl::string_view token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Closes one open of share `token` by session `opener`: the chunks no
  // open holds any more, in the share's order (the pool caches those nobody
  // owns); nullopt when `opener` has no open of it.
  std::optional<std::vector<uint64_t>> Close(const absl::Mutex& pool_mu,
                                             SessionId opener,
                                             absl::string_view token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // The owner of share `token` while it takes new opens; nullopt otherwise.
  std::optional<SessionId> OwnerOf(const absl::Mutex& pool_mu,
                                   absl::string_view token) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Whether an open holds chunk `chunk_id`: while one does, the chunk is
  // not cached even when no session owns it.
  bool IsOpen(const absl::Mutex& pool_mu, uint64_t chunk_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Chunks `given_up` left their owner: the shares that include one take
  // no new opens, and are forgotten once none is open. Walks only those
  // shares.
  void EndShares(const absl::Mutex& pool_mu,
                 const absl::flat_hash_set<uint64_t>& given_up)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Session `id` ends: its shares take no new opens, and its opens close.
  // Returns the chunks no open holds any more, as Close does.
  std::vector<uint64_t> EndSession(const absl::Mutex& pool_mu, SessionId id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

 private:
  struct Share {
    SessionId owner = 0;
    std::vector<uint64_t> chunk_ids;
    // False once the owner released one of the chunks or ended: no new
    // opens; the share is forgotten when its last open closes.
    bool open = true;
    uint32_t opens = 0;
  };
  // A session's part in sharing: the share tokens of its chunks, and the
  // shares it has open (how often). Absent while both are empty.
  struct SessionShares {
    absl::flat_hash_set<std::string> shared;
    absl::flat_hash_map<std::string, uint32_t> opened;
  };

  // Takes new opens away from share `token` (one that takes them); forgets
  // it when nobody has it open.
  void EndShare(const std::string& token);
  // Forgets `id`'s entry in sessions_ once it holds nothing.
  void ForgetIfIdle(SessionId id);

  absl::flat_hash_map<std::string, Share> shares_;
  absl::flat_hash_map<SessionId, SessionShares> sessions_;
  // Opens holding each chunk (of all shares that include it); absent: none.
  absl::flat_hash_map<uint64_t, uint32_t> chunk_opens_;
  // The shares taking opens that name each chunk; absent: none.
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<std::string>>
      chunk_shares_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CHUNK_SHARES_H_
