// Autotuner::Impl's tasks, run by its worker one at a time with replays
// outside the lock: decisions (and a start's review), a push's review,
// judgement, reprediction, promotion and rollback, and what queues them.
#include "server/autotune/autotuner_impl.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
#include "server/autotune/learn_check.h"
#include "server/autotune/rollback_model.h"
#include "server/autotune/start_config.h"
#include "server/autotune/task_queue.h"

namespace allocd {

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
    CountedReplay counted(options_.on_replay);
    review = ReviewPrior(in.trace, *own, running.config, base);
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
    rec.decided_on = job.recorded;
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
  bool unmarked = false;     // ... and it has marked none
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
    unmarked = marks_steps && job.window->steps_marked() == 0;
    // An unmarked job's prediction covers its largest request whatever
    // started the decision, as an aperiodic first pass's does.
    in = ReadDecisionInputs(*job.window, ForGrowth(task.trigger) || unmarked, task.first_pass,
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

  // A client that marks its steps and marked none runs no optimizer: no
  // decision on it (a fragmentation or retry trigger before its first pass,
  // a first pass on a full window) takes a repeat in its stream for a step.
  if (unmarked && !step.has_value()) {
    step = std::optional<uint64_t>();
    cover_largest = true;
    aperiodic = true;
  }

  // The early push from a harmful start, when decided on no two steps the
  // job marked (a repeat found in its stream, or none: Decide knows which),
  // proposes the safe config unless another peaks clearly lower.
  if (task.trigger == AutotuneTrigger::kBadStartConfig &&
      IsHarmfulStartConfig(running.config)) {
    decide.preferred = SaferStartConfig(running.config);
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
        ConfigName(canary.pushed_config()),
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
  LearnCheck(task);
}

void Autotuner::Impl::LearnCheck(const AutotuneTask& task) {
  absl::StatusOr<LearnedFromPush> checked =
      absl::FailedPreconditionError("the job's window held no events to replay it on");
  if (task.learn != nullptr) {
    ReplayOptions base;
    base.capacity = options_.capacity;
    base.total_memory = options_.total_memory;
    CountedReplay counted(options_.on_replay);
    checked = CheckLearned(*task.learn, options_.min_saving, base);
  }
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    AutotuneJob& job = jobs_.Job(task.job);
    AutotuneDecision* d = job.FindDecision(task.decision_id);
    // Rolled back meanwhile: nothing to learn.
    if (d == nullptr || d->result != AutotuneResult::kPushed) return;
    if (checked.ok()) {
      d->learned = *std::move(checked);
    } else {
      d->learned = LearnedFromPush{
          .config = d->to_config,
          .why = absl::StrCat("learned ", ConfigName(d->to_config),
                              " unchecked from the start: ", checked.status().message())};
    }
    absl::StrAppend(&d->why, "; ", d->learned->why);
    notify.push_back(*d);
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

void Autotuner::Impl::QueuePromote(const JobKey& name, AutotuneJob& job) {
  tasks_.Push({.kind = AutotuneTask::Kind::kPromote,
               .job = name,
               .decision_id = job.acting->decision_id(),
               .learn = job.LearnCheckOfPush()});
}

void Autotuner::Impl::QueueRollBack(const JobKey& name, AutotuneJob& job, std::string reason,
                                    bool for_what_it_realised) {
  const int64_t requested =
      for_what_it_realised && job.window ? job.window->max_requested_bytes() : 0;
  if (!job.acting->StartRollBack(requested)) return;
  QueueTask(AutotuneTask::Kind::kRollBack, name, job.acting->decision_id(), std::move(reason));
}

void Autotuner::Impl::Act(const JobKey& name, AutotuneJob& job, Canary::Action action) {
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
      QueuePromote(name, job);
      break;
    case Canary::Next::kRollBack:
      QueueRollBack(name, job, std::move(action.reason), action.for_what_it_realised);
      break;
  }
}

}  // namespace allocd
