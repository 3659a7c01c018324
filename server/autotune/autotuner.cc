#include "server/autotune/autotuner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "proto/protocol.h"
#include "server/autotune/autotune_job.h"
#include "server/autotune/autotuner_impl.h"
#include "server/autotune/canary.h"
#include "server/autotune/decision_inputs.h"
#include "server/autotune/job_window.h"
#include "server/autotune/start_config.h"
#include "server/autotune/task_queue.h"

namespace allocd {
namespace {

constexpr char kReservedStat[] = "reserved_bytes.all.current";
constexpr char kReservedPeakStat[] = "reserved_bytes.all.peak";
constexpr char kAllocatedStat[] = "allocated_bytes.all.current";
constexpr char kAllocatedPeakStat[] = "allocated_bytes.all.peak";
constexpr char kRetriesStat[] = "num_alloc_retries";

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

void Autotuner::Impl::SessionStarted(SessionId id, const std::string& job_name,
                                     const std::string& config, uint64_t config_version,
                                     const TenantId& tenant, bool marks_steps,
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

uint64_t Autotuner::Impl::StreamReadFrom(SessionId id) const {
  absl::MutexLock lock(&mu_);
  const AutotuneSession* session = jobs_.FindSession(id);
  if (session == nullptr) return 0;  // not the autotuner's to say
  const AutotuneJob* job = jobs_.FindJob(session->job);
  if (job == nullptr) return 0;
  if (job->recorded != id) return kStreamNotRead;
  return RecordedReadFrom(*job);
}

uint64_t Autotuner::Impl::RecordedReadFrom(const AutotuneJob& job) const {
  if (jobs_.ModeOf(job) == AutotuneMode::kOff) return kStreamNotRead;
  if (!job.first_pass_done || job.settled_need <= 0 || job.acting.has_value()) return 0;
  return GrownPast(job.settled_need, options_.growth_margin);
}

void Autotuner::Impl::SetPolicy(const JobKey& key, JobPolicy policy) {
  std::vector<std::pair<SessionId, uint64_t>> demands;
  {
    absl::MutexLock lock(&mu_);
    for (const AutotuneJob* job : jobs_.SetPolicy(key, std::move(policy))) {
      demands.emplace_back(job->recorded, RecordedReadFrom(*job));
    }
  }
  for (const auto& [id, from] : demands) {
    actions_->DemandStream(id, from,
                           from == kStreamNotRead
                               ? "autotune is off for its job: nothing reads its stream"
                               : "autotune is on for its job: its stream is read");
  }
}

void Autotuner::Impl::SessionEnded(SessionId id) {
  std::vector<AutotuneDecision> notify;
  std::optional<std::pair<SessionId, uint64_t>> now_recorded;  // and what it reads of it
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.FindSession(id) == nullptr) return;
    const JobKey name = jobs_.RemoveSession(id);
    AutotuneJob& job = jobs_.Job(name);
    if (job.acting && job.CanaryEnded(id, notify)) QueuePromote(name, job);
    if (job.recorded == id) {
      QueueReview(name, job);
      job.recorded = 0;
      job.window.reset();
      if (!job.sessions.empty()) {
        jobs_.StartRecording(job, job.sessions.front());
        // A settled job reads it once it grows, as the one before.
        now_recorded.emplace(job.recorded, RecordedReadFrom(job));
      }
    }
    if (job.sessions.empty()) {
      jobs_.Ended(name, tasks_);
    }
  }
  Notify(notify);
  if (now_recorded.has_value()) {
    actions_->DemandStream(
        now_recorded->first, now_recorded->second,
        absl::StrCat("session ", id, ", whose stream its job was decided on, ended: this "
                     "one's is read from now on"));
  }
}

void Autotuner::Impl::Events(SessionId id, const std::vector<EvidenceEvent>& events,
                             uint64_t dropped_before, const AllocatorSnapshot* state_after) {
  absl::MutexLock lock(&mu_);
  const AutotuneSession* session = jobs_.FindSession(id);
  if (session == nullptr) return;
  AutotuneJob& job = jobs_.Job(session->job);
  if (job.recorded != id || job.window == nullptr) return;
  if (job.window->total_events() == 0) job.window_config = session->config;
  job.window->Add(events, dropped_before);
  // Not while a push is judged or awaits its review: both replay from the
  // push, which the restart would drop.
  if (state_after != nullptr && job.window->AddState(*state_after) && !job.acting &&
      !job.review && LosesTooMany(*job.window, options_.max_lost_fraction) &&
      job.window->RestartAtStateAfterGap()) {
    // The window starts at the state: a first pass probes it as a new one.
    job.ResetFirstPassCheck(options_, session->marks_steps);
  }
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

void Autotuner::Impl::Stats(SessionId id, const std::map<std::string, int64_t>& stats,
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

void Autotuner::Impl::Watch(const JobKey& name, AutotuneJob& job, int64_t reserved,
                            int64_t allocated, absl::Time now,
                            std::vector<AutotuneDecision>& notify) {
  AutotuneDecision* d = job.FindDecision(job.acting->decision_id());
  bool changed = false;
  Canary::Action action = job.acting->Watch(reserved, allocated, now, job.Stream(), d, changed);
  if (changed && d != nullptr) notify.push_back(*d);
  Act(name, job, std::move(action));
}

void Autotuner::Impl::Features(SessionId id, const JobFeatures& features) {
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

void Autotuner::Impl::Oom(SessionId id, uint64_t config_version) {
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

void Autotuner::Impl::AckedLocked(SessionId id, uint64_t version, bool applied,
                                  const std::string& error) {
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

void Autotuner::Impl::Handed(SessionId id, uint64_t version, const std::string& config) {
  absl::MutexLock lock(&mu_);
  if (AutotuneSession* session = jobs_.FindSession(id)) {
    session->handed = AutotuneSession::HandedConfig{.version = version, .config = config};
  }
}

void Autotuner::Impl::StartedInstead(SessionId id, const std::string& own,
                                     const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (AutotuneSession* session = jobs_.FindSession(id)) {
    session->instead = AutotuneSession::Instead{.own = own, .why = why};
  }
}

absl::StatusOr<uint64_t> Autotuner::Impl::RunNow(const std::string& job_name,
                                                 const TenantId& tenant) {
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

absl::StatusOr<uint64_t> Autotuner::Impl::RunNowLocked(const JobKey& key, AutotuneJob& job) {
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

bool Autotuner::Impl::Enqueue(const JobKey& name, AutotuneJob& job, AutotuneTrigger trigger,
                              bool first_pass) {
  const bool admin = trigger == AutotuneTrigger::kAdmin;
  const bool grew = ForGrowth(trigger);
  if (job.queued || jobs_.ModeOf(job) == AutotuneMode::kOff) return false;
  if (job.acting && job.acting->phase() != Canary::Phase::kApplied) return false;
  if (!admin && !grew && Now() < job.cooldown_until) return false;
  // A trigger of the job's own waits for a window to replay. A job whose
  // stream has not started (a learned run leaves it off until it outgrows
  // what was learned, or runs out of memory) would record a decision
  // skipped on no events, and any decision recorded ends the job's first
  // pass and starts its cooldown: the stream that follows would go
  // undecided. An admin's run is answered either way.
  if (!admin && (job.window == nullptr || job.window->size() == 0)) return false;
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

void Autotuner::Impl::Work() {
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
JobFeatures Autotuner::FeaturesOf(const TenantId& tenant, const std::string& job) const {
  return impl_->FeaturesOf(tenant, job);
}
std::vector<AutotuneJobStatus> Autotuner::Status() const { return impl_->Status(); }
std::vector<AutotuneDecision> Autotuner::History(const std::string& job, size_t limit) const {
  return impl_->History(job, limit);
}
uint64_t Autotuner::StreamReadFrom(SessionId id) const { return impl_->StreamReadFrom(id); }
void Autotuner::WaitIdle() { impl_->WaitIdle(); }

}  // namespace allocd
