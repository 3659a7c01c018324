// AutotuneTaskQueue: the work the autotuner's worker runs one at a time
// (decisions, and a push's promotion, rollback, review, judgement and
// reprediction), taken in turns by tenant.
#ifndef ALLOCD_SERVER_AUTOTUNE_TASK_QUEUE_H_
#define ALLOCD_SERVER_AUTOTUNE_TASK_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/decision_inputs.h"
#include "server/autotune/job_key.h"
#include "server/autotune/learn_check.h"
#include "server/tenant_id.h"

namespace allocd {

struct AutotuneTask {
  enum class Kind { kDecide, kPromote, kRollBack, kReview, kJudge, kRepredict };
  Kind kind = Kind::kDecide;
  JobKey job;
  // kDecide (which records under the job's queued id).
  AutotuneTrigger trigger = AutotuneTrigger::kFirstPass;
  uint64_t decision_id = 0;  // kPromote, kRollBack, kReview, kJudge, kRepredict
  bool first_pass = false;   // kDecide: decide only once the window ends in steps
  std::string reason;        // kRollBack, kJudge
  absl::Time triggered_at;   // kDecide
  std::shared_ptr<const PushReplayInput> review;  // kReview, kJudge, kRepredict
  // kPromote: the learn check of the push once it is set for the job (null:
  // the job's window held no events to check it on).
  std::shared_ptr<const LearnCheckInput> learn;
};

// Not thread-safe: the autotuner guards it with its lock.
class AutotuneTaskQueue {
 public:
  void Push(AutotuneTask task) { tasks_.push_back(std::move(task)); }
  bool empty() const { return tasks_.empty(); }
  // Whether a task for `job` waits.
  bool HasTaskFor(const JobKey& job) const;

  // Takes the next task to start: the oldest of the tenant whose last task
  // started longest ago (a tenant none of whose tasks started yet first).
  // A tenant with many jobs deciding (or growing ones, which skip the
  // cooldown) delays another's next task by at most one of its own, not by
  // its whole queue; a job's tasks keep their order. Requires !empty().
  AutotuneTask Pop();

 private:
  std::deque<AutotuneTask> tasks_;
  // When each tenant's last task started, in tasks started; past
  // kTenantsRemembered tenants, forgotten all at once (their turns even out).
  static constexpr size_t kTenantsRemembered = 4096;
  absl::flat_hash_map<TenantId, uint64_t> started_by_tenant_;
  uint64_t tasks_started_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_TASK_QUEUE_H_
