// What the autotuner keeps of each session it is fed (AutotuneSession) and
// of each job (AutotuneJob: a label within a tenant, JobKey): the window of
// one session's events, the decisions, the push under way (Canary) and what
// triggers its next run. Plain state the autotuner guards with its lock;
// the questions it asks of one job are answered here.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_JOB_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_JOB_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/autotune/autotune_options.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/canary.h"
#include "server/autotune/decision_inputs.h"
#include "server/autotune/job_key.h"
#include "server/autotune/job_window.h"
#include "server/autotune/learn_check.h"
#include "server/session_id.h"

namespace allocd {

struct AutotuneSession {
  JobKey job;  // its tenant's memory holds the job's window
  uint64_t order = 0;
  std::string config;  // what it runs
  uint64_t config_version = 0;
  // Pushed at registration, not ACKed yet (Autotuner::Handed).
  struct HandedConfig {
    uint64_t version = 0;
    std::string config;
  };
  std::optional<HandedConfig> handed;
  int64_t retries = 0;
  // Started on a config the daemon chose instead of its own (StartedInstead):
  // its own, and why; reviewed at the job's first pass, then reset.
  struct Instead {
    std::string own;
    std::string why;
  };
  std::optional<Instead> instead;
  // PyTorch's reserved_bytes.all.peak in its newest stats report (0: none).
  int64_t reserved_peak = 0;
  std::optional<absl::Time> fragmented_since;
  bool marks_steps = false;  // its client marks optimizer steps
  SessionRank rank;           // as its client reported it

  // Whether a stats report of `reserved` over `allocated` at `now` finds
  // the session fragmented (AutotuneOptions::fragmentation_ratio) for
  // fragmentation_for since it first did; then it starts over.
  bool Fragmented(int64_t reserved, int64_t allocated, absl::Time now,
                  const AutotuneOptions& options);
};

// AutotuneJob::rolled_back's mark of a config never proposed again.
inline constexpr int64_t kRolledBackForGood = std::numeric_limits<int64_t>::max();

struct AutotuneJob {
  std::optional<JobPolicy> policy;
  // What its sessions reported doing, the union: decisions leave out the
  // configs that would break it.
  JobFeatures features;
  std::vector<SessionId> sessions;  // oldest first
  // A session of it is one of several ranks (SessionRank::OfSeveral): its
  // pushes reach every rank once the canary's first step under them is
  // judged (Canary::Push::lockstep).
  bool lockstep = false;
  // The session whose events the window holds: one session's stream is
  // decided on, never a merge of several.
  SessionId recorded = 0;
  std::unique_ptr<JobWindow> window;
  // What the recorded session ran when its window took its first event:
  // the config its run started on, as far back as the window goes (what a
  // learn check replays besides the push).
  std::string window_config;
  AutotuneTrigger first_trigger = AutotuneTrigger::kFirstPass;
  bool first_pass_done = false;
  size_t next_first_pass_check = 0;
  // Sets next_first_pass_check for a window that starts now: a job whose
  // client marks steps (`marks_steps`) and has marked none is aperiodic
  // only after aperiodic_after_events, so no probe of its stream before.
  void ResetFirstPassCheck(const AutotuneOptions& options, bool marks_steps);
  bool queued = false;  // a run is queued or running
  uint64_t queued_id = 0;
  absl::Time cooldown_until = absl::InfinitePast();
  std::optional<Canary> acting;          // a push under way
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

  // The decision `id` while the history holds it; else nullptr.
  AutotuneDecision* FindDecision(uint64_t id);
  const AutotuneDecision* FindDecision(uint64_t id) const;
  // Appends `decision`, keeping the newest `kept` (at least one).
  void Record(AutotuneDecision decision, size_t kept);

  // What a decision taken asks of the autotuner: the canary session to push
  // to (a push), and the push under way that a decision keeping its config
  // predicted anew (to notify).
  struct Taken {
    std::optional<SessionId> canary;
    std::optional<AutotuneDecision> pushed_update;
  };
  // Takes `d`, made at `now` for the job running `running` in `mode` when it
  // had requested at most `max_requested`, as `rec` (whose id, times,
  // trigger and window are set): its result and why, the push it starts
  // (`acting`), what the job's next triggers compare with, and records it.
  Taken Decided(AutotuneDecision& rec, const Decision& d, const RunningConfig& running,
                int64_t max_requested, AutotuneMode mode, const AutotuneOptions& options,
                absl::Time now);

  // Why a proposal of `config` is not pushed, as a "; ..." clause of the
  // decision's why (nullopt: it may be), when the job has requested at most
  // `requested`: see rolled_back.
  std::optional<std::string> NotProposedAgain(const std::string& config, int64_t requested,
                                              double growth_margin) const;

  // A run the window's events call for: a first pass (`probe`: without
  // step marks, where the worker looks for the job's step), or a larger
  // request than the last decision saw.
  struct Due {
    AutotuneTrigger trigger = AutotuneTrigger::kFirstPass;
    bool first_pass = false;
    bool probe = false;
  };
  std::optional<Due> DueOnEvents(const AutotuneOptions& options) const;
  // A probe was queued: the next waits for half as many events again, or a
  // full window of `window_events`. (Twice as many let a job whose first
  // look fell where it rebuilt its model, 300k events in, wait for 600k,
  // where it did so again: a restarted llama_lora replay was never decided
  // on.)
  void Probed(size_t window_events);
  // Reserved past what the config the job settled on needs, by
  // `growth_margin` (and past the reserved of the last growth run): its
  // steps grew since the last decision.
  bool Grew(int64_t reserved, double growth_margin) const;

  // The window as the push sees it (unset: the job keeps none).
  std::optional<RecordedStream> Stream() const;

  // The canary's recorded window switched at its push to the pushed config,
  // for a judgement and a reprediction; nullptr unless the canary is
  // recorded and its window holds the push and events after it.
  std::shared_ptr<PushReplayInput> CanaryEventsAfterPush() const;

  // What the learn check of the push under way replays (learn_check.h):
  // the window from its first event under the pushed config and what the
  // run had without it (the config the push replaced, then window_config).
  // nullptr when the job keeps no window or it holds no events.
  std::shared_ptr<LearnCheckInput> LearnCheckOfPush() const;

  // Takes the review of the job's last push (`review`) on the window as it
  // is now: its input and decision id, or nullptr when there is nothing to
  // review (rolled back, nothing ran after it, or it left the window: then
  // its decision says so).
  std::shared_ptr<PushReplayInput> TakeReview(uint64_t& decision_id);

  // Session `id` ended while a push is under way (Canary::SessionEnded):
  // whether to promote the push; a push dropped is reset, its decision (if
  // kept) added to `notify`.
  bool CanaryEnded(SessionId id, std::vector<AutotuneDecision>& notify);

  // The push was rolled back (its rollback pushed): its config is
  // remembered as rolled back, the job needs what staying was predicted
  // at, and runs wait for the cooldown until `until`.
  void RolledBack(absl::Time until);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_JOB_H_
