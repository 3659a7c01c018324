// Autotuner::Impl: private to the autotuner's .cc files. The composition
// behind Autotuner: the daemon feeds it under its lock (autotuner.cc), and
// its worker thread runs the queued tasks, replays outside the lock
// (autotune_tasks.cc).
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_IMPL_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/autotune/autotune_job.h"
#include "server/autotune/autotuner.h"
#include "server/autotune/canary.h"
#include "server/autotune/decider.h"
#include "server/autotune/decision_inputs.h"
#include "server/autotune/job_registry.h"
#include "server/autotune/task_queue.h"

namespace allocd {

class Autotuner::Impl {
 public:
  Impl(AutotuneOptions options, AutotuneActions* actions)
      : options_(std::move(options)),
        actions_(actions),
        jobs_(options_),
        worker_([this] { Work(); }) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    worker_.join();
  }

  // Autotuner's methods (autotuner.h), each under the lock.
  void SessionStarted(SessionId id, const std::string& job_name, const std::string& config,
                      uint64_t config_version, const TenantId& tenant, bool marks_steps,
                      const SessionRank& rank) ABSL_LOCKS_EXCLUDED(mu_);
  void SessionEnded(SessionId id) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t StreamReadFrom(SessionId id) const ABSL_LOCKS_EXCLUDED(mu_);
  // What of its recorded session's stream `job` reads (StreamReadFrom):
  // none while it is off; past its settled need once it is settled; else
  // all of it.
  uint64_t RecordedReadFrom(const AutotuneJob& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Events(SessionId id, const std::vector<EvidenceEvent>& events,
              uint64_t dropped_before, const AllocatorSnapshot* state_after)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version) ABSL_LOCKS_EXCLUDED(mu_);
  void Features(SessionId id, const JobFeatures& features) ABSL_LOCKS_EXCLUDED(mu_);
  void Oom(SessionId id, uint64_t config_version) ABSL_LOCKS_EXCLUDED(mu_);
  void Acked(SessionId id, uint64_t version, bool applied, const std::string& error)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    AckedLocked(id, version, applied, error);
  }
  void Handed(SessionId id, uint64_t version, const std::string& config)
      ABSL_LOCKS_EXCLUDED(mu_);
  void StartedInstead(SessionId id, const std::string& own, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> RunNow(const std::string& job_name, const TenantId& tenant)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tells the recorded session of each job it turns off or on what of its
  // stream is read now (DemandStream).
  void SetPolicy(const JobKey& key, JobPolicy policy) ABSL_LOCKS_EXCLUDED(mu_);

  JobFeatures FeaturesOf(const TenantId& tenant, const std::string& job) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return jobs_.FeaturesOf(tenant, job);
  }

  std::vector<AutotuneJobStatus> Status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return jobs_.Status();
  }

  std::vector<AutotuneDecision> History(const std::string& job_name, size_t limit) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return jobs_.History(job_name, limit);
  }

  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::Idle));
  }

 private:
  // A run for a job that grew: it skips the cooldown, and its prediction must
  // cover the job's largest request.
  static bool ForGrowth(AutotuneTrigger trigger) {
    return trigger == AutotuneTrigger::kGrowth || trigger == AutotuneTrigger::kLargerRequest;
  }

  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }

  // RunNow for one job with a session.
  absl::StatusOr<uint64_t> RunNowLocked(const JobKey& key, AutotuneJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues a run unless one is queued or running, the job is off or in a
  // canary, or (except for an admin's run and a job that grew) it ran
  // within the cooldown.
  bool Enqueue(const JobKey& name, AutotuneJob& job, AutotuneTrigger trigger, bool first_pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues a task of `kind` on the push `decision_id`.
  void QueueTask(AutotuneTask::Kind kind, const JobKey& name, uint64_t decision_id,
                 std::string reason = "",
                 std::shared_ptr<const PushReplayInput> review = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    tasks_.Push({.kind = kind,
                 .job = name,
                 .decision_id = decision_id,
                 .reason = std::move(reason),
                 .review = std::move(review)});
  }

  // Queues the promotion of the push under way, with the input of its
  // learn check read from the window now: the window of a canary whose
  // session ends goes as it ends, before the check runs.
  void QueuePromote(const JobKey& name, AutotuneJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Rolls the push back (unless a rollback is under way): for what the job
  // realised under it (then the config may be proposed again on larger
  // requests), or for good (a NACK, an OOM, a failed push).
  void QueueRollBack(const JobKey& name, AutotuneJob& job, std::string reason,
                     bool for_what_it_realised = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What the canary asks for after a step: a judgement (a rollback when
  // its events after the push are not recorded), a promotion or a rollback.
  void Act(const JobKey& name, AutotuneJob& job, Canary::Action action)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A stats report of a session under the pushed version (Canary::Watch).
  void Watch(const JobKey& name, AutotuneJob& job, int64_t reserved, int64_t allocated,
             absl::Time now, std::vector<AutotuneDecision>& notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Notify(const std::vector<AutotuneDecision>& decisions) {
    for (const AutotuneDecision& d : decisions) actions_->OnDecision(d);
  }

  bool HasTask() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tasks_.empty() && !busy_; }

  // The worker thread: runs the queued tasks one at a time until stop_.
  void Work() ABSL_LOCKS_EXCLUDED(mu_);

  // Acked with the lock held (also for an answer that came before
  // PushToSession returned).
  void AckedLocked(SessionId id, uint64_t version, bool applied, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The tasks (autotune_tasks.cc), run by the worker outside the lock, and
  // what queues them.
  void RunDecision(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // The first pass of a job whose recorded session started on `instead`'s
  // replacement for its own config: ReviewPrior on the window `in` (run
  // under `running`, the replacement), recorded as a start_review
  // decision. True when the job went back to its own config, which ends
  // the pass; false: the pass goes on to its decision.
  bool ReviewStart(const AutotuneTask& task, const AutotuneSession::Instead& instead,
                   const DecisionInputs& in, const RunningConfig& running)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sets the push for the whole job, then checks what its next runs learn
  // from it (LearnCheck).
  void Promote(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // The push of `task`, set for the job, replayed as the job's next runs
  // would start on it (CheckLearned in learn_check.h, on task.learn): its
  // decision's `learned`, which is what the daemon records for the job.
  // Unchecked (no events to replay, or the push does not replay), the
  // pushed config, saying so.
  void LearnCheck(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // The best the job could have had from the push on: Decide, switched where
  // the push happened, over the events after it. Staying counts too (a push
  // that should not have been made is judged against not making it).
  void Review(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps or rolls back a push on the canary's events after it (see
  // AutotuneOptions::rollback_margin).
  void Judge(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues Judge when the window holds events after the push, and returns
  // whether it did.
  bool QueueJudge(const JobKey& name, AutotuneJob& job, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pushed config replayed on the events the canary ran after the push:
  // the standing prediction (Canary::standing) when it covers more of what
  // the job requested.
  void Repredict(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues Repredict for a canary under watch (no decision runs then:
  // Enqueue waits for the push to be applied) that asks for it
  // (Canary::WantsReprediction). Once applied, a larger request or growth
  // decides again, and a decision that keeps the config stands.
  void MaybeRepredict(const JobKey& name, AutotuneJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the review of `job`'s last push (AutotuneJob::review) on the window of
  // its recorded session, as it is now.
  void QueueReview(const JobKey& name, AutotuneJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RollBack(const AutotuneTask& task) ABSL_LOCKS_EXCLUDED(mu_);

  const AutotuneOptions options_;
  AutotuneActions* const actions_;
  mutable absl::Mutex mu_;
  JobRegistry jobs_ ABSL_GUARDED_BY(mu_);
  AutotuneTaskQueue tasks_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_decision_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread worker_;  // last: starts once the rest is built
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_IMPL_H_
