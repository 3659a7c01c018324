#include "server/autotune/autotuner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "server/autotune/decider.h"
#include "allocator/trace/replay.h"
#include "server/autotune/job_window.h"
#include "server/autotune/rollback_model.h"
#include "server/autotune/step_period.h"

namespace allocd {
namespace {

// A replay that switches at the window's event number `seq`: from the
// client's newest state at or before it (its real memory there), else from
// the window's start (the state its prelude rebuilds). With the job's first
// step mark after `seq`, where its client released the cache again after a
// push (LiveSwitch::release_again_before_event).
struct SwitchTrace {
  Trace trace;
  uint64_t switch_event = 0;  // index into `trace`
  std::optional<uint64_t> first_mark_after;  // index into `trace`
};
SwitchTrace TraceSwitchingAt(const JobWindow& window, uint64_t seq) {
  const uint64_t window_start = window.total_events() - window.size();
  const std::vector<uint64_t> states = window.StateSeqs();
  auto state = std::upper_bound(states.begin(), states.end(), seq);
  SwitchTrace out;
  // The trace's first event from the window is the window's event number
  // `from`, after `lead` events that rebuild what was live then.
  uint64_t from = window_start;
  uint64_t lead = 0;
  if (state != states.begin()) {
    from = *std::prev(state);
    out.trace = window.ToTraceFromState(from);
  } else {
    out.trace = window.ToTrace();
    // ToTrace starts with what was live at the window's start (the prelude).
    lead = out.trace.events.size() - window.size();
  }
  const auto index = [from, lead](uint64_t at) { return lead + (at - from); };
  out.switch_event = index(seq);
  // A mark right at the switch is where the client released again at once
  // (nothing live at the switch was freed yet): no later one is.
  for (const uint64_t end : window.StepEnds()) {
    if (window_start + end >= seq) {
      if (window_start + end > seq) out.first_mark_after = index(window_start + end);
      break;
    }
  }
  return out;
}

// The client's state a decision switches from: the newest that leaves two of
// the job's marked steps after it, else one, and at least `min_events`
// (never one past `latest`: the prediction must cover what follows it).
// Unset: none does.
struct StateSwitch {
  uint64_t seq;                     // where the state was taken
  std::vector<uint64_t> step_ends;  // the marks after it, as indices from it
};
std::optional<StateSwitch> DecisionState(const JobWindow& window, uint64_t latest,
                                         uint64_t min_events) {
  const uint64_t window_start = window.total_events() - window.size();
  std::vector<uint64_t> ends = window.StepEnds();
  for (uint64_t& end : ends) end += window_start;
  auto from = [&](uint64_t seq) {
    StateSwitch s{seq, {}};
    for (uint64_t end : ends) {
      if (end > seq) s.step_ends.push_back(end - seq);
    }
    return s;
  };
  std::optional<StateSwitch> one_step;
  const std::vector<uint64_t> states = window.StateSeqs();
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    if (*it > latest || window.total_events() - *it < min_events) continue;
    StateSwitch s = from(*it);
    if (s.step_ends.size() >= 2) return s;
    if (s.step_ends.size() == 1 && !one_step) one_step = std::move(s);
  }
  return one_step;
}

// The newest state the client sent at or before `at` (stream position,
// JobWindow::total_events() numbering) with at least `min_events` after it,
// whatever marks follow: what a prediction that must cover from `at` on
// replays from for a job that marks no steps. The client sends one where
// its stream begins, and it holds what the job allocated before (advise()
// called once the model was built, or `allocd run`, whose stream starts
// once PyTorch first asked for memory): without it the replay lacks the
// model's weights.
std::optional<uint64_t> StateAtOrBefore(const JobWindow& window, uint64_t at,
                                        uint64_t min_events) {
  const std::vector<uint64_t> states = window.StateSeqs();
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    if (*it <= at && window.total_events() - *it >= min_events) return *it;
  }
  return std::nullopt;
}

constexpr char kReservedStat[] = "reserved_bytes.all.current";
constexpr char kAllocatedStat[] = "allocated_bytes.all.current";
constexpr char kAllocatedPeakStat[] = "allocated_bytes.all.peak";
constexpr char kRetriesStat[] = "num_alloc_retries";
// A max_split_size_mb this small stops the cache from splitting most large
// blocks: the guides' 64 and 128 (tuner.h's GuideConfigs), which cost
// llama_lora several times its memory.
constexpr size_t kBadStartMaxSplit = 128 * kMiB;
// Steps a job that marks them runs under a push before the push is judged
// on what it realised (Impl::SettledUnderPush).
constexpr uint64_t kStepsBeforeJudging = 2;
// How much more than the standing prediction covered a canary under watch
// requests before its pushed config is replayed on its own events
// (Impl::MaybeRepredict): the bound on a prediction's error. Scaled
// linearly past what a replay covered, expandable segments reserve more per
// byte of a larger step than per byte of the window's (on the H100
// llama_lora's 10% more requested cost 16% more reserved, generation's 75%
// more cost 85% more).
constexpr double kRepredictGrowth = 0.05;
// Job::rolled_back's mark of a config never proposed again.
constexpr int64_t kRolledBackForGood = std::numeric_limits<int64_t>::max();

// A start config known to cost memory (the guides' small max_split_size_mb
// without expandable segments, which would not split): decided on at the
// job's first steps.
bool IsHarmfulStart(const AllocatorConfig& config) {
  return config.max_split_size <= kBadStartMaxSplit && !config.expandable_segments;
}

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

// How far FindStepPeriod follows a stream whose steps are not all the same
// length: a multi-scale ResNet-50's differ by up to 12 events (cuDNN's
// workspaces depend on the shape; on the H100 no step was found without
// this, so a job that lost no events was never decided on), and each event
// an advisor loses takes up to three with it (an allocation, then its two
// frees, which the window drops as unmatched). At most 32, past which a
// period check would cost more than finding the step is worth.
constexpr size_t kStepShift = 32;

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
        default_policy_(options_.default_policy),
        memory_(options_.memory),
        worker_([this] { Work(); }) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    worker_.join();
  }

  void SessionStarted(SessionId id, const std::string& job_name, const std::string& config,
                      uint64_t config_version, const TenantId& tenant, bool marks_steps) {
    absl::MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      // Declared again: only what it runs can have changed.
      it->second.config = config;
      it->second.config_version = config_version;
      return;
    }
    const JobKey key{.tenant = tenant, .job = job_name};
    Job& job = jobs_[key];
    Session& session = sessions_[id] = Session{key, next_order_++, config, config_version};
    session.marks_steps = marks_steps;
    job.sessions.push_back(id);
    if (job.recorded == 0) StartRecording(job, id);
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
    if (parsed.ok() && IsHarmfulStart(*parsed)) {
      job.first_trigger = AutotuneTrigger::kBadStartConfig;
    }
  }

  void SessionEnded(SessionId id) {
    std::vector<AutotuneDecision> notify;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) return;
      const JobKey name = it->second.job;
      Job& job = jobs_[name];
      sessions_.erase(it);
      std::erase(job.sessions, id);
      const bool judged_kept = job.acting && job.acting->judged_realized > 0;
      if (job.acting && job.acting->canary == id && job.acting->phase == Phase::kCanaryWatching &&
          (judged_kept ||
           WatchedWithinMargin(*job.acting, options_.first_pass_min_events))) {
        // Judged on the same events and kept, or watched over whole steps
        // without leaving the margin, the push is what the job's next
        // sessions start with (a job of one session, the most common, may
        // not outlive its canary's watch: on the H200 a ViT ran its 100
        // steps in less than the 10 s after its push, and nothing was
        // learned).
        if (AutotuneDecision* d = FindDecision(job, job.acting->decision_id)) {
          absl::StrAppend(&d->why, "; the canary session ended before its watch did, ",
                          judged_kept ? "after its judgement kept the push"
                                      : "its watch having found it within the margin");
        }
        job.acting->phase = Phase::kPromoting;
        tasks_.push_back(Task{TaskKind::kPromote, name, {}, job.acting->decision_id, false, ""});
      } else if (job.acting && job.acting->canary == id && !Applied(*job.acting)) {
        // Nothing was pushed beyond the canary, and nothing more will be.
        if (AutotuneDecision* d = FindDecision(job, job.acting->decision_id)) {
          absl::StrAppend(&d->why, "; the canary session ended before its watch did: "
                                   "the job's other sessions were left alone");
          notify.push_back(*d);
        }
        job.acting.reset();
      }
      if (job.recorded == id) {
        QueueReview(name, job);
        job.recorded = 0;
        job.window.reset();
        if (!job.sessions.empty()) StartRecording(job, job.sessions.front());
      }
      if (job.sessions.empty()) {
        ended_jobs_.push_back(name);
        DropOldEndedJobs();
      }
    }
    Notify(notify);
  }

  void Events(SessionId id, const std::vector<EvidenceEvent>& events,
              uint64_t dropped_before, const AllocatorSnapshot* state_after) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Job& job = jobs_[it->second.job];
    if (job.recorded != id || job.window == nullptr) return;
    job.window->Add(events, dropped_before);
    if (state_after != nullptr) job.window->AddState(*state_after);
    if (job.acting && job.acting->canary == id) {
      job.acting->realized_requested =
          std::max(job.acting->realized_requested, job.window->peak_held_requested_bytes());
      UpdatePredictionAtNeed(job);
      MaybeRepredict(it->second.job, job);
    }
    // A long job's push is reviewed on half a window of events after it,
    // before the window lets it go.
    if (job.review && job.window->total_events() - job.review->second >= options_.window_events / 2) {
      QueueReview(it->second.job, job);
    }
    const size_t size = job.window->size();
    if (job.first_pass_done) {
      // A request larger than any the last decision saw, once it has
      // peaked (the stream moved on past it).
      const JobWindow& w = *job.window;
      if (job.decided_requested > 0 &&
          static_cast<double>(w.max_requested_bytes()) >
              (1.0 + options_.growth_margin) * static_cast<double>(job.decided_requested) &&
          w.total_events() - w.max_requested_at() >= options_.first_pass_min_events) {
        Enqueue(it->second.job, job, AutotuneTrigger::kLargerRequest, false);
      }
    } else if (job.window->steps_marked() > 0) {
      // The job marks its steps: decided on once it has marked enough, on
      // no fewer events than any run decides on.
      if (job.window->steps_marked() >= FirstPassMarks(job) &&
          size >= std::min(options_.first_pass_min_events, options_.window_events)) {
        Enqueue(it->second.job, job, job.first_trigger, /*first_pass=*/true);
      }
    } else if (size >= job.next_first_pass_check) {
      // Probed on the worker (finding the step is not for this thread);
      // the next probe waits for half as many events again, or a full
      // window. (Twice as many let a job whose first look fell where it
      // rebuilt its model, 300k events in, wait for 600k, where it did so
      // again: a restarted llama_lora replay was never decided on.)
      if (Enqueue(it->second.job, job, job.first_trigger, /*first_pass=*/true)) {
        job.next_first_pass_check = std::min(size + size / 2, options_.window_events);
      }
    }
  }

  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version) {
    std::vector<AutotuneDecision> notify;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it == sessions_.end()) return;
      Session& session = it->second;
      Job& job = jobs_[session.job];
      if (ModeOf(job) == AutotuneMode::kOff) return;
      const absl::Time now = Now();
      const int64_t reserved = StatOr(stats, kReservedStat, 0);
      const int64_t allocated = StatOr(stats, kAllocatedStat, 0);
      const int64_t retries = StatOr(stats, kRetriesStat, session.retries);

      if (job.acting && RunsPushedVersion(*job.acting, id, config_version)) {
        Watch(session.job, job, reserved,
              std::max(allocated, StatOr(stats, kAllocatedPeakStat, 0)), now, notify);
      }
      if (retries > session.retries) {
        Enqueue(session.job, job, AutotuneTrigger::kAllocRetry, false);
      }
      // Reserved past what the config the job settled on needs: its steps
      // grew since the last decision.
      const double grown = (1.0 + options_.growth_margin);
      if (job.first_pass_done && job.settled_need > 0 &&
          static_cast<double>(reserved) > grown * static_cast<double>(job.settled_need) &&
          static_cast<double>(reserved) > grown * static_cast<double>(job.growth_reserved) &&
          Enqueue(session.job, job, AutotuneTrigger::kGrowth, false)) {
        job.growth_reserved = reserved;
      }
      session.retries = retries;
      if (allocated > 0 && static_cast<double>(reserved) >
                               options_.fragmentation_ratio * static_cast<double>(allocated)) {
        if (!session.fragmented_since) {
          session.fragmented_since = now;
        } else if (now - *session.fragmented_since >= options_.fragmentation_for) {
          session.fragmented_since.reset();
          Enqueue(session.job, job, AutotuneTrigger::kFragmentation, false);
        }
      } else {
        session.fragmented_since.reset();
      }
    }
    Notify(notify);
  }

  void Oom(SessionId id, uint64_t config_version) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Job& job = jobs_[it->second.job];
    if (job.acting && RunsPushedVersion(*job.acting, id, config_version)) {
      QueueRollBack(it->second.job, job, absl::StrFormat(
          "session %d ran out of memory under the pushed version %d", id, config_version));
      return;
    }
    Enqueue(it->second.job, job, AutotuneTrigger::kOom, false);
  }

  void Acked(SessionId id, uint64_t version, bool applied, const std::string& error) {
    absl::MutexLock lock(&mu_);
    AckedLocked(id, version, applied, error);
  }

  void Handed(SessionId id, uint64_t version, const std::string& config) {
    absl::MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      it->second.handed = Session::HandedConfig{.version = version, .config = config};
    }
  }

  absl::StatusOr<uint64_t> RunNow(const std::string& job_name, const TenantId& tenant) {
    absl::MutexLock lock(&mu_);
    std::optional<absl::StatusOr<uint64_t>> first;
    for (auto& [key, job] : jobs_) {
      if (key.job != job_name || (!tenant.empty() && key.tenant != tenant) ||
          job.sessions.empty()) {
        continue;
      }
      absl::StatusOr<uint64_t> id = RunNowLocked(key, job);
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
    if (key.job.empty()) {
      default_policy_ = std::move(policy);
      for (auto& [name, job] : jobs_) ApplyMode(job);
      return;
    }
    Job& job = jobs_[key];
    job.policy = std::move(policy);
    ApplyMode(job);
  }

  std::vector<AutotuneJobStatus> Status() const {
    absl::MutexLock lock(&mu_);
    std::vector<AutotuneJobStatus> out;
    for (const auto& [name, job] : jobs_) {
      AutotuneJobStatus s;
      s.job = name.job;
      s.tenant = name.tenant;
      s.policy = PolicyOf(job);
      s.sessions = job.sessions.size();
      if (job.window) {
        s.window_events = job.window->size();
        s.dropped_events = job.window->dropped_events();
        s.window_bytes = job.window->MemoryBytes();
        s.steps_marked = job.window->steps_marked();
      }
      if (auto it = sessions_.find(job.recorded); it != sessions_.end()) {
        s.marks_steps = it->second.marks_steps;
      }
      s.state = StateOf(job);
      if (!job.history.empty()) s.last = job.history.back();
      out.push_back(std::move(s));
    }
    // jobs_ is ordered by tenant: by label, then tenant.
    std::stable_sort(out.begin(), out.end(), [](const AutotuneJobStatus& a, const AutotuneJobStatus& b) {
      return a.job < b.job;
    });
    return out;
  }

  std::vector<AutotuneDecision> History(const std::string& job_name, size_t limit) const {
    absl::MutexLock lock(&mu_);
    std::vector<AutotuneDecision> out;
    for (const auto& [name, job] : jobs_) {
      if (!job_name.empty() && name.job != job_name) continue;
      out.insert(out.end(), job.history.begin(), job.history.end());
    }
    std::sort(out.begin(), out.end(),
              [](const AutotuneDecision& a, const AutotuneDecision& b) { return a.id > b.id; });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

  void WaitIdle() {
    absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::Idle));
  }

 private:
  enum class Phase { kCanaryPushed, kCanaryWatching, kPromoting, kApplied, kJudging, kRollingBack };

  struct Session {
    JobKey job;  // its tenant's memory holds the job's window
    uint64_t order = 0;
    std::string config;  // what it runs
    uint64_t config_version = 0;
    // Pushed at registration, not ACKed yet (Handed).
    struct HandedConfig {
      uint64_t version = 0;
      std::string config;
    };
    std::optional<HandedConfig> handed;
    int64_t retries = 0;
    std::optional<absl::Time> fragmented_since;
    bool marks_steps = false;  // its client marks optimizer steps
  };

  // A proposal being applied: canary, watch, the whole job.
  struct Acting {
    uint64_t decision_id = 0;
    Phase phase = Phase::kCanaryPushed;
    SessionId canary = 0;
    std::string to_config;
    // Pushed to roll back: gives back exactly what the job ran.
    std::string rollback_config;
    uint64_t canary_version = 0;
    // The canary's answer when it came before PushToSession returned.
    std::optional<std::pair<uint64_t, std::string>> early_nack;
    std::optional<uint64_t> early_ack;
    uint64_t job_version = 0;
    absl::Time watch_since;
    int64_t predicted_current = 0;
    int64_t predicted_switched = 0;
    int64_t predicted_allocated = 0;
    int64_t predicted_requested = 0;
    // The newest prediction for the pushed config (see
    // AutotuneDecision::predicted_peak_at_need): the push's own until a
    // replay of the canary's events after the push (Repredict) or a later
    // decision that kept the config covers more of what the job requests.
    struct Prediction {
      int64_t reserved = 0;
      int64_t allocated = 0;
      int64_t requested = 0;
    };
    Prediction standing;
    bool repredicting = false;  // a Repredict task is queued or running
    // What the canary had requested when the last Repredict was queued.
    int64_t repredicted_on = 0;
    int64_t realized_peak = -1;
    int64_t realized_allocated = 0;  // PyTorch's peak in the stats reports
    // What the canary held requested since the push, as a replay from its
    // state counts it (JobWindow::peak_held_requested_bytes; 0: none yet).
    int64_t realized_requested = 0;
    // Where the canary's ACK fell in the recorded stream
    // (JobWindow::total_events() then), when the canary is recorded.
    std::optional<uint64_t> pushed_at;
    // The canary's step marks then (JobWindow::steps_marked()).
    uint64_t marks_at_push = 0;
    std::string pushed_config;  // canonical: what the canary holds after the push
    // The phase a judgement interrupted, and the realised peak it kept the
    // push at (0: never judged).
    Phase judged_from = Phase::kCanaryWatching;
    int64_t judged_realized = 0;
    // The recorded stream's length (JobWindow::total_events()) below which
    // a judgement that found the realised peak unexplained by the events
    // waits (0: none waits).
    uint64_t judge_after_events = 0;
    // The recorded stream's length (JobWindow::total_events()) at the last
    // stats report the watch found within the rollback margin (0: none).
    uint64_t within_margin_at = 0;
    // What the job had requested at most (JobWindow::max_requested_bytes())
    // when a judgement on its events rolled the push back; 0 when a
    // rollback is for good (a NACK, an OOM, a failed push).
    int64_t rolled_back_on_requested = 0;
  };

  struct Job {
    std::optional<JobPolicy> policy;
    std::vector<SessionId> sessions;  // oldest first
    // The session whose events the window holds: one session's stream is
    // decided on, never a merge of several.
    SessionId recorded = 0;
    std::unique_ptr<JobWindow> window;
    AutotuneTrigger first_trigger = AutotuneTrigger::kFirstPass;
    bool first_pass_done = false;
    size_t next_first_pass_check = 0;
    bool queued = false;  // a run is queued or running
    uint64_t queued_id = 0;
    absl::Time cooldown_until = absl::InfinitePast();
    std::optional<Acting> acting;
    std::deque<AutotuneDecision> history;  // oldest first
    // A push the canary ACKed while its events were recorded: where in the
    // window's stream it happened (JobWindow::total_events() then), for the
    // review when that session ends or half a window after the push.
    std::optional<std::pair<uint64_t, uint64_t>> review;  // (decision id, event)
    // Configs rolled back, each with the most the job had requested when
    // its judgement rolled it back (kRolledBackForGood: a NACK, an OOM, a
    // failed push): that evidence covered no larger request, so the
    // config is proposed again once the job requests more than that by
    // growth_margin, never when it was rolled back for good.
    std::map<std::string, int64_t> rolled_back;
    // The most the window had requested at the last decision: a larger
    // request decides again.
    int64_t decided_requested = 0;
    // What the last decision predicted the config the job runs since then
    // needs (0: none), and the reserved that last triggered a growth run.
    int64_t settled_need = 0;
    int64_t growth_reserved = 0;
  };

  enum class TaskKind { kDecide, kPromote, kRollBack, kReview, kJudge, kRepredict };
  // kReview, kJudge and kRepredict: the canary's window, the push's index in
  // it, what it ran, and (kJudge, kRepredict) what it was pushed.
  struct ReviewInput {
    Trace trace;
    uint64_t switch_event = 0;
    std::optional<uint64_t> first_mark_after;  // SwitchTrace's
    RunningConfig running;
    JobPolicy policy;
    AllocatorConfig pushed;
  };
  // `window` switched at `pushed_at` from `from`, which it runs before.
  static std::shared_ptr<ReviewInput> SwitchedAtPush(const JobWindow& window, uint64_t pushed_at,
                                                     const AllocatorConfig& from) {
    auto input = std::make_shared<ReviewInput>();
    SwitchTrace at_push = TraceSwitchingAt(window, pushed_at);
    input->trace = std::move(at_push.trace);
    input->switch_event = at_push.switch_event;
    input->first_mark_after = at_push.first_mark_after;
    input->running.config = from;
    // What the job ran, as RunDecision reads it (the decision's own
    // memory_fraction is the one it proposed).
    if (from.per_process_memory_fraction < 1.0) {
      input->running.memory_fraction = from.per_process_memory_fraction;
    }
    return input;
  }
  // What a replay of `in` runs under.
  ReplayOptions ReplayBase(const ReviewInput& in) const {
    ReplayOptions base;
    base.capacity = options_.capacity;
    base.total_memory = options_.total_memory;
    base.memory_fraction = in.running.memory_fraction;
    return base;
  }
  struct Task {
    TaskKind kind;
    JobKey job;
    // kDecide (which records under Job::queued_id)
    AutotuneTrigger trigger = AutotuneTrigger::kFirstPass;
    uint64_t decision_id = 0;  // kPromote, kRollBack, kReview
    bool first_pass = false;  // decide only once the window ends in steps
    std::string reason;       // kRollBack
    absl::Time triggered_at;  // kDecide
    std::shared_ptr<const ReviewInput> review;  // kReview, kJudge, kRepredict
  };

  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }

  JobPolicy PolicyOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return job.policy.value_or(default_policy_);
  }
  AutotuneMode ModeOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return PolicyOf(job).mode;
  }

  AutotuneJobState StateOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ModeOf(job) == AutotuneMode::kOff) return AutotuneJobState::kOff;
    if (job.queued) return AutotuneJobState::kDeciding;
    if (job.acting) {
      return Applied(*job.acting) ? AutotuneJobState::kApplied : AutotuneJobState::kCanary;
    }
    return AutotuneJobState::kWatching;
  }

  // Why a proposal of `config` is not pushed, as a "; ..." clause of the
  // decision's why (nullopt: it may be), when the job has requested at most
  // `requested`: see Job::rolled_back.
  std::optional<std::string> NotProposedAgain(const Job& job, const std::string& config,
                                              int64_t requested) const {
    auto it = job.rolled_back.find(config);
    if (it == job.rolled_back.end()) return std::nullopt;
    if (it->second == kRolledBackForGood) {
      return "; it was rolled back before, so it is not pushed again";
    }
    const auto needed = static_cast<int64_t>((1.0 + options_.growth_margin) *
                                             static_cast<double>(it->second));
    if (requested > needed) return std::nullopt;
    return absl::StrFormat(
        "; it was rolled back before, judged on what the job requested then (at most %s), so "
        "it is pushed again only once the job requests more than %s (so far %s)",
        GiB(it->second), GiB(needed), GiB(requested));
  }

  // Step marks a marked job's first pass waits for: a job on a harmful
  // config is decided on after its first whole step.
  size_t FirstPassMarks(const Job& job) const {
    return job.first_trigger == AutotuneTrigger::kBadStartConfig
               ? 2
               : std::max<size_t>(2, options_.first_pass_steps);
  }

  void StartRecording(Job& job, SessionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.recorded = id;
    job.window.reset();
    if (ModeOf(job) != AutotuneMode::kOff) {
      job.window = std::make_unique<JobWindow>(
          options_.window_events, memory_.Open(sessions_.at(id).job.tenant, sessions_.at(id).job.job));
    }
    // A job whose client marks steps and has marked none is aperiodic only
    // after aperiodic_after_events: no probe of its stream before then.
    job.next_first_pass_check =
        std::min(sessions_.at(id).marks_steps ? options_.aperiodic_after_events
                                              : options_.first_pass_min_events,
                 options_.window_events);
  }

  // `off` keeps no window; leaving it starts one on the recorded session.
  void ApplyMode(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ModeOf(job) == AutotuneMode::kOff) {
      job.window.reset();
    } else if (job.window == nullptr && job.recorded != 0) {
      StartRecording(job, job.recorded);
    }
  }

  // Past options_.ended_jobs_kept ended jobs, the oldest go, unless a
  // session came back or something still refers to them.
  void DropOldEndedJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (ended_jobs_.size() > options_.ended_jobs_kept) {
      const JobKey key = std::move(ended_jobs_.front());
      ended_jobs_.pop_front();
      auto it = jobs_.find(key);
      // Gone, live again, or ended again later (dropped from there).
      if (it == jobs_.end() || !it->second.sessions.empty() ||
          std::find(ended_jobs_.begin(), ended_jobs_.end(), key) != ended_jobs_.end()) {
        continue;
      }
      const Job& job = it->second;
      // A push still watched, being promoted or rolled back, or a task
      // still to run for it, is seen through first: the job is looked at
      // again when the next one ends. One whose push was applied is history
      // like any other (its learned config, kept by the daemon, stays).
      if ((job.acting && !Applied(*job.acting)) || job.review || job.queued ||
          std::any_of(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.job == key; })) {
        ended_jobs_.push_back(key);
        return;
      }
      // Its policy goes too: the daemon sets it again when a session of
      // the job registers.
      jobs_.erase(it);
    }
  }

  // Set for the whole job (a judgement does not change that).
  static bool Applied(const Acting& acting) {
    return acting.phase == Phase::kApplied ||
           (acting.phase == Phase::kJudging && acting.judged_from == Phase::kApplied);
  }

  static bool RunsPushedVersion(const Acting& acting, SessionId id, uint64_t version) {
    return (id == acting.canary && version == acting.canary_version && version != 0) ||
           (version == acting.job_version && version != 0);
  }

  // RunNow for one job with a session.
  absl::StatusOr<uint64_t> RunNowLocked(const JobKey& key, Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ModeOf(job) == AutotuneMode::kOff) {
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
                       AutotuneJobStateName(StateOf(job)), ": try again once that is over"));
    }
    return job.queued_id;
  }

  // Queues a run unless one is queued or running, the job is off or in a
  // canary, or (except for an admin's run and a job that grew) it ran
  // within the cooldown.
  bool Enqueue(const JobKey& name, Job& job, AutotuneTrigger trigger, bool first_pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool admin = trigger == AutotuneTrigger::kAdmin;
    const bool grew = ForGrowth(trigger);
    if (job.queued || ModeOf(job) == AutotuneMode::kOff) return false;
    if (job.acting && job.acting->phase != Phase::kApplied) return false;
    if (!admin && !grew && Now() < job.cooldown_until) return false;
    job.queued = true;
    // An admin's run is told its id now; others get one when they record.
    job.queued_id = admin ? next_decision_id_++ : 0;
    tasks_.push_back(Task{TaskKind::kDecide, name, trigger, 0, first_pass, "", Now()});
    return true;
  }

  // Why a push is rolled back: what the job realised under it (then the
  // config may be proposed again on larger requests), or for good (a NACK,
  // an OOM, a failed push).
  enum class RollBackFor { kGood, kWhatItRealised };

  void QueueRollBack(const JobKey& name, Job& job, std::string reason,
                     RollBackFor why = RollBackFor::kGood) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.acting->phase == Phase::kRollingBack) return;
    job.acting->phase = Phase::kRollingBack;
    job.acting->rolled_back_on_requested =
        (why == RollBackFor::kWhatItRealised && job.window) ? job.window->max_requested_bytes() : 0;
    tasks_.push_back(Task{TaskKind::kRollBack, name, {}, job.acting->decision_id, false,
                          std::move(reason)});
  }

  // A stats report of a session under the pushed version: the realised
  // peak, the rollback margin, and the end of the canary's watch.
  // `allocated`: the most the session allocated since its last report, as
  // far as it knows (PyTorch's peak, which the job may reset, or the current).
  void Watch(const JobKey& name, Job& job, int64_t reserved, int64_t allocated,
             absl::Time now, std::vector<AutotuneDecision>& notify)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Acting& acting = *job.acting;
    if (acting.phase == Phase::kRollingBack || acting.phase == Phase::kCanaryPushed) return;
    acting.realized_allocated = std::max(acting.realized_allocated, allocated);
    AutotuneDecision* d = FindDecision(job, acting.decision_id);
    bool changed = UpdatePredictionAtNeed(job);
    if (reserved > acting.realized_peak) {
      acting.realized_peak = reserved;
      if (d != nullptr) {
        d->realized_peak = reserved;
        d->realized_saving = acting.predicted_current - reserved;
        changed = true;
      }
    }
    if (changed && d != nullptr) notify.push_back(*d);
    if (acting.phase == Phase::kJudging) return;
    const double growth = Growth(acting);
    const double expected = static_cast<double>(acting.predicted_switched) * growth;
    const double staying = static_cast<double>(acting.predicted_current) * growth;
    const double realized = static_cast<double>(acting.realized_peak);
    if (SettledUnderPush(job, acting) &&
        realized > expected * (1.0 + options_.rollback_margin) &&
        realized > (expected + staying) / 2 &&
        realized > static_cast<double>(acting.judged_realized) * (1.0 + options_.rollback_margin)) {
      std::string reason = absl::StrFormat(
          "the realised peak %s is above the predicted %s by more than %.0f%%, and "
          "nearer to what staying was predicted to cost%s",
          GiB(acting.realized_peak), GiB(static_cast<int64_t>(expected)),
          100 * options_.rollback_margin,
          growth > 1.0 ? absl::StrFormat(" (%s predicted for the window, scaled by the job "
                                         "allocating %.2fx what it did there)",
                                         GiB(acting.predicted_switched), growth)
                       : std::string());
      // A judgement that found the events short of the realised peak
      // waits for more of them; meanwhile the push is not promoted.
      if (job.window != nullptr && job.window->total_events() < acting.judge_after_events) return;
      if (!QueueJudge(name, job, reason)) {
        QueueRollBack(name, job,
                      absl::StrCat(reason, " (the canary's events after the push are not "
                                           "recorded, so staying could not be replayed on them)"),
                      RollBackFor::kWhatItRealised);
      }
      return;
    }
    if (job.window != nullptr && job.recorded == acting.canary && SettledUnderPush(job, acting)) {
      acting.within_margin_at = job.window->total_events();
    }
    if (acting.phase == Phase::kCanaryWatching && now - acting.watch_since >= options_.canary_window) {
      acting.phase = Phase::kPromoting;
      tasks_.push_back(Task{TaskKind::kPromote, name, {}, acting.decision_id, false, ""});
    }
  }

  // Whether a push can be judged on what the job realised: for a job that
  // marks its steps, once the canary has marked kStepsBeforeJudging steps
  // under it. The first step after a push pays for moving the job's memory
  // over (the old config's segments still held beside the new one's), and
  // a realised peak can reach the daemon before the events it came from:
  // judged then, a push that saves memory was rolled back blind (on the
  // H200, ResNet-50 from defaults at 0.1 s telemetry rounds: rolled back
  // 0.6 s after its ACK, then 31% above staying).
  static bool SettledUnderPush(const Job& job, const Acting& acting) {
    if (job.window == nullptr || job.recorded != acting.canary || !acting.pushed_at ||
        job.window->steps_marked() == 0) {
      return true;
    }
    return job.window->steps_marked() >= acting.marks_at_push + kStepsBeforeJudging;
  }

  // Whether a stats report of the canary found the push within the
  // rollback margin once the steps a judgement waits for had run
  // (SettledUnderPush), after the events a waiting judgement asked for, and
  // at least as many recorded events after the push as a first pass decides
  // on. (Watch judges a push the moment a report leaves the margin.)
  static bool WatchedWithinMargin(const Acting& acting, size_t min_events) {
    return acting.pushed_at && acting.within_margin_at >= acting.judge_after_events &&
           acting.within_margin_at >= *acting.pushed_at + min_events;
  }

  // How much more the job needs since the push than in the window's events
  // after the switch point (at least 1): on the canary's own stream once
  // it sent events after the push (exact, and no job resets it), else on
  // PyTorch's allocated peak in the stats reports. (A varying-shape job on
  // an H100 that reset that peak every step showed little growth there
  // while its later steps needed far more than the window's: its push was
  // rolled back at 21.19 GiB realised against 8.90 predicted, where staying
  // went on to cost it 69.8.)
  static double Growth(const Acting& acting) {
    return Growth(acting, acting.predicted_requested, acting.predicted_allocated);
  }
  // The same beyond what a prediction covered.
  static double Growth(const Acting& acting, int64_t predicted_requested,
                       int64_t predicted_allocated) {
    const auto ratio = [](int64_t realized, int64_t predicted) {
      return std::max(1.0, static_cast<double>(realized) / static_cast<double>(predicted));
    };
    if (acting.realized_requested > 0 && predicted_requested > 0) {
      return ratio(acting.realized_requested, predicted_requested);
    }
    return predicted_allocated > 0 ? ratio(acting.realized_allocated, predicted_allocated) : 1.0;
  }

  // Keeps the pushed decision's prediction for the steps the job really ran
  // (AutotuneDecision::predicted_peak_at_need) current with what the job
  // needed since the push; true when it changed.
  bool UpdatePredictionAtNeed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Acting& acting = *job.acting;
    AutotuneDecision* d = FindDecision(job, acting.decision_id);
    const Acting::Prediction& standing = acting.standing;
    if (d == nullptr || standing.reserved <= 0) return false;
    const auto at_need = static_cast<int64_t>(
        static_cast<double>(standing.reserved) *
        Growth(acting, standing.requested, standing.allocated));
    const std::optional<int64_t> requested =
        acting.realized_requested > 0 ? std::optional<int64_t>(acting.realized_requested)
                                      : std::nullopt;
    if (d->predicted_peak_at_need == at_need && d->realized_peak_requested == requested) {
      return false;
    }
    d->predicted_peak_at_need = at_need;
    d->realized_peak_requested = requested;
    return true;
  }

  AutotuneDecision* FindDecision(Job& job, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return const_cast<AutotuneDecision*>(FindDecision(std::as_const(job), id));
  }
  const AutotuneDecision* FindDecision(const Job& job, uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const AutotuneDecision& d : job.history) {
      if (d.id == id) return &d;
    }
    return nullptr;
  }

  void Record(Job& job, AutotuneDecision decision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.history.push_back(std::move(decision));
    while (job.history.size() > std::max<size_t>(1, options_.history_per_job)) {
      job.history.pop_front();
    }
  }

  void Notify(const std::vector<AutotuneDecision>& decisions) {
    for (const AutotuneDecision& d : decisions) actions_->OnDecision(d);
  }

  bool HasTask() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); }

  // The oldest task of the tenant whose last task started longest ago: a
  // tenant with many jobs deciding (or growing ones, which skip the
  // cooldown) delays another's next task by at most one of its own, not
  // by its whole queue. A job's tasks keep their order.
  std::deque<Task>::iterator NextTask() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto started = [&](const Task& t) {
      auto it = started_by_tenant_.find(t.job.tenant);
      return it == started_by_tenant_.end() ? uint64_t{0} : it->second;
    };
    auto next = tasks_.begin();
    for (auto it = std::next(tasks_.begin()); it != tasks_.end(); ++it) {
      if (started(*it) < started(*next)) next = it;
    }
    return next;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tasks_.empty() && !busy_; }

  void Work() {
    NiceThisThread(options_.nice);
    while (true) {
      Task task;
      {
        absl::MutexLock lock(&mu_, absl::Condition(this, &Impl::HasTask));
        if (stop_) return;
        const auto next = NextTask();
        task = std::move(*next);
        tasks_.erase(next);
        if (started_by_tenant_.size() > kTenantsRemembered) started_by_tenant_.clear();
        started_by_tenant_[task.job.tenant] = ++tasks_started_;
        busy_ = true;
      }
      switch (task.kind) {
        case TaskKind::kDecide: RunDecision(task); break;
        case TaskKind::kPromote: Promote(task); break;
        case TaskKind::kRollBack: RollBack(task); break;
        case TaskKind::kReview: Review(task); break;
        case TaskKind::kJudge: Judge(task); break;
        case TaskKind::kRepredict: Repredict(task); break;
      }
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  // Acked with the lock held (also for an answer that came before
  // PushToSession returned).
  void AckedLocked(SessionId id, uint64_t version, bool applied, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Session& session = it->second;
    if (session.handed.has_value() && session.handed->version == version) {
      if (applied) {
        session.config = session.handed->config;
        session.config_version = version;
        // A harmful start config handed a better one is no reason to
        // hurry any more.
        Job& job = jobs_[session.job];
        absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(session.config);
        if (job.first_trigger == AutotuneTrigger::kBadStartConfig && parsed.ok() &&
            !IsHarmfulStart(*parsed)) {
          job.first_trigger = AutotuneTrigger::kFirstPass;
        }
      }
      session.handed.reset();
      return;
    }
    Job& job = jobs_[session.job];
    if (!job.acting) return;
    Acting& acting = *job.acting;
    if (acting.phase == Phase::kCanaryPushed && id == acting.canary && acting.canary_version == 0) {
      if (applied) {
        acting.early_ack = version;
      } else {
        acting.early_nack = {version, error};
      }
      return;
    }
    if (!RunsPushedVersion(acting, id, version)) return;
    if (!applied) {
      QueueRollBack(session.job, job,
                    absl::StrFormat("session %d refused version %d: %s", id, version, error));
      return;
    }
    session.config = acting.to_config;
    session.config_version = version;
    if (acting.phase == Phase::kCanaryPushed && id == acting.canary) {
      acting.phase = Phase::kCanaryWatching;
      acting.watch_since = Now();
      if (job.recorded == id && job.window != nullptr) {
        job.review = {acting.decision_id, job.window->total_events()};
        acting.pushed_at = job.window->total_events();
        acting.marks_at_push = job.window->steps_marked();
      }
      if (AutotuneDecision* d = FindDecision(job, acting.decision_id)) {
        d->trigger_to_ack = acting.watch_since - d->triggered_at;
      }
    }
  }

  void RunDecision(const Task& task);
  void Promote(const Task& task);
  void Review(const Task& task);
  // Keeps or rolls back a push on the canary's events after it (see
  // AutotuneOptions::rollback_margin).
  void Judge(const Task& task);
  // Queues Judge when the window holds events after the push, and returns
  // whether it did.
  bool QueueJudge(const JobKey& name, Job& job, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pushed config replayed on the events the canary ran after the push:
  // the standing prediction (Acting::standing) when it covers more of what
  // the job requested.
  void Repredict(const Task& task);
  // Queues Repredict for a canary under watch (no decision runs then:
  // Enqueue waits for the push to be applied) whose stream requested more
  // than the standing prediction covered by kRepredictGrowth, once that
  // peak has passed. Once applied, a larger request or growth decides
  // again, and a decision that keeps the config stands (RunDecision).
  void MaybeRepredict(const JobKey& name, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The canary's recorded window switched at its push to the pushed config,
  // for Judge and Repredict; nullptr unless the canary is recorded and its
  // window holds the push and events after it.
  std::shared_ptr<ReviewInput> CanaryEventsAfterPush(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Staying on `in.running` replayed with a switch at the push: to the
  // pushed config (`keep`), or none.
  absl::StatusOr<ReplayResult> ReplayFromPush(const ReviewInput& in, bool keep) const;
  // What every replay of a job's window runs under.
  DecideOptions BaseDecideOptions() const;
  // Queues the review of `job`'s last push (Job::review) on the window of
  // its recorded session, as it is now.
  void QueueReview(const JobKey& name, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RollBack(const Task& task);

  const AutotuneOptions options_;
  AutotuneActions* const actions_;
  mutable absl::Mutex mu_;
  JobPolicy default_policy_ ABSL_GUARDED_BY(mu_);
  // Before jobs_: their windows give their charges back as they go.
  AutotuneMemory memory_;
  std::map<JobKey, Job> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  // When each tenant's last task started (NextTask), in tasks started; past
  // kTenantsRemembered tenants, forgotten all at once (their turns even out).
  static constexpr size_t kTenantsRemembered = 4096;
  absl::flat_hash_map<TenantId, uint64_t> started_by_tenant_ ABSL_GUARDED_BY(mu_);
  uint64_t tasks_started_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs whose last session ended, oldest first (DropOldEndedJobs).
  std::deque<JobKey> ended_jobs_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_decision_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread worker_;  // last: starts once the rest is built
};

void Autotuner::Impl::RunDecision(const Task& task) {
  Trace trace;
  RunningConfig running;
  JobPolicy policy;
  std::string skip_why;
  bool full = false;
  std::vector<uint64_t> step_ends;  // indices into `trace`
  bool marked = false;              // the job has marked steps
  bool marks_steps = false;         // its client marks them (none: no optimizer)
  // Where the largest request began, as an index into `trace` (nullopt:
  // before the window), and whether it has peaked (the stream moved on).
  std::optional<uint64_t> largest_request;
  bool largest_peaked = false;
  int64_t max_requested = 0;
  // The job from the client's real state (DecisionState), and its marks.
  std::optional<Trace> state_trace;
  std::vector<uint64_t> state_step_ends;
  // A job without marks: its state at or before its largest request
  // (StateAtOrBefore), for a prediction that covers that request.
  std::optional<Trace> cover_state_trace;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (ModeOf(job) == AutotuneMode::kOff || job.window == nullptr) {
      job.queued = false;
      job.queued_id = 0;
      return;
    }
    policy = PolicyOf(job);
    const Session& session = sessions_.at(job.recorded);
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(session.config);
    if (!parsed.ok()) {
      skip_why = absl::StrCat("the job's config '", session.config,
                              "' does not parse: ", parsed.status().message());
    } else {
      running.config = *parsed;
      if (parsed->per_process_memory_fraction < 1.0) {
        running.memory_fraction = parsed->per_process_memory_fraction;
      }
    }
    if (job.window->has_gap() &&
        static_cast<double>(job.window->dropped_events()) >
            options_.max_lost_fraction *
                static_cast<double>(job.window->total_events())) {
      skip_why = absl::StrFormat(
          "the client dropped events inside the window (%d so far, more than %g of "
          "them): its replay would miss allocations; the next run waits for the "
          "window to move past the gap",
          job.window->dropped_events(), options_.max_lost_fraction);
    }
    const JobWindow& window = *job.window;
    full = window.size() >= options_.window_events;
    // A first pass nobody asked an id for waits quietly for a clean window.
    if (task.first_pass && !skip_why.empty() && job.queued_id == 0) {
      job.queued = false;
      return;
    }
    trace = window.ToTrace();
    // ToTrace starts with what was live at the window's start (the prelude).
    const uint64_t prelude = trace.events.size() - window.size();
    marked = window.steps_marked() > 0;
    marks_steps = sessions_.at(job.recorded).marks_steps;
    for (uint64_t end : window.StepEnds()) step_ends.push_back(prelude + end);
    const uint64_t window_start = window.total_events() - window.size();
    if (window.largest_request_start() >= window_start) {
      largest_request = prelude + (window.largest_request_start() - window_start);
    }
    largest_peaked =
        window.total_events() - window.max_requested_at() >= options_.first_pass_min_events;
    max_requested = window.max_requested_bytes();
    const bool cover = ForGrowth(task.trigger);
    if (std::optional<StateSwitch> at = DecisionState(
            window, cover ? window.largest_request_start() : window.total_events(),
            BaseDecideOptions().min_events)) {
      state_trace = window.ToTraceFromState(at->seq);
      state_step_ends = std::move(at->step_ends);
    } else if (!marked && (cover || task.first_pass)) {
      // Only a prediction that covers the largest request replays from it:
      // a larger request, growth, or an aperiodic first pass.
      if (std::optional<uint64_t> seq = StateAtOrBefore(window, window.largest_request_start(),
                                                        BaseDecideOptions().min_events)) {
        cover_state_trace = window.ToTraceFromState(*seq);
      }
    }
  }
  // Found once: the first pass's gate and Decide's switch point use it.
  std::optional<std::optional<uint64_t>> step;
  // The prediction must cover the largest request: an aperiodic job's, and
  // whatever grew.
  bool cover_largest = ForGrowth(task.trigger);
  bool aperiodic = false;
  if (task.first_pass && !marked && !full && skip_why.empty()) {
    // Without marks the first pass decides once the window ends in three
    // steps of training (or is full): a repeat that keeps or drifts is the
    // model's construction or one pass's layers (ReturnsWhatItAllocates).
    // With no training step by aperiodic_after_events, the job is
    // aperiodic (a decoded token repeats, but keeps what it allocates):
    // decided on once its largest request so far has peaked (a model still
    // being built has not). A client that marks its steps and marked none
    // runs no optimizer: nothing in its stream is a step (under `allocd
    // run` a generation job's stream began mid-call, and a decoded token of
    // 75 events passed for its step: decided on 1,078 events, it stayed on
    // PyTorch's defaults until a larger call).
    if (marks_steps) {
      step.emplace();  // known: no step
    } else {
      step = FindStepPeriod(trace, kStepShift);
    }
    if (!*step || !ReturnsWhatItAllocates(trace, **step)) {
      aperiodic = trace.events.size() >= options_.aperiodic_after_events;
      absl::MutexLock lock(&mu_);
      Job& job = jobs_[task.job];
      if (job.queued_id == 0 && !(aperiodic && largest_peaked)) {
        job.queued = false;
        return;
      }
      if (aperiodic) step = std::optional<uint64_t>();
      cover_largest = cover_largest || aperiodic;
    }
  }

  actions_->OnRun(task.job.job);
  Decision d;
  if (skip_why.empty()) {
    DecideOptions decide = BaseDecideOptions();
    if (!state_trace && cover_largest && cover_state_trace) {
      // No step to switch at: from the state before the largest request,
      // which the prediction then covers.
      state_trace = std::move(cover_state_trace);
      decide.step_events = std::optional<uint64_t>();
      decide.cover_from = 0;
    }
    if (state_trace) {
      // Switched where the client's state was taken: everything after it
      // is the prediction's.
      DecideOptions from_state = decide;
      from_state.switch_event = 0;
      from_state.step_ends = std::move(state_step_ends);
      d = ::allocd::Decide(*state_trace, running, policy, from_state);
    }
    if (!state_trace || d.predicted_peak_current <= 0) {
      const std::string state_why =
          state_trace ? absl::StrCat("; from the window: the client's state gave no prediction (",
                                     d.why, ")")
                      : "";
      decide.step_events = step;
      decide.step_ends = std::move(step_ends);
      if (cover_largest) decide.cover_from = largest_request.value_or(0);
      d = ::allocd::Decide(trace, running, policy, decide);
      absl::StrAppend(&d.why, state_why);
    }
    if (aperiodic) {
      d.why = absl::StrCat(marks_steps
                               ? "aperiodic (its client marks optimizer steps and it marked none: "
                                 "it runs no optimizer)"
                               : "aperiodic (no step marks, and no repeat in the stream that "
                                 "gives back what it allocates)",
                           ": decided on its largest request so far; ", d.why);
    }
  } else {
    d.why = skip_why;
  }

  AutotuneDecision rec;
  std::optional<SessionId> canary;
  std::optional<AutotuneDecision> pushed_update;  // the push a kept decision predicts anew
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    rec.id = job.queued_id != 0 ? job.queued_id : next_decision_id_++;
    rec.triggered_at = task.triggered_at;
    rec.at = Now();
    rec.job = task.job.job;
    rec.tenant = task.job.tenant;
    rec.trigger = task.trigger;
    rec.from_config = FormatAllocatorConfig(running.config);
    rec.predicted_peak_current = d.predicted_peak_current;
    rec.predicted_peak_switched = d.predicted_peak_switched;
    rec.predicted_saving = d.predicted_peak_current - d.predicted_peak_switched;
    rec.predicted_peak_allocated = d.predicted_peak_allocated;
    rec.predicted_peak_requested = d.predicted_peak_requested;
    if (d.predicted_peak_rolled_back > 0) rec.predicted_peak_rolled_back = d.predicted_peak_rolled_back;
    rec.window_events = trace.events.size();
    rec.replay_seconds = d.replay_seconds;
    rec.candidates = d.candidates;
    rec.why = d.why;
    switch (d.result) {
      case Decision::Result::kSkip:
        rec.result = AutotuneResult::kSkipped;
        break;
      case Decision::Result::kKeep:
        rec.result = AutotuneResult::kKept;
        break;
      case Decision::Result::kPropose:
        rec.to_config = d.to_config;
        rec.memory_fraction = d.to.memory_fraction;
        if (std::optional<std::string> why_not = NotProposedAgain(job, d.to_config, max_requested)) {
          rec.result = AutotuneResult::kKept;
          absl::StrAppend(&rec.why, *why_not);
        } else if (ModeOf(job) != AutotuneMode::kApply) {
          rec.result = AutotuneResult::kRecommended;
        } else if (job.sessions.empty()) {
          rec.result = AutotuneResult::kSkipped;
          absl::StrAppend(&rec.why, "; the job has no session left to push to");
        } else {
          rec.result = AutotuneResult::kPushed;
          if (auto it = job.rolled_back.find(d.to_config); it != job.rolled_back.end()) {
            absl::StrAppend(&rec.why, absl::StrFormat(
                "; rolled back before on requests of at most %s, pushed again now that the "
                "job requests %s", GiB(it->second), GiB(max_requested)));
          }
          canary = job.sessions.front();  // the oldest
          rec.sessions = {*canary};
          Acting acting;
          acting.decision_id = rec.id;
          acting.canary = *canary;
          acting.to_config = d.to_config;
          acting.pushed_config = FormatAllocatorConfig(d.to.config);
          acting.rollback_config = LiveConfigString(running.config, d.to.config);
          acting.predicted_current = d.predicted_peak_current;
          acting.predicted_switched = d.predicted_peak_switched;
          acting.predicted_allocated = d.predicted_peak_allocated;
          acting.predicted_requested = d.predicted_peak_requested;
          acting.standing = {d.predicted_peak_switched, d.predicted_peak_allocated,
                             d.predicted_peak_requested};
          // The canary's growth is measured from here.
          if (job.window) job.window->ResetPeakRequested();
          job.acting = std::move(acting);
        }
        break;
    }
    if (rec.result != AutotuneResult::kPushed && rec.result != AutotuneResult::kRecommended) {
      rec.to_config.clear();
    }
    job.queued = false;
    job.queued_id = 0;
    job.first_pass_done = true;
    job.cooldown_until = Now() + options_.cooldown;
    job.decided_requested = std::max(job.decided_requested, max_requested);
    if (rec.result != AutotuneResult::kSkipped) {
      // What the config the job runs from now on needs: the pushed one's
      // prediction, else staying's.
      job.settled_need = rec.result == AutotuneResult::kPushed ? d.predicted_peak_switched
                                                : d.predicted_peak_current;
    }
    // A decision on the canary's stream that keeps the pushed config is the
    // newest prediction for it, once it covers more than the standing one.
    if (rec.result == AutotuneResult::kKept && job.acting && job.recorded == job.acting->canary &&
        rec.from_config == job.acting->pushed_config &&
        d.predicted_peak_requested > job.acting->standing.requested) {
      job.acting->standing = {d.predicted_peak_current, d.predicted_peak_allocated,
                              d.predicted_peak_requested};
      if (AutotuneDecision* pushed = FindDecision(job, job.acting->decision_id)) {
        pushed->at_need_basis = absl::StrFormat("decision %d, which kept it", rec.id);
        UpdatePredictionAtNeed(job);
        pushed_update = *pushed;
      }
    }
    Record(job, rec);
  }
  if (pushed_update) actions_->OnDecision(*pushed_update);
  actions_->OnDecision(rec);
  if (!canary) return;

  const std::string reason = absl::StrFormat(
      "autotune decision %d (%s): predicted peak %s instead of %s for steps that request at "
      "most %s (larger steps need more under both)",
      rec.id, AutotuneTriggerName(rec.trigger), GiB(rec.predicted_peak_switched),
      GiB(rec.predicted_peak_current), GiB(rec.predicted_peak_requested));
  absl::StatusOr<uint64_t> version = actions_->PushToSession(
      *canary, rec.to_config, reason, static_cast<uint64_t>(rec.predicted_peak_switched));
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    AutotuneDecision* stored = FindDecision(job, rec.id);
    if (!job.acting || job.acting->decision_id != rec.id || stored == nullptr) return;
    if (!version.ok()) {
      stored->result = AutotuneResult::kSkipped;
      absl::StrAppend(&stored->why, "; the push to canary session ", *canary,
                      " failed: ", version.status().message());
      job.acting.reset();
    } else {
      stored->version = *version;
      Acting& acting = *job.acting;
      acting.canary_version = *version;
      if (acting.early_ack == *version) AckedLocked(*canary, *version, true, "");
      if (acting.early_nack && acting.early_nack->first == *version) {
        AckedLocked(*canary, *version, false, acting.early_nack->second);
      }
    }
    notify.push_back(*stored);
  }
  Notify(notify);
}

DecideOptions Autotuner::Impl::BaseDecideOptions() const {
  DecideOptions decide;
  decide.threads = std::max(1, options_.threads);
  decide.capacity = options_.capacity;
  decide.total_memory = options_.total_memory;
  decide.min_saving = options_.min_saving;
  decide.max_call_ratio = options_.max_call_ratio;
  decide.budget = options_.budget;
  decide.min_events = std::min(options_.first_pass_min_events, options_.window_events);
  decide.max_shift = kStepShift;
  decide.on_replay = options_.on_replay;
  return decide;
}

void Autotuner::Impl::QueueReview(const JobKey& name, Job& job) {
  if (!job.review || job.window == nullptr) return;
  const auto [decision_id, pushed_at] = *job.review;
  job.review.reset();
  AutotuneDecision* d = FindDecision(job, decision_id);
  // Rolled back: nothing to judge.
  if (d == nullptr || d->result != AutotuneResult::kPushed) return;
  absl::StatusOr<AllocatorConfig> from = ParseAllocatorConfig(d->from_config);
  if (!from.ok()) return;  // canonical: parses, as it did to be decided on
  // Nothing ran after the push: nothing to judge it on.
  if (pushed_at >= job.window->total_events()) return;
  const uint64_t window_start = job.window->total_events() - job.window->size();
  if (pushed_at < window_start) {
    absl::StrAppend(&d->why, "; not reviewed: the push left the window before the job ended");
    return;
  }
  std::shared_ptr<ReviewInput> input = SwitchedAtPush(*job.window, pushed_at, *from);
  input->policy = PolicyOf(job);
  Task task{TaskKind::kReview, name, {}, decision_id, false, ""};
  task.review = std::move(input);
  tasks_.push_back(std::move(task));
}

// The best the job could have had from the push on: Decide, switched where
// the push happened, over the events after it. Staying counts too (a push
// that should not have been made is judged against not making it).
void Autotuner::Impl::Review(const Task& task) {
  const ReviewInput& in = *task.review;
  DecideOptions decide = BaseDecideOptions();
  decide.switch_event = in.switch_event;
  const Decision d = ::allocd::Decide(in.trace, in.running, in.policy, decide);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    AutotuneDecision* rec = FindDecision(job, task.decision_id);
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

std::shared_ptr<Autotuner::Impl::ReviewInput> Autotuner::Impl::CanaryEventsAfterPush(
    const Job& job) const {
  const Acting& acting = *job.acting;
  if (!acting.pushed_at || job.recorded != acting.canary || job.window == nullptr) return nullptr;
  const JobWindow& window = *job.window;
  const uint64_t window_start = window.total_events() - window.size();
  if (*acting.pushed_at >= window.total_events() || *acting.pushed_at < window_start) {
    return nullptr;
  }
  const AutotuneDecision* d = FindDecision(job, acting.decision_id);
  if (d == nullptr) return nullptr;
  absl::StatusOr<AllocatorConfig> from = ParseAllocatorConfig(d->from_config);
  absl::StatusOr<AllocatorConfig> pushed = ParseAllocatorConfig(acting.pushed_config);
  if (!from.ok() || !pushed.ok()) return nullptr;  // canonical: they parsed to be decided on
  std::shared_ptr<ReviewInput> input = SwitchedAtPush(window, *acting.pushed_at, *from);
  input->pushed = *pushed;
  return input;
}

bool Autotuner::Impl::QueueJudge(const JobKey& name, Job& job, std::string reason) {
  std::shared_ptr<ReviewInput> input = CanaryEventsAfterPush(job);
  if (input == nullptr) return false;
  Acting& acting = *job.acting;
  acting.judged_from = acting.phase;
  acting.phase = Phase::kJudging;
  Task task{TaskKind::kJudge, name, {}, acting.decision_id, false, std::move(reason)};
  task.review = std::move(input);
  tasks_.push_back(std::move(task));
  return true;
}

// Staying replayed on the events after the push, against what the job
// realised on them; and, before rolling back, what the rollback would
// leave (rollback_model.h).
absl::StatusOr<ReplayResult> Autotuner::Impl::ReplayFromPush(const ReviewInput& in,
                                                             bool keep) const {
  ReplayOptions options = ReplayBase(in);
  options.live_switch = LiveSwitch{
      in.switch_event, keep ? std::optional<AllocatorConfig>(in.pushed) : std::nullopt,
      std::nullopt};
  // The client's second release (client/python/allocd/_advisor.py's
  // SecondRelease), at the first mark after the push; a job that marks no
  // steps releases at lows the stream does not show, left out. On the H200
  // a ViT pushed expandable segments from defaults was predicted 6.6% above
  // what it realised without it.
  if (keep && in.first_mark_after) {
    options.live_switch->release_again_before_event = in.first_mark_after;
  }
  if (options_.on_replay) options_.on_replay(+1);
  absl::StatusOr<ReplayResult> result = Replay(in.trace, in.running.config, options);
  if (options_.on_replay) options_.on_replay(-1);
  return result;
}

void Autotuner::Impl::MaybeRepredict(const JobKey& name, Job& job) {
  Acting& acting = *job.acting;
  const bool watched = acting.phase == Phase::kCanaryWatching ||
                       acting.phase == Phase::kPromoting || acting.phase == Phase::kJudging;
  if (!watched || acting.repredicting || job.window == nullptr ||
      acting.standing.requested <= 0 ||
      static_cast<double>(acting.realized_requested) <=
          (1.0 + kRepredictGrowth) * static_cast<double>(std::max(
                                         acting.standing.requested, acting.repredicted_on)) ||
      job.window->held_requested_bytes() >= job.window->peak_held_requested_bytes()) {
    return;
  }
  std::shared_ptr<ReviewInput> input = CanaryEventsAfterPush(job);
  if (input == nullptr) return;
  acting.repredicting = true;
  acting.repredicted_on = acting.realized_requested;
  Task task{TaskKind::kRepredict, name, {}, acting.decision_id, false, ""};
  task.review = std::move(input);
  tasks_.push_back(std::move(task));
}

void Autotuner::Impl::Repredict(const Task& task) {
  const ReviewInput& in = *task.review;
  absl::StatusOr<ReplayResult> kept = ReplayFromPush(in, /*keep=*/true);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id) return;
    Acting& acting = *job.acting;
    acting.repredicting = false;
    AutotuneDecision* d = FindDecision(job, task.decision_id);
    if (d == nullptr || !kept.ok() || !kept->after_switch ||
        kept->after_switch->peak_requested <= acting.standing.requested) {
      return;
    }
    const ReplayPhase& after = *kept->after_switch;
    acting.standing = {after.peak_reserved, after.peak_allocated, after.peak_requested};
    d->at_need_basis = absl::StrFormat(
        "%s replayed on the %d events the canary ran after the push (requesting at most %s)%s",
        acting.pushed_config.empty() ? "(defaults)" : acting.pushed_config,
        in.trace.events.size() - in.switch_event, GiB(after.peak_requested),
        in.first_mark_after ? ", the cache released again at the job's first step mark after it"
                            : "");
    UpdatePredictionAtNeed(job);
    notify.push_back(*d);
  }
  Notify(notify);
}

void Autotuner::Impl::Judge(const Task& task) {
  const ReviewInput& in = *task.review;
  absl::StatusOr<ReplayResult> stayed = ReplayFromPush(in, /*keep=*/false);
  absl::StatusOr<ReplayResult> kept = ReplayFromPush(in, /*keep=*/true);
  absl::StatusOr<RollbackPrediction> rollback =
      PredictRollback(in.trace, in.switch_event, in.running.config, in.pushed, ReplayBase(in),
                      options_.on_replay);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id ||
        job.acting->phase != Phase::kJudging) {
      return;  // rolled back meanwhile (an OOM, a NACK) or the canary ended
    }
    Acting& acting = *job.acting;
    AutotuneDecision* d = FindDecision(job, task.decision_id);
    const int64_t realized = acting.realized_peak;
    const uint64_t events = in.trace.events.size() - in.switch_event;
    std::optional<std::string> kept_because;
    if (!stayed.ok() || !kept.ok() || !rollback.ok()) {
      const absl::Status error =
          !stayed.ok() ? stayed.status() : (!kept.ok() ? kept.status() : rollback.status());
      kept_because = absl::StrCat("the events after the push do not replay (", error.message(),
                                  "), so it cannot be said that staying would have cost less");
    } else {
      const int64_t staying = stayed->after_switch->peak_reserved;
      if (d != nullptr) {
        d->staying_after_push = staying;
        d->rollback_after_push = rollback->rolled_back;
        d->keeping_after_push = rollback->keeping;
        d->judged_events = events;
      }
      const std::string judged = absl::StrFormat(
          "on the %d events the canary ran after the push, staying on %s replays to a peak of "
          "%s and the job realised %s",
          events, d != nullptr && !d->from_config.empty() ? d->from_config : "(defaults)",
          GiB(staying), GiB(realized));
      const int64_t pushed_replayed = kept->after_switch->peak_reserved;
      switch (JudgePush(realized, staying, pushed_replayed, *rollback, options_.rollback_margin)) {
        case PushVerdict::kKeepNoWorse:
          kept_because = absl::StrCat(judged, ": no worse than not pushing");
          break;
        case PushVerdict::kKeepRollbackNoBetter:
          kept_because = absl::StrFormat(
              "%s; a rollback would leave it at %s over those events again (%s made under the "
              "push still reserved at the rollback), no lower than keeping the push (%s)",
              judged, GiB(rollback->rolled_back), GiB(rollback->held_at_rollback),
              GiB(rollback->keeping));
          break;
        case PushVerdict::kWaitForEvents:
          // Judged again once the canary has run as many events again; a
          // promotion the judgement interrupted waits for it.
          acting.phase = acting.judged_from == Phase::kPromoting ? Phase::kCanaryWatching
                                                                 : acting.judged_from;
          acting.judge_after_events = *acting.pushed_at + 2 * events;
          if (d != nullptr) {
            absl::StrAppend(&d->why, absl::StrFormat(
                "; %s, but the pushed config replays to %s on them: the realised peak came "
                "from events not recorded yet, so it is judged again once the canary has run "
                "%d events after the push",
                judged, GiB(pushed_replayed), 2 * events));
          }
          break;
        case PushVerdict::kRollBack:
          QueueRollBack(task.job, job, absl::StrFormat(
              "%s; %s (the pushed config replays to %s on them), above staying, and a rollback "
              "is predicted at %s over those events again against %s keeping the push",
              task.reason, judged, GiB(pushed_replayed), GiB(rollback->rolled_back),
              GiB(rollback->keeping)), RollBackFor::kWhatItRealised);
          break;
      }
    }
    if (kept_because) {
      acting.phase = acting.judged_from;
      acting.judged_realized = realized;
      if (acting.phase == Phase::kPromoting) {
        tasks_.push_back(Task{TaskKind::kPromote, task.job, {}, acting.decision_id, false, ""});
      }
      if (d != nullptr) {
        absl::StrAppend(&d->why, "; ", task.reason, ", but ", *kept_because, ": kept");
      }
    }
    if (d != nullptr) notify.push_back(*d);
  }
  Notify(notify);
}

void Autotuner::Impl::Promote(const Task& task) {
  std::string to_config;
  std::string reason;
  int64_t predicted = 0;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id ||
        job.acting->phase != Phase::kPromoting) {
      return;
    }
    to_config = job.acting->to_config;
    predicted = job.acting->predicted_switched;
    reason = absl::StrFormat(
        "autotune decision %d: the canary ran it for %s, peaking at %s (predicted %s)",
        task.decision_id, absl::FormatDuration(options_.canary_window),
        GiB(job.acting->realized_peak), GiB(predicted));
  }
  absl::StatusOr<uint64_t> version =
      actions_->SetJobConfig(task.job, to_config, reason, static_cast<uint64_t>(predicted));
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id) return;
    if (!version.ok()) {
      job.acting->phase = Phase::kCanaryWatching;  // lets QueueRollBack act
      QueueRollBack(task.job, job, absl::StrCat("setting the job's config failed: ",
                                                version.status().message()));
      return;
    }
    job.acting->phase = Phase::kApplied;
    job.acting->job_version = *version;
    if (AutotuneDecision* d = FindDecision(job, task.decision_id)) {
      d->version = *version;
      d->sessions = {job.acting->canary};
      for (SessionId s : job.sessions) {
        if (s != job.acting->canary) d->sessions.push_back(s);
      }
      absl::StrAppend(&d->why, "; ", reason, "; set for the whole job");
      notify.push_back(*d);
    }
  }
  Notify(notify);
}

void Autotuner::Impl::RollBack(const Task& task) {
  SessionId canary = 0;
  std::string rollback_config;
  bool whole_job = false;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id) return;
    canary = job.acting->canary;
    rollback_config = job.acting->rollback_config;
    whole_job = job.acting->job_version != 0;
  }
  const std::string reason =
      absl::StrFormat("autotune decision %d rolled back: %s", task.decision_id, task.reason);
  const absl::Status status =
      whole_job ? actions_->SetJobConfig(task.job, rollback_config, reason, 0).status()
                : actions_->RollBackSession(canary, rollback_config, reason);
  std::vector<AutotuneDecision> notify;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[task.job];
    if (!job.acting || job.acting->decision_id != task.decision_id) return;
    job.rolled_back[job.acting->to_config] = job.acting->rolled_back_on_requested > 0
                                                  ? job.acting->rolled_back_on_requested
                                                  : kRolledBackForGood;
    for (SessionId s : job.sessions) {
      if (s == canary || whole_job) sessions_[s].config = rollback_config;
    }
    job.settled_need = job.acting->predicted_current;
    job.acting.reset();
    job.cooldown_until = Now() + options_.cooldown;
    if (AutotuneDecision* d = FindDecision(job, task.decision_id)) {
      d->result = AutotuneResult::kRolledBack;
      absl::StrAppend(&d->why, "; rolled back: ", task.reason);
      if (!status.ok()) absl::StrAppend(&d->why, " (the rollback push failed: ", status.message(), ")");
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
                               bool marks_steps) {
  impl_->SessionStarted(id, job, config, config_version, tenant, marks_steps);
}
void Autotuner::SessionEnded(SessionId id) { impl_->SessionEnded(id); }
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
