// ClaimTokens: a node pool's grants that wait for their claim, each under a
// one-time token.
//
// Handing out a chunk is two steps, because its FD cannot travel over gRPC:
// NodePool::Acquire picks the chunks and returns their ids with a one-time
// claim token bound to the session's pid; NodePool::Claim exchanges the
// token for dup()s of the chunks' FDs, only for a caller the kernel says is
// that pid (SO_PEERCRED on the socket the token came over). A token not
// claimed within its time to live expires, and the pool takes its chunks
// back.
//
// This part keeps the pending claims and their expiry; the pool decides
// what a claim hands out, and what an expired or abandoned one gives back.
//
// Thread-safety: as ChunkShares, state of the pool under the pool's lock,
// which every method takes, held, as `pool_mu`.
#ifndef ALLOCD_SERVER_POOL_CLAIM_TOKENS_H_
#define ALLOCD_SERVER_POOL_CLAIM_TOKENS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/session_id.h"

namespace allocd {

// 128 random bits from the kernel, as 32 hex digits: a claim or share
// token. Internal when the kernel gives none. A syscall: called outside
// the pool's lock.
absl::StatusOr<std::string> NewToken();

// A grant waiting for its claim.
struct PendingClaim {
  // The Acquire's serial (0 for an open of a share).
  uint64_t grant = 0;
  SessionId session = 0;
  uint64_t incarnation = 0;
  // The only process that may claim it.
  pid_t pid = 0;
  // Set by ClaimTokens::Add.
  absl::Time expires;
  std::vector<uint64_t> chunk_ids;
  // The share an OpenShare grant opened; empty for an Acquire's.
  std::string share;
};

class ClaimTokens {
 public:
  // Tokens live `ttl` by the clock `now`.
  ClaimTokens(absl::Duration ttl, std::function<absl::Time()> now)
      : ttl_(ttl), now_(std::move(now)) {}

  // Records `claim` under `token`, expiring `ttl` from now.
  void Add(const absl::Mutex& pool_mu, std::string token, PendingClaim claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // The claim of `token`, no longer pending, for process `pid`. NotFound
  // for an unknown or used token (or one TakeExpired took);
  // PermissionDenied when the claim is another pid's: it stays pending.
  absl::StatusOr<PendingClaim> TakeFor(const absl::Mutex& pool_mu,
                                       absl::string_view token, pid_t pid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // The claim of `token`, whoever's, no longer pending; nullopt for an
  // unknown or used token.
  std::optional<PendingClaim> Take(const absl::Mutex& pool_mu,
                                   absl::string_view token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Makes a claim Take took pending again, under `token`, with its expiry:
  // a claim that failed before it handed anything out.
  void PutBack(const absl::Mutex& pool_mu, std::string token,
               PendingClaim claim) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // The claims expired by now, no longer pending.
  std::vector<PendingClaim> TakeExpired(const absl::Mutex& pool_mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Forgets the claims of session `id`.
  void EndSession(const absl::Mutex& pool_mu, SessionId id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

 private:
  const absl::Duration ttl_;
  const std::function<absl::Time()> now_;
  absl::flat_hash_map<std::string, PendingClaim> claims_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CLAIM_TOKENS_H_
