#include "server/autotune/autotuner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "server/autotune/autotune_job.h"
#include "server/autotune/canary.h"
#include "server/autotune/decider.h"
#include "server/autotune/decision_inputs.h"
#include "server/autotune/job_registry.h"
#include "server/autotune/job_window.h"
#include "server/autotune/rollback_model.h"
#include "server/autotune/start_config.h"
#include "server/autotune/task_queue.h"

namespace allocd {
namespace {

constexpr char kReservedStat[] = "reserved_bytes.all.current";
constexpr char kReservedPeakStat[] = "reserved_bytes.all.peak";
constexpr char kAllocatedStat[] = "allocated_bytes.all.current";
constexpr char kAllocatedPeakStat[] = "allocated_bytes.all.peak";
constexpr char kRetriesStat[] = "num_alloc_retries";
// A run for a job that grew: it skips the cooldown, and its prediction must
// cover the job's largest request.
bool ForGrowth(AutotuneTrigger trigger) {
  return trigger == AutotuneTrigger::kGrowth || trigger == AutotuneTrigger::kLargerRequest;
}

// Lowers this thread's priority by `nice`; threads it starts inherit it
// (Linux keeps a nice value per thread).
void NiceThisThread(int nice) {
  if (nice <= 0) return;
  const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) setpriority(PRIO_PROCESS, tid, std::min(19, current + nice));
}

int64_t StatOr(const std::map<std::string, int64_t>& stats, const char* name, int64_t fallback) {
  auto it = stats.find(name);
  return it == stats.end() ? fallback : it->second;
}

}  // namespace

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

  void SessionStarted(SessionId id, const std::string& job_name, const std::string& config,
                      uint64_t config_version, const TenantId& tenant, bool marks_steps,
                      const SessionRank& rank) {
    absl::MutexLock lock(&mu_);
    AutotuneJob* job =
        jobs_.AddSession(id, {.tenant = tenant, .job = job_name, .run = rank.run}, config,
                         config_version, marks_steps, rank);
    if (job == nullptr) return;
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
    if (parsed.ok() && IsHarmfulStartConfig(*parsed)) {
      job->first_trigger = AutotuneTrigger::kBadStartConfig;
    }
  }

  void SessionEnded(SessionId id) {
    std::vector<AutotuneDecision> notify;
    {
      absl::MutexLock lock(&mu_);
      if (jobs_.FindSession(id) == nullptr) return;
      const JobKey name = jobs_.RemoveSession(id);
      AutotuneJob& job = jobs_.Job(name);
      if (job.acting && job.CanaryEnded(id, notify)) {
        QueueTask(AutotuneTask::Kind::kPromote, name, job.acting->decision_id());
      }
      if (job.recorded == id) {
        QueueReview(name, job);
        job.recorded = 0;
        job.window.reset();
        if (!job.sessions.empty()) jobs_.StartRecording(job, job.sessions.front());
      }
      if (job.sessions.empty()) {
        jobs_.Ended(name, tasks_);
      }
    }
    Notify(notify);
  }

  void Events(SessionId id, const std::vector<EvidenceEvent>& events,
              uint64_t dropped_before, const AllocatorSnapshot* state_after) {
    absl::MutexLock lock(&mu_);
    const AutotuneSession* session = jobs_.FindSession(id);
    if (session == nullptr) return;
    AutotuneJob& job = jobs_.Job(session->job);
    if (job.recorded != id || job.window == nullptr) return;
    job.window->Add(events, dropped_before);
    if (state_after != nullptr) job.window->AddState(*state_after);
    if (job.acting && job.acting->canary() == id) {
      job.acting->SawRequested(job.window->peak_held_requested_bytes());
      job.acting->UpdatePredictionAtNeed(job.FindDecision(job.acting->decision_id()));
      MaybeRepredict(session->job, job);
      Act(session->job, job, job.acting->Stepped(job.Stream()));
    }
    // A long job's push is reviewed on half a window of events after it,
    // before the window lets it go.
    if (job.review &&
        job.window->total_events() - job.review->second >= options_.window_events / 2) {
      QueueReview(session->job, job);
    }
    if (std::optional<AutotuneJob::Due> due = job.DueOnEvents(options_)) {
      if (Enqueue(session->job, job, due->trigger, due->first_pass) && due->probe) {
        job.Probed(options_.window_events);
      }
    }
  }

  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version) {
    std::vector<AutotuneDecision> notify;
    {
      absl::MutexLock lock(&mu_);
      AutotuneSession* found = jobs_.FindSession(id);
      if (found == nullptr) return;
      AutotuneSession& session = *found;
      AutotuneJob& job = jobs_.Job(session.job);
      if (jobs_.ModeOf(job) == AutotuneMode::kOff) return;
      const absl::Time now = Now();
      const int64_t reserved = StatOr(stats, kReservedStat, 0);
      const int64_t allocated = StatOr(stats, kAllocatedStat, 0);
      const int64_t retries = StatOr(stats, kRetriesStat, session.retries);

      if (job.acting && job.acting->RunsPushedVersion(id, config_version)) {
        Watch(session.job, job, reserved,
              std::max(allocated, StatOr(stats, kAllocatedPeakStat, 0)), now, notify);
      }
      if (retries > session.retries) {
        Enqueue(session.job, job, AutotuneTrigger::kAllocRetry, false);
      }
      if (job.Grew(reserved, options_.growth_margin) &&
          Enqueue(session.job, job, AutotuneTrigger::kGrowth, false)) {
        job.growth_reserved = reserved;
      }
      session.retries = retries;
      session.reserved_peak = StatOr(stats, kReservedPeakStat, session.reserved_peak);
      if (session.Fragmented(reserved, allocated, now, options_)) {
        Enqueue(session.job, job, AutotuneTrigger::kFragmentation, false);
      }
    }
    Notify(notify);
  }

  void Features(SessionId id, const JobFeatures& features) {
    absl::MutexLock lock(&mu_);
    const AutotuneSession* session = jobs_.FindSession(id);
    if (session == nullptr) return;
    AutotuneJob& job = jobs_.Job(session->job);
    job.features |= features;
    // Features can appear after a push: one they break goes back, for good.
    if (!job.acting) return;
    const AutotuneDecision* pushed = job.FindDecision(job.acting->decision_id());
    absl::StatusOr<AllocatorConfig> from =
        ParseAllocatorConfig(pushed != nullptr ? pushed->from_config : "");
    absl::StatusOr<AllocatorConfig> to = ParseAllocatorConfig(job.acting->pushed_config());
    if (pushed == nullptr || !from.ok() || !to.ok()) return;
    if (std::optional<std::string> why =
            ConfigIncompatibility(job.features, *from, *to, /*live=*/true)) {
      QueueRollBack(session->job, job,
                    absl::StrCat("session ", id, " now uses ", FeatureNames(features), ": ",
                                 *why));
    }
  }

  void Oom(SessionId id, uint64_t config_version) {
    absl::MutexLock lock(&mu_);
    const AutotuneSession* session = jobs_.FindSession(id);
    if (session == nullptr) return;
    AutotuneJob& job = jobs_.Job(session->job);
    if (job.acting && job.acting->RunsPushedVersion(id, config_version)) {
      QueueRollBack(session->job, job, absl::StrFormat(
          "session %d ran out of memory under the pushed version %d", id, config_version));
      return;
    }
    Enqueue(session->job, job, AutotuneTrigger::kOom, false);
  }

  void Acked(SessionId id, uint64_t version, bool applied, const std::string& error) {
    absl::MutexLock lock(&mu_);
    AckedLocked(id, version, applied, error);
  }

  void Handed(SessionId id, uint64_t version, const std::string& config) {
    absl::MutexLock lock(&mu_);
    if (AutotuneSession* session = jobs_.FindSession(id)) {
      session->handed = AutotuneSession::HandedConfig{.version = version, .config = config};
    }
  }

  void StartedInstead(SessionId id, const std::string& own, const std::string& why) {
    absl::MutexLock lock(&mu_);
    if (AutotuneSession* session = jobs_.FindSession(id)) {
      session->instead = AutotuneSession::Instead{.own = own, .why = why};
    }
  }

  absl::StatusOr<uint64_t> RunNow(const std::string& job_name, const TenantId& tenant) {
    absl::MutexLock lock(&mu_);
    std::optional<absl::StatusOr<uint64_t>> first;
    for (auto& [key, job] : jobs_.LiveJobs(job_name, tenant)) {
      absl::StatusOr<uint64_t> id = RunNowLocked(key, *job);
      if (!first.has_value() || (!first->ok() && id.ok())) first = std::move(id);
    }
    if (!first.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "job '", job_name, "'", tenant.empty() ? "" : absl::StrCat(" of tenant ", tenant),
          " has no session connected: start it first"));
    }
    return *std::move(first);
  }

  void SetPolicy(const JobKey& key, JobPolicy policy) {
    absl::MutexLock lock(&mu_);
    jobs_.SetPolicy(key, std::move(policy));
  }

  std::vector<AutotuneJobStatus> Status() const {
    absl::MutexLock lock(&mu_);
    return jobs_.Status();
  }

  std::vector<AutotuneDecision> History(const std::string& job_name, size_t limit) const {
    absl::MutexLock lock(&mu_);
    return jobs_.History(job_name, limit);
  }

  void WaitIdle() {
    absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::Idle));
  }

 private:
  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }

  // RunNow for one job with a session.
  absl::StatusOr<uint64_t> RunNowLocked(const JobKey& key, AutotuneJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (jobs_.ModeOf(job) == AutotuneMode::kOff) {
      return absl::FailedPreconditionError(absl::StrCat(
          "autotuning is off for job '", key.job, "' of tenant ", key.tenant,
          ": set its mode to recommend or apply first (allocctl autotune set)"));
    }
    if (job.queued) {
      // The queued (or running) run will record under this id.
      if (job.queued_id == 0) job.queued_id = next_decision_id_++;
      return job.queued_id;
    }
    if (!Enqueue(key, job, AutotuneTrigger::kAdmin, false)) {
      return absl::UnavailableError(
          absl::StrCat("job '", key.job, "' of tenant ", key.tenant, " is ",
                       AutotuneJobStateName(jobs_.StateOf(job)), ": try again once that is over"));
    }
    return job.queued_id;
  }

  // Queues a run unless one is queued or running, the job is off or in a
  // canary, or (except for an admin's run and a job that grew) it ran
  // within the cooldown.
  bool Enqueue(const JobKey& name, AutotuneJob& job, AutotuneTrigger trigger, bool first_pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool admin = trigger == AutotuneTrigger::kAdmin;
    const bool grew = ForGrowth(trigger);
    if (job.queued || jobs_.ModeOf(job) == AutotuneMode::kOff) return false;
    if (job.acting && job.acting->phase() != Canary::Phase::kApplied) return false;
    if (!admin && !grew && Now() < job.cooldown_until) return false;
    job.queued = true;
    // An admin's run is told its id now; others get one when they record.
    job.queued_id = admin ? next_decision_id_++ : 0;
    tasks_.Push({.kind = AutotuneTask::Kind::kDecide,
                 .job = name,
                 .trigger = trigger,
                 .first_pass = first_pass,
                 .triggered_at = Now()});
    return true;
  }

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

  // Rolls the push back (unless a rollback is under way): for what the job
  // realised under it (then the config may be proposed again on larger
  // requests), or for good (a NACK, an OOM, a failed push).
  void QueueRollBack(const JobKey& name, AutotuneJob& job, std::string reason,
                     bool for_what_it_realised = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t requested =
        for_what_it_realised && job.window ? job.window->max_requested_bytes() : 0;
    if (!job.acting->StartRollBack(requested)) return;
    QueueTask(AutotuneTask::Kind::kRollBack, name, job.acting->decision_id(), std::move(reason));
  }

  // What the canary asks for after a step: a judgement (a rollback when
  // its events after the push are not recorded), a promotion or a rollback.
  void Act(const JobKey& name, AutotuneJob& job, Canary::Action action)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (action.next) {
      case Canary::Next::kNothing:
        break;
      case Canary::Next::kJudge:
        if (!QueueJudge(name, job, action.reason)) {
          QueueRollBack(name, job,
                        absl::StrCat(action.reason,
                                     " (the canary's events after the push are not "
                                     "recorded, so staying could not be replayed on them)"),
                        /*for_what_it_realised=*/true);
        }
        break;
      case Canary::Next::kPromote:
        QueueTask(AutotuneTask::Kind::kPromote, name, job.acting->decision_id());
        break;
      case Canary::Next::kRollBack:
        QueueRollBack(name, job, std::move(action.reason), action.for_what_it_realised);
        break;
    }
  }

  // A stats report of a session under the pushed version (Canary::Watch).
  void Watch(const JobKey& name, AutotuneJob& job, int64_t reserved, int64_t allocated,
             absl::Time now, std::vector<AutotuneDecision>& notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AutotuneDecision* d = job.FindDecision(job.acting->decision_id());
    bool changed = false;
    Canary::Action action = job.acting->Watch(reserved, allocated, now, job.Stream(), d, changed);
    if (changed && d != nullptr) notify.push_back(*d);
    Act(name, job, std::move(action));
  }

  void Notify(const std::vector<AutotuneDecision>& decisions) {
    for (const AutotuneDecision& d : decisions) actions_->OnDecision(d);
  }

  bool HasTask() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tasks_.empty() && !busy_; }

  void Work() {
    NiceThisThread(options_.nice);
    while (true) {
      AutotuneTask task;
      {
        absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::HasTask));
        if (stop_) return;
        task = tasks_.Pop();
        busy_ = true;
      }
      switch (task.kind) {
        case AutotuneTask::Kind::kDecide: RunDecision(task); break;
        case AutotuneTask::Kind::kPromote: Promote(task); break;
        case AutotuneTask::Kind::kRollBack: RollBack(task); break;
        case AutotuneTask::Kind::kReview: Review(task); break;
        case AutotuneTask::Kind::kJudge: Judge(task); break;
        case AutotuneTask::Kind::kRepredict: Repredict(task); break;
      }
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  // Acked with the lock held (also for an answer that came before
  // PushToSession returned).
  void AckedLocked(SessionId id, uint64_t version, bool applied, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AutotuneSession* found = jobs_.FindSession(id);
    if (found == nullptr) return;
    AutotuneSession& session = *found;
    if (session.handed.has_value() && session.handed->version == version) {
      if (applied) {
        session.config = session.handed->config;
        session.config_version = version;
        // A harmful start config handed a better one is no reason to
        // hurry any more.
        AutotuneJob& job = jobs_.Job(session.job);
        absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(session.config);
        if (job.first_trigger == AutotuneTrigger::kBadStartConfig && parsed.ok() &&
            !IsHarmfulStartConfig(*parsed)) {
          job.first_trigger = AutotuneTrigger::kFirstPass;
        }
      }
      session.handed.reset();
      return;
    }
    AutotuneJob& job = jobs_.Job(session.job);
    if (!job.acting) return;
    Canary& canary = *job.acting;
    const Canary::AckResult result =
        canary.Acked({id, version, applied, error}, Now(), job.Stream());
    if (result == Canary::AckResult::kIgnored || result == Canary::AckResult::kHeld) return;
    if (result == Canary::AckResult::kRefused) {
      QueueRollBack(session.job, job,
                    absl::StrFormat("session %d refused version %d: %s", id, version, error));
      return;
    }
    session.config = canary.to_config();
    session.config_version = version;
    if (result != Canary::AckResult::kWatchStarted) return;
    if (canary.pushed_at()) job.review = {canary.decision_id(), *canary.pushed_at()};
    if (AutotuneDecision* d = job.FindDecision(canary.decision_id())) {
      d->trigger_to_ack = canary.watch_since() - d->triggered_at;
    }
  }

  void RunDecision(const AutotuneTask& task);
  // The first pass of a job whose recorded session started on `instead`'s
  // replacement for its own config: ReviewPrior on the window `in` (run
  // under `running`, the replacement), recorded as a start_review
  // decision. True when the job went back to its own config, which ends
  // the pass; false: the pass goes on to its decision.
  bool ReviewStart(const AutotuneTask& task, const AutotuneSession::Instead& instead,
                   const DecisionInputs& in, const RunningConfig& running);
  void Promote(const AutotuneTask& task);
  void Review(const AutotuneTask& task);
  // Keeps or rolls back a push on the canary's events after it (see
  // AutotuneOptions::rollback_margin).
  void Judge(const AutotuneTask& task);
  // Queues Judge when the window holds events after the push, and returns
  // whether it did.
  bool QueueJudge(const JobKey& name, AutotuneJob& job, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pushed config replayed on the events the canary ran after the push:
  // the standing prediction (Canary::standing) when it covers more of what
  // the job requested.
  void Repredict(const AutotuneTask& task);
  // Queues Repredict for a canary under watch (no decision runs then:
  // Enqueue waits for the push to be applied) that asks for it
  // (Canary::WantsReprediction). Once applied, a larger request or growth
  // decides again, and a decision that keeps the config stands.
  void MaybeRepredict(const JobKey& name, AutotuneJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the review of `job`'s last push (AutotuneJob::review) on the window of
  // its recorded session, as it is now.
  void QueueReview(const JobKey& name, AutotuneJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RollBack(const AutotuneTask& task);

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

bool Autotuner::Impl::ReviewStart(const AutotuneTask& task,
                                  const AutotuneSession::Instead& instead,
                                  const DecisionInputs& in, const RunningConfig& running) {
  absl::StatusOr<AllocatorConfig> own = ParseAllocatorConfig(instead.own);
  ReplayOptions base;
  base.capacity = options_.capacity;
  base.total_memory = options_.total_memory;
  base.memory_fraction = running.memory_fraction;
  absl::StatusOr<PriorReview> review = absl::InvalidArgumentError("");
  if (own.ok()) {
    if (options_.on_replay) options_.on_replay(+1);
    review = ReviewPrior(in.trace, *own, running.config, base);
    if (options_.on_replay) options_.on_replay(-1);
  } else {
    review = own.status();
  }
  const bool back = review.ok() && review->return_to_own;
  AutotuneDecision rec;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (AutotuneSession* session = jobs_.FindSession(job.recorded)) session->instead.reset();
    rec.id = next_decision_id_++;
    rec.triggered_at = task.triggered_at;
    rec.at = Now();
    rec.job = task.job.job;
    rec.tenant = task.job.tenant;
    rec.trigger = AutotuneTrigger::kStartReview;
    // Read as a push: kept, from staying (its own config) to the start it
    // runs, which the job then learns; rolled back, from that start to its
    // own, which it forgets.
    const std::string start = FormatAllocatorConfig(running.config);
    rec.from_config = start;
    rec.window_events = in.trace.events.size();
    rec.sessions = {job.recorded};
    if (review.ok()) {
      // Staying is the job's own config; the "switch" is what it started on.
      rec.predicted_peak_current = review->own_peak;
      rec.predicted_peak_switched = review->prior_peak;
      rec.predicted_saving = review->own_peak - review->prior_peak;
    }
    rec.result = back ? AutotuneResult::kRolledBack
                 : review.ok() ? AutotuneResult::kKept
                               : AutotuneResult::kSkipped;
    if (back) {
      rec.to_config = instead.own;
    } else if (review.ok()) {
      rec.from_config = instead.own;
      rec.to_config = start;
    }
    rec.why = absl::StrCat(instead.why, "; ",
                           review.ok() ? review->why
                                       : absl::StrCat("its review could not replay the window: ",
                                                      review.status().message()));
    if (back) {
      job.queued = false;
      job.queued_id = 0;
      job.first_pass_done = true;
      job.cooldown_until = Now() + options_.cooldown;
      job.settled_need = review->own_peak;
    }
    job.Record(rec, options_.history_per_job);
  }
  if (back) {
    absl::StatusOr<uint64_t> version = actions_->SetJobConfig(
        task.job, instead.own,
        absl::StrFormat("autotune decision %d (start_review): back to the job's own config, "
                        "which peaks at %s on its events against %s under %s",
                        rec.id, GiB(review->own_peak), GiB(review->prior_peak), rec.from_config),
        static_cast<uint64_t>(review->own_peak));
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (AutotuneDecision* stored = job.FindDecision(rec.id)) {
      if (version.ok()) {
        stored->version = *version;
        // Its sessions run their own config once they ACK it.
        for (SessionId id : job.sessions) {
          if (AutotuneSession* session = jobs_.FindSession(id)) {
            session->handed = AutotuneSession::HandedConfig{.version = *version,
                                                            .config = instead.own};
          }
        }
      } else {
        absl::StrAppend(&stored->why, "; going back failed: ", version.status().message());
      }
      rec = *stored;
    }
  }
  actions_->OnDecision(rec);
  return back;
}

void Autotuner::Impl::RunDecision(const AutotuneTask& task) {
  RunningConfig running;
  JobPolicy policy;
  std::string skip_why;
  bool full = false;
  bool marks_steps = false;  // its client marks them (none: no optimizer)
  DecisionInputs in;
  DecideOptions decide = DecideOptionsFor(options_);
  SessionId recorded = 0;
  std::optional<AutotuneSession::Instead> instead;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (jobs_.ModeOf(job) == AutotuneMode::kOff || job.window == nullptr) {
      job.queued = false;
      job.queued_id = 0;
      return;
    }
    policy = jobs_.PolicyOf(job);
    const AutotuneSession& session = *jobs_.FindSession(job.recorded);
    skip_why = SkipReason(*job.window, session.config, options_.max_lost_fraction, running);
    full = job.window->size() >= options_.window_events;
    // A first pass nobody asked an id for waits quietly for a clean window.
    if (task.first_pass && !skip_why.empty() && job.queued_id == 0) {
      job.queued = false;
      return;
    }
    marks_steps = session.marks_steps;
    recorded = job.recorded;
    if (task.first_pass) instead = session.instead;
    // A first pass's window holds the job's stream from where its peak
    // counts from: what the replay of staying is measured against.
    if (task.first_pass && session.reserved_peak > 0) {
      decide.realized_peak_reserved = session.reserved_peak;
    }
    decide.features = job.features;
    in = ReadDecisionInputs(*job.window, ForGrowth(task.trigger), task.first_pass,
                            decide.min_events, options_.first_pass_min_events);
  }
  // Found once: the first pass's gate and Decide's switch point use it.
  std::optional<std::optional<uint64_t>> step;
  // The prediction must cover the largest request: an aperiodic job's, and
  // whatever grew.
  bool cover_largest = ForGrowth(task.trigger);
  bool aperiodic = false;
  if (task.first_pass && !in.marked && !full && skip_why.empty()) {
    // With no training step by aperiodic_after_events, the job is aperiodic:
    // decided on once its largest request so far has peaked (a model still
    // being built has not).
    const FirstPassStep found = FindFirstPassStep(in.trace, marks_steps);
    step = found.step;
    if (!found.periodic) {
      aperiodic = in.trace.events.size() >= options_.aperiodic_after_events;
      absl::MutexLock lock(&mu_);
      AutotuneJob& job = jobs_.Job(task.job);
      if (job.queued_id == 0 && !(aperiodic && in.largest_peaked)) {
        job.queued = false;
        return;
      }
      if (aperiodic) step = std::optional<uint64_t>();
      cover_largest = cover_largest || aperiodic;
    }
  }

  // Reviewed once the session runs what it was started on instead of its
  // own (a config handed at registration counts from its ACK).
  if (instead.has_value() && skip_why.empty() &&
      FormatAllocatorConfig(running.config) != instead->own &&
      ReviewStart(task, *instead, in, running)) {
    return;
  }
  actions_->OnRun(task.job.job);
  Decision d;
  if (skip_why.empty()) {
    decide.device_room = actions_->DeviceRoom(recorded);
    d = DecideOnInputs(in, running, policy, decide, step, cover_largest);
    if (aperiodic) d.why = AperiodicWhy(marks_steps, d.why);
  } else {
    d.why = skip_why;
  }

  AutotuneDecision rec;
  AutotuneJob::Taken taken;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    rec.id = job.queued_id != 0 ? job.queued_id : next_decision_id_++;
    rec.triggered_at = task.triggered_at;
    rec.at = Now();
    rec.job = task.job.job;
    rec.tenant = task.job.tenant;
    rec.run = task.job.run;
    rec.trigger = task.trigger;
    rec.window_events = in.trace.events.size();
    taken = job.Decided(rec, d, running, in.max_requested, jobs_.ModeOf(job), options_, Now());
  }
  if (taken.pushed_update) actions_->OnDecision(*taken.pushed_update);
  actions_->OnDecision(rec);
  if (!taken.canary) return;
  const SessionId canary = *taken.canary;

  const std::string reason = absl::StrFormat(
      "autotune decision %d (%s): predicted peak %s instead of %s for steps that request at "
      "most %s (larger steps need more under both)",
      rec.id, AutotuneTriggerName(rec.trigger), GiB(rec.predicted_peak_switched),
      GiB(rec.predicted_peak_current), GiB(rec.predicted_peak_requested));
  absl::StatusOr<uint64_t> version = actions_->PushToSession(
      canary, rec.to_config, reason, static_cast<uint64_t>(rec.predicted_peak_switched));
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    AutotuneDecision* stored = job.FindDecision(rec.id);
    if (!job.acting || job.acting->decision_id() != rec.id || stored == nullptr) return;
    if (!version.ok()) {
      stored->result = AutotuneResult::kSkipped;
      absl::StrAppend(&stored->why, "; the push to canary session ", canary,
                      " failed: ", version.status().message());
      job.acting.reset();
    } else {
      stored->version = *version;
      for (const Canary::Ack& early : job.acting->PushAnswered(*version)) {
        AckedLocked(early.session, early.version, early.applied, early.error);
      }
    }
    notify.push_back(*stored);
  }
  Notify(notify);
}

void Autotuner::Impl::QueueReview(const JobKey& name, AutotuneJob& job) {
  uint64_t decision_id = 0;
  std::shared_ptr<PushReplayInput> input = job.TakeReview(decision_id);
  if (input == nullptr) return;
  input->policy = jobs_.PolicyOf(job);
  input->features = job.features;
  QueueTask(AutotuneTask::Kind::kReview, name, decision_id, "", std::move(input));
}

// The best the job could have had from the push on: Decide, switched where
// the push happened, over the events after it. Staying counts too (a push
// that should not have been made is judged against not making it).
void Autotuner::Impl::Review(const AutotuneTask& task) {
  const PushReplayInput& in = *task.review;
  DecideOptions decide = DecideOptionsFor(options_);
  decide.switch_event = in.switch_event;
  decide.features = in.features;
  const Decision d = ::allocd::Decide(in.trace, in.running, in.policy, decide);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    AutotuneDecision* rec = job.FindDecision(task.decision_id);
    if (rec == nullptr) return;
    if (d.predicted_peak_current <= 0) {
      absl::StrAppend(&rec->why, "; not reviewed: ", d.why);
    } else {
      rec->best_reachable_peak =
          d.predicted_peak_switched > 0
              ? std::min(d.predicted_peak_switched, d.predicted_peak_current)
              : d.predicted_peak_current;
      rec->reviewed_events = in.trace.events.size() - in.switch_event;
    }
    notify.push_back(*rec);
  }
  Notify(notify);
}

bool Autotuner::Impl::QueueJudge(const JobKey& name, AutotuneJob& job, std::string reason) {
  std::shared_ptr<PushReplayInput> input = job.CanaryEventsAfterPush();
  if (input == nullptr) return false;
  job.acting->StartJudging();
  QueueTask(AutotuneTask::Kind::kJudge, name, job.acting->decision_id(), std::move(reason),
            std::move(input));
  return true;
}

void Autotuner::Impl::MaybeRepredict(const JobKey& name, AutotuneJob& job) {
  const std::optional<RecordedStream> stream = job.Stream();
  if (!stream || !job.acting->WantsReprediction(*stream)) return;
  std::shared_ptr<PushReplayInput> input = job.CanaryEventsAfterPush();
  if (input == nullptr) return;
  job.acting->RepredictionQueued();
  QueueTask(AutotuneTask::Kind::kRepredict, name, job.acting->decision_id(), "",
            std::move(input));
}

void Autotuner::Impl::Repredict(const AutotuneTask& task) {
  const PushReplayInput& in = *task.review;
  absl::StatusOr<ReplayResult> kept = ReplayFromPush(in, /*keep=*/true, options_);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id) return;
    Canary& canary = *job.acting;
    canary.RepredictionDone();
    AutotuneDecision* d = job.FindDecision(task.decision_id);
    if (d == nullptr || !kept.ok() || !kept->after_switch) return;
    const ReplayPhase& after = *kept->after_switch;
    if (!canary.TakePrediction({after.peak_reserved, after.peak_allocated, after.peak_requested})) {
      return;
    }
    d->at_need_basis = absl::StrFormat(
        "%s replayed on the %d events the canary ran after the push (requesting at most %s)%s",
        canary.pushed_config().empty() ? "(defaults)" : canary.pushed_config(),
        in.trace.events.size() - in.switch_event, GiB(after.peak_requested),
        in.first_mark_after ? ", the cache released again at the job's first step mark after it"
                            : "");
    canary.UpdatePredictionAtNeed(d);
    notify.push_back(*d);
  }
  Notify(notify);
}

void Autotuner::Impl::Judge(const AutotuneTask& task) {
  const PushReplayInput& in = *task.review;
  Canary::Replays replays{
      .stayed = ReplayFromPush(in, /*keep=*/false, options_),
      .kept = ReplayFromPush(in, /*keep=*/true, options_),
      .rollback = PredictRollback(in.trace, in.switch_event, in.running.config, in.pushed,
                                  PushReplayBase(in, options_), options_.on_replay)};
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id ||
        job.acting->phase() != Canary::Phase::kJudging) {
      return;  // rolled back meanwhile (an OOM, a NACK) or the canary ended
    }
    AutotuneDecision* d = job.FindDecision(task.decision_id);
    Act(task.job, job,
        job.acting->Judged(replays, in.trace.events.size() - in.switch_event, task.reason, d));
    if (d != nullptr) notify.push_back(*d);
  }
  Notify(notify);
}

void Autotuner::Impl::Promote(const AutotuneTask& task) {
  std::string to_config;
  std::string reason;
  int64_t predicted = 0;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id ||
        job.acting->phase() != Canary::Phase::kPromoting) {
      return;
    }
    to_config = job.acting->to_config();
    predicted = job.acting->predicted_switched();
    reason = job.acting->PromotionReason();
  }
  absl::StatusOr<uint64_t> version =
      actions_->SetJobConfig(task.job, to_config, reason, static_cast<uint64_t>(predicted));
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id) return;
    if (!version.ok()) {
      Act(task.job, job, job.acting->PromotionFailed(std::string(version.status().message())));
      return;
    }
    AutotuneDecision* d = job.FindDecision(task.decision_id);
    job.acting->Promoted(*version, job.sessions, d);
    if (d != nullptr) {
      absl::StrAppend(&d->why, "; ", reason, "; set for the whole job");
      notify.push_back(*d);
    }
  }
  Notify(notify);
}

void Autotuner::Impl::RollBack(const AutotuneTask& task) {
  SessionId canary = 0;
  std::string rollback_config;
  bool whole_job = false;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id) return;
    canary = job.acting->canary();
    rollback_config = job.acting->rollback_config();
    whole_job = job.acting->job_version() != 0;
  }
  const std::string reason =
      absl::StrFormat("autotune decision %d rolled back: %s", task.decision_id, task.reason);
  const absl::Status status =
      whole_job ? actions_->SetJobConfig(task.job, rollback_config, reason, 0).status()
                : actions_->RollBackSession(canary, rollback_config, reason);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    if (!job.acting || job.acting->decision_id() != task.decision_id) return;
    for (SessionId s : job.sessions) {
      if (s == canary || whole_job) jobs_.FindSession(s)->config = rollback_config;
    }
    job.RolledBack(Now() + options_.cooldown);
    if (AutotuneDecision* d = job.FindDecision(task.decision_id)) {
      d->result = AutotuneResult::kRolledBack;
      absl::StrAppend(&d->why, "; rolled back: ", task.reason);
      if (!status.ok()) {
        absl::StrAppend(&d->why, " (the rollback push failed: ", status.message(), ")");
      }
      notify.push_back(*d);
    }
  }
  Notify(notify);
}

Autotuner::Autotuner(AutotuneOptions options, AutotuneActions* actions)
    : impl_(std::make_unique<Impl>(std::move(options), actions)) {}
Autotuner::~Autotuner() = default;

void Autotuner::SessionStarted(SessionId id, const std::string& job, const std::string& config,
                               uint64_t config_version, const TenantId& tenant,
                               bool marks_steps, const SessionRank& rank) {
  impl_->SessionStarted(id, job, config, config_version, tenant, marks_steps, rank);
}
void Autotuner::SessionEnded(SessionId id) { impl_->SessionEnded(id); }
void Autotuner::Features(SessionId id, const JobFeatures& features) {
  impl_->Features(id, features);
}
void Autotuner::Events(SessionId id, const std::vector<EvidenceEvent>& events,
                       uint64_t dropped_before, const AllocatorSnapshot* state_after) {
  impl_->Events(id, events, dropped_before, state_after);
}
void Autotuner::Stats(SessionId id, const std::map<std::string, int64_t>& stats,
                      uint64_t config_version) {
  impl_->Stats(id, stats, config_version);
}
void Autotuner::Oom(SessionId id, uint64_t config_version) { impl_->Oom(id, config_version); }
void Autotuner::Acked(SessionId id, uint64_t version, bool applied, const std::string& error) {
  impl_->Acked(id, version, applied, error);
}
void Autotuner::Handed(SessionId id, uint64_t version, const std::string& config) {
  impl_->Handed(id, version, config);
}
void Autotuner::StartedInstead(SessionId id, const std::string& own, const std::string& why) {
  impl_->StartedInstead(id, own, why);
}
absl::StatusOr<uint64_t> Autotuner::RunNow(const std::string& job, const TenantId& tenant) {
  return impl_->RunNow(job, tenant);
}
void Autotuner::SetPolicy(const JobKey& job, JobPolicy policy) {
  impl_->SetPolicy(job, std::move(policy));
}
std::vector<AutotuneJobStatus> Autotuner::Status() const { return impl_->Status(); }
std::vector<AutotuneDecision> Autotuner::History(const std::string& job, size_t limit) const {
  return impl_->History(job, limit);
}
void Autotuner::WaitIdle() { impl_->WaitIdle(); }

}  // namespace allocd
