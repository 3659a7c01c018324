// SessionLimits: how many sessions each tenant has, and how many of them
// still wait for their lease, against bounds per tenant and in total. A
// flood of registrations that never lease is refused past its tenant's
// bound of waiting ones instead of filling the daemon (each waits out the
// lease grace before it ends), and no tenant can take every session the
// daemon allows. Refusals are ResourceExhausted, saying which bound and the
// flag that raises it (Admission).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_SESSION_LIMITS_H_
#define ALLOCD_SERVER_SESSION_LIMITS_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/admission.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

struct SessionLimitsOptions {
  // Every session (--max-sessions-per-tenant, --max-sessions).
  AdmissionLimits sessions;
  // Sessions registered and not leased yet
  // (--max-unleased-sessions-per-tenant, --max-unleased-sessions).
  AdmissionLimits unleased;
};

// The daemon's defaults: a session costs the daemon a few KiB and a lease
// connection; one not leased yet lives out the lease grace, so a flood of
// them is what the tighter bound stops, while a tenant starting a
// DDP-sized burst of processes at once fits well inside it.
inline constexpr SessionLimitsOptions kDefaultSessionLimits = {
    .sessions = {.per_tenant = 1024, .total = 4096},
    .unleased = {.per_tenant = 64, .total = 256}};

class SessionLimits {
 public:
  explicit SessionLimits(SessionLimitsOptions options);

  // Counts session `id` of `tenant`, just registered and waiting for its
  // lease; ResourceExhausted (nothing counted) when a bound refuses it.
  // `who` (the peer) goes in the log line of a refusal.
  absl::Status Admit(SessionId id, const TenantId& tenant,
                     absl::string_view who) ABSL_LOCKS_EXCLUDED(mu_);
  // Session `id` opened its lease: it waits no longer.
  void Leased(SessionId id) ABSL_LOCKS_EXCLUDED(mu_);
  // Session `id` ended; nothing for one never admitted.
  void Ended(SessionId id) ABSL_LOCKS_EXCLUDED(mu_);

  const Admission& sessions() const { return sessions_; }
  const Admission& unleased() const { return unleased_; }

 private:
  struct Counted {
    TenantId tenant;
    bool unleased = true;
  };

  Admission sessions_;
  Admission unleased_;
  absl::Mutex mu_;
  absl::flat_hash_map<SessionId, Counted> counted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_LIMITS_H_
