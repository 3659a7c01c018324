// Admission: how much of one resource (side-socket connections, sessions,
// registrations waiting for their lease) each tenant holds, against a bound
// per tenant and a bound in total, so that no tenant can take what the
// others need nor the daemon run out of it. A refusal says which bound and
// the flag that raises it, and is logged (a flood of them at most every
// 10 s, with their count).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_ADMISSION_H_
#define ALLOCD_SERVER_ADMISSION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/log.h"
#include "server/tenant_id.h"

namespace allocd {

struct AdmissionLimits {
  // The most one tenant holds; 0: no bound.
  size_t per_tenant = 0;
  // The most all tenants hold together; 0: no bound.
  size_t total = 0;
};

class Admission {
 public:
  // `what` names one unit in refusals ("side-socket connection");
  // `per_tenant_flag` and `total_flag` are the flags that set the bounds
  // ("--max-connections-per-tenant").
  Admission(std::string what, std::string per_tenant_flag,
            std::string total_flag, AdmissionLimits limits);

  // One more for `tenant`, or ResourceExhausted (nothing taken) saying
  // which bound it would pass and what to do; `who` (the peer) goes in
  // the log line.
  absl::Status Take(const TenantId& tenant, absl::string_view who)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back one that Take gave `tenant`.
  void Give(const TenantId& tenant) ABSL_LOCKS_EXCLUDED(mu_);

  size_t held(const TenantId& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t total() const ABSL_LOCKS_EXCLUDED(mu_);
  const AdmissionLimits& limits() const { return limits_; }

 private:
  const std::string what_;
  const std::string per_tenant_flag_;
  const std::string total_flag_;
  const AdmissionLimits limits_;
  mutable absl::Mutex mu_;
  // Tenants holding none are not kept.
  absl::flat_hash_map<TenantId, size_t> held_ ABSL_GUARDED_BY(mu_);
  size_t total_ ABSL_GUARDED_BY(mu_) = 0;
  RefusalLog refusals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_ADMISSION_H_
