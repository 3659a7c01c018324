// JobKey: a job as the autotuner and what it learns know it, its label
// within its tenant. A label is what a client says it runs (any tenant may
// say any label), so it names a job only together with the tenant the
// daemon derived from the peer's credentials: two tenants' sessions under
// one label are two jobs, with their own windows, decisions, modes and
// learned configs.
//
// A job of several processes (the ranks of a torchrun job) is one job: its
// sessions report the run id they share (SessionRank), and one run is
// one job whatever labels its ranks give (they take the label of the
// run's first session). Two runs of one label are two jobs, decided and
// pushed apart, and learn for the label: what one run learned, the
// label's next run starts with.
#ifndef ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_
#define ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_

#include <cstdint>
#include <string>

#include "server/tenant_id.h"

namespace allocd {

struct JobKey {
  TenantId tenant;
  std::string job;  // the label
  // The run id its sessions share (SessionRank::run); "" for a job known
  // by its label alone. What is learned is the label's (run "").
  std::string run;

  auto operator<=>(const JobKey&) const = default;
};

// A session's place in a job of several processes, as its client reported
// it at registration (torchrun's RANK and WORLD_SIZE, and the run id its
// ranks share). world_size 0: the client reported none.
struct SessionRank {
  std::string run;
  uint32_t rank = 0;
  uint32_t world_size = 0;

  // One of several ranks, which run in lockstep: the job needs what its
  // worst rank needs.
  bool OfSeveral() const { return world_size > 1; }
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_JOB_KEY_H_
