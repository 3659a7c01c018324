// JobRegistry: the jobs and sessions the autotuner knows, each job's policy
// (or the daemon's default) and the window it records of one of its
// sessions, and which ended jobs it still keeps. Not thread-safe: the
// autotuner guards it with its lock.
#ifndef ALLOCD_SERVER_AUTOTUNE_JOB_REGISTRY_H_
#define ALLOCD_SERVER_AUTOTUNE_JOB_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/autotune/autotune_job.h"
#include "server/autotune/autotune_memory.h"
#include "server/autotune/autotune_options.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/job_key.h"
#include "server/autotune/task_queue.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

class JobRegistry {
 public:
  explicit JobRegistry(const AutotuneOptions& options);

  // Session `id`; nullptr when unknown (or ended).
  AutotuneSession* FindSession(SessionId id);
  const AutotuneSession* FindSession(SessionId id) const;
  // The job `key`, made empty the first time.
  AutotuneJob& Job(const JobKey& key) { return jobs_[key]; }
  // The job `key`; nullptr when there is none.
  const AutotuneJob* FindJob(const JobKey& key) const {
    auto it = jobs_.find(key);
    return it == jobs_.end() ? nullptr : &it->second;
  }

  JobPolicy PolicyOf(const AutotuneJob& job) const;
  AutotuneMode ModeOf(const AutotuneJob& job) const { return PolicyOf(job).mode; }
  AutotuneJobState StateOf(const AutotuneJob& job) const;

  // Session `id` of the job `key` runs `config` as `config_version`. A new
  // one joins its job (recorded when the job records none), which it
  // returns; one declared again only updates what it runs (nullptr). A
  // session that is one of several ranks (`rank`) makes its job lockstep.
  AutotuneJob* AddSession(SessionId id, const JobKey& key, const std::string& config,
                          uint64_t config_version, bool marks_steps,
                          const SessionRank& rank = {});
  // Forgets session `id` (known) and returns its job's key.
  JobKey RemoveSession(SessionId id);
  // Records session `id`'s events in `job`'s window from now on (none while
  // the job is off).
  void StartRecording(AutotuneJob& job, SessionId id);
  // `key`'s policy; an empty label (and run): the default, for jobs
  // without their own.
  // A job turned off drops its window; one turned on starts one. Returns
  // the jobs with a recorded session that it turned off or on.
  std::vector<AutotuneJob*> SetPolicy(const JobKey& key, JobPolicy policy);
  // `key`'s last session ended: past ended_jobs_kept ended jobs, the oldest
  // go, unless a session came back or something still refers to them (its
  // push, review or run, or a task in `tasks`).
  void Ended(const JobKey& key, const AutotuneTaskQueue& tasks);

  // The jobs of label `job` (each tenant's, or `tenant`'s only) that have a
  // session, in tenant order.
  std::vector<std::pair<JobKey, AutotuneJob*>> LiveJobs(const std::string& job,
                                                        const TenantId& tenant);
  // What `tenant`'s jobs of label `job` reported doing, every run of it and
  // the ended ones still kept: the union.
  JobFeatures FeaturesOf(const TenantId& tenant, const std::string& job) const;
  // Every job, by label then tenant (then run), each with its sessions by
  // rank.
  std::vector<AutotuneJobStatus> Status() const;
  // Newest first, at most `limit`; an empty label: every job's.
  std::vector<AutotuneDecision> History(const std::string& job, size_t limit) const;

 private:
  // Drops or starts `job`'s window for its mode; whether it did (its
  // recorded session switched off or on).
  bool ApplyMode(AutotuneJob& job);

  const AutotuneOptions options_;
  JobPolicy default_policy_;
  // Before jobs_: their windows give their charges back as they go.
  AutotuneMemory memory_;
  std::map<JobKey, AutotuneJob> jobs_;
  absl::flat_hash_map<SessionId, AutotuneSession> sessions_;
  // Jobs whose last session ended, oldest first (Ended).
  std::deque<JobKey> ended_jobs_;
  uint64_t next_order_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_JOB_REGISTRY_H_
