// JobKey: a job as the autotuner and what it learns know it, its label
// within its tenant. A label is what a client says it runs (any tenant may
// say any label), so it names a job only together with the tenant the
// daemon derived from the peer's credentials: two tenants' sessions under
// one label are two jobs, with their own windows, decisions, modes and
// learned configs.
#ifndef ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_
#define ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_

#include <string>

#include "server/tenant_id.h"

namespace allocd {

struct JobKey {
  TenantId tenant;
  std::string job;  // the label

  auto operator<=>(const JobKey&) const = default;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_
