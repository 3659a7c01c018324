// SessionLedger: a node pool's sessions and what they hold against their
// quotas.
//
// A session is in the ledger from NodePool::AddSession to EndSession: its
// process (the pid its claim tokens are bound to), uid and tenant, an
// incarnation that tells it from a later session of the same id, the
// chunks it holds and its held bytes -- those chunks' plus those an Acquire
// is still creating for it. The ledger sums held bytes by uid and by
// tenant, keeps the quotas on them (a session's own, a uid's, a tenant's
// or the default for tenants without one), numbers grants, and versions
// who holds what.
//
// This part keeps the accounting; the pool decides when bytes become held
// or stop being held, and keeps the chunks themselves (ChunkTable).
//
// Thread-safety: as ChunkShares, state of the pool under the pool's lock,
// which every method takes, held, as `pool_mu` -- all but version(), read
// without it.
#ifndef ALLOCD_SERVER_POOL_SESSION_LEDGER_H_
#define ALLOCD_SERVER_POOL_SESSION_LEDGER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

class SessionLedger {
 public:
  struct Session {
    uid_t uid = 0;
    pid_t pid = 0;
    TenantId tenant;
    // Tells this session from a later one with the same id.
    uint64_t incarnation = 0;
    // Bytes of `chunks` plus chunks an Acquire is creating for it; changed
    // only through AddHeld and SubtractHeld.
    uint64_t held = 0;
    std::optional<uint64_t> quota;
    // The chunks it holds (pending ones included).
    absl::flat_hash_set<uint64_t> chunks;
  };

  // Starts session `id` of process `pid` run by `uid`, of `tenant`, holding
  // nothing, without a quota of its own. InvalidArgument for id 0 or an
  // empty tenant; AlreadyExists for a live session's id.
  absl::Status Add(const absl::Mutex& pool_mu, SessionId id, uid_t uid,
                   pid_t pid, TenantId tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Session `id`, or NotFound naming it.
  absl::StatusOr<Session*> Find(const absl::Mutex& pool_mu, SessionId id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Session `id` if it is still the incarnation that began work outside the
  // lock (an Acquire's chunk creation, a grant); null once it ended.
  Session* FindIncarnation(const absl::Mutex& pool_mu, SessionId id,
                           uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Forgets session `id` (no-op for an unknown one): what it held no
  // longer counts against its uid and tenant.
  void End(const absl::Mutex& pool_mu, SessionId id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Calls `visit` with every session.
  void ForEach(const absl::Mutex& pool_mu,
               absl::FunctionRef<void(SessionId, const Session&)> visit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // Session `s` holds `bytes` more (or, Subtract, fewer), and so do its uid
  // and tenant; either changes the version.
  void AddHeld(const absl::Mutex& pool_mu, Session& s, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  void SubtractHeld(const absl::Mutex& pool_mu, Session& s, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // OK when session `id` (`s`) may hold `bytes` more under every quota
  // that covers it; otherwise ResourceExhausted naming the first it would
  // pass, in the order session, uid, tenant.
  absl::Status CheckQuotas(const absl::Mutex& pool_mu, SessionId id,
                           const Session& s, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Quotas on held bytes, as NodePool's setters of the same names: nullopt
  // removes one. SetSessionQuota is false (nothing set) for an unknown
  // session.
  bool SetSessionQuota(const absl::Mutex& pool_mu, SessionId id,
                       std::optional<uint64_t> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  void SetUidQuota(const absl::Mutex& pool_mu, uid_t uid,
                   std::optional<uint64_t> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  void SetTenantQuota(const absl::Mutex& pool_mu, const TenantId& tenant,
                      std::optional<uint64_t> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  void SetDefaultTenantQuota(const absl::Mutex& pool_mu,
                             std::optional<uint64_t> bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);

  // A new grant's serial (ChunkTable::Chunk::grant), never 0.
  uint64_t NewGrant(const absl::Mutex& pool_mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Chunks changed hands without held bytes changing (an Acquire's chunks
  // stop being pending): changes the version.
  void NoteChange(const absl::Mutex& pool_mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu);
  // Changes (under the lock) whenever chunks change hands; read without it.
  uint64_t version() const { return version_.load(); }

 private:
  absl::flat_hash_map<SessionId, Session> sessions_;
  uint64_t next_incarnation_ = 1;
  uint64_t next_grant_ = 1;
  // Bytes held by each uid's sessions, and their quotas.
  absl::flat_hash_map<uid_t, uint64_t> uid_held_;
  absl::flat_hash_map<uid_t, uint64_t> uid_quotas_;
  // The same by tenant.
  absl::flat_hash_map<TenantId, uint64_t> tenant_held_;
  absl::flat_hash_map<TenantId, uint64_t> tenant_quotas_;
  std::optional<uint64_t> default_tenant_quota_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_SESSION_LEDGER_H_
