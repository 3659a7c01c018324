// Canary: a push under way for one job, from the push to its canary session
// to the config set for the whole job or rolled back (see AutotuneOptions
// for the rules). A value the autotuner keeps per job and feeds what it
// sees (ACKs, stats reports, the canary's stream, the judgements its worker
// replays); each step returns what the autotuner is to do next (queue a
// judgement, a promotion, a rollback), which it does with its own lock
// held. It never calls out, replays or locks, as Envoy's SubscriptionState.
//
// Phases:
//   kPushed --ACK--> kWatching --canary_window within the margin--> kPromoting
//   kWatching --a rank's canary: its first step under the push judged--> kPromoting
//   kPromoting --job set--> kApplied
//   kWatching/kPromoting/kApplied --realised peak past the margin--> kJudging
//   kJudging --kept, or wait for more events--> the phase it interrupted
//   any but kRollingBack --NACK, OOM, a failed push, judged worse--> kRollingBack
#ifndef ALLOCD_SERVER_AUTOTUNE_CANARY_H_
#define ALLOCD_SERVER_AUTOTUNE_CANARY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/trace/replay.h"
#include "server/autotune/autotune_options.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/rollback_model.h"
#include "server/session_id.h"

namespace allocd {

struct CanaryOptions {
  absl::Duration canary_window = absl::Seconds(10);  // AutotuneOptions'
  double rollback_margin = 0.10;                      // AutotuneOptions'
  // Recorded events after the push that a watch within the margin must
  // cover for a canary that ends before its window to set the push (a first
  // pass's AutotuneOptions::first_pass_min_events).
  uint64_t min_events_watched = 2000;
};

CanaryOptions CanaryOptionsOf(const AutotuneOptions& options);

// The job's window as the canary sees it: the session it records and where
// that session's stream stands (JobWindow's counts).
struct RecordedStream {
  SessionId session = 0;
  uint64_t total_events = 0;
  uint64_t steps_marked = 0;
  int64_t held_requested = 0;       // JobWindow::held_requested_bytes()
  int64_t peak_held_requested = 0;  // JobWindow::peak_held_requested_bytes()
};

class Canary {
 public:
  enum class Phase { kPushed, kWatching, kPromoting, kApplied, kJudging, kRollingBack };

  // A prediction of the pushed config's peak reserved, with the job's need
  // over the same events (allocated, and requested: sizes as asked).
  struct Prediction {
    int64_t reserved = 0;
    int64_t allocated = 0;
    int64_t requested = 0;
  };

  // What a decision pushes to `canary`.
  struct Push {
    uint64_t decision_id = 0;
    SessionId canary = 0;
    std::string to_config;        // the decision's proposal, as pushed
    std::string pushed_config;    // canonical: what the canary holds after the push
    std::string rollback_config;  // pushed to roll back: gives back exactly what the job ran
    int64_t predicted_current = 0;  // staying, over the window's events after the switch
    Prediction predicted;           // switching, over the same events
    // The canary is a rank of a job of several (SessionRank::OfSeveral):
    // ranks run in lockstep, so the job needs what its worst rank needs,
    // and the push reaches every rank once the canary's first step under
    // it is judged (FirstStepJudged), not after the canary_window.
    bool lockstep = false;
  };

  // What the autotuner does after a step.
  enum class Next { kNothing, kJudge, kPromote, kRollBack };
  struct Action {
    Next next = Next::kNothing;
    std::string reason;  // kJudge, kRollBack
    // kRollBack: for what the job realised under the push (the config may
    // be proposed again on larger requests), not for good.
    bool for_what_it_realised = false;
  };

  Canary(Push push, CanaryOptions options);

  Phase phase() const { return phase_; }
  uint64_t decision_id() const { return push_.decision_id; }
  SessionId canary() const { return push_.canary; }
  const std::string& to_config() const { return push_.to_config; }
  const std::string& pushed_config() const { return push_.pushed_config; }
  const std::string& rollback_config() const { return push_.rollback_config; }
  int64_t predicted_current() const { return push_.predicted_current; }
  int64_t predicted_switched() const { return push_.predicted.reserved; }
  bool lockstep() const { return push_.lockstep; }
  const Prediction& standing() const { return standing_; }
  // The job's config version once the push is set for the whole job (0: not).
  uint64_t job_version() const { return job_version_; }
  // Where the canary's ACK fell in its recorded stream (unset: it was not
  // recorded then).
  std::optional<uint64_t> pushed_at() const { return pushed_at_; }
  // What the job had requested at most when a judgement on its events
  // rolled the push back; 0 when the rollback is for good (a NACK, an OOM,
  // a failed push).
  int64_t rolled_back_on_requested() const { return rolled_back_on_requested_; }

  // Set for the whole job (a judgement does not change that).
  bool Applied() const;
  // Whether session `id` reporting `version` runs the pushed config.
  bool RunsPushedVersion(SessionId id, uint64_t version) const;

  // --- the ACK state machine
  // An answer of `session` to `version`.
  struct Ack {
    SessionId session = 0;
    uint64_t version = 0;
    bool applied = false;
    std::string error;
  };
  enum class AckResult {
    kIgnored,       // not the pushed version
    kHeld,          // came before the push returned its version: PushAnswered replays it
    kRefused,       // a NACK: roll back for good
    kRuns,          // the session runs the pushed config now
    kWatchStarted,  // kRuns, and the canary's watch began at `now`
  };
  AckResult Acked(const Ack& ack, absl::Time now, const std::optional<RecordedStream>& stream);
  // When the watch began (the canary's ACK).
  absl::Time watch_since() const { return watch_since_; }
  // The push to the canary returned `version`: the answers that came before,
  // for Acked again.
  std::vector<Ack> PushAnswered(uint64_t version);

  // --- the watch
  // A stats report of a session under the pushed version: `reserved` now,
  // `allocated` the most since its last report as far as it knows
  // (PyTorch's peak, which the job may reset, or the current). Updates the
  // realised peak and the prediction at need in `decision` (may be null);
  // `changed`: whether it did.
  Action Watch(int64_t reserved, int64_t allocated, absl::Time now,
               const std::optional<RecordedStream>& stream, AutotuneDecision* decision,
               bool& changed);
  // The canary's stream held `peak_held_requested` since the push at most.
  void SawRequested(int64_t peak_held_requested);
  // The canary's events arrived (`stream` after them): the promotion of a
  // lockstep push whose first step under it they judged (a step mark ends
  // it, which a stats report may not follow before the next step).
  Action Stepped(const std::optional<RecordedStream>& stream);
  // Keeps `decision`'s prediction for the steps the job really ran
  // (AutotuneDecision::predicted_peak_at_need) current with what the job
  // needed since the push; true when it changed.
  bool UpdatePredictionAtNeed(AutotuneDecision* decision) const;

  // Session `id` ended. When it was the canary: promote the push (a
  // judgement kept it, or its watch saw it within the margin over whole
  // steps), or, short of that, drop it unless it is set for the job
  // already (nothing beyond the canary was pushed, and the canary is gone).
  enum class Ended { kNothing, kPromoteKept, kPromoteWithinMargin, kDrop };
  Ended SessionEnded(SessionId id);

  // --- reprediction: the pushed config replayed on the canary's events
  // Whether the canary under watch requested more than the standing
  // prediction covered by kRepredictGrowth, and that peak has passed.
  bool WantsReprediction(const RecordedStream& stream) const;
  void RepredictionQueued();
  void RepredictionDone() { repredicting_ = false; }
  // Makes `p` the standing prediction when it covers more of what the job
  // requested; whether it did.
  bool TakePrediction(const Prediction& p);

  // --- judgement
  void StartJudging();
  // What the replays of a judgement found on the `events` events the
  // canary ran after the push: staying, keeping the push, and a rollback
  // (an error: they could not say). Writes the judgement into `decision`
  // (may be null); `reason` is why it was judged.
  struct Replays {
    absl::StatusOr<ReplayResult> stayed;
    absl::StatusOr<ReplayResult> kept;
    absl::StatusOr<RollbackPrediction> rollback;
  };
  Action Judged(const Replays& replays, uint64_t events, const std::string& reason,
                AutotuneDecision* decision);

  // --- promotion and rollback
  // Why the push is set for the job, for the config's history.
  std::string PromotionReason() const;
  // Set for the job as `version`, with the job's `sessions` (the canary's
  // first in `decision`).
  void Promoted(uint64_t version, const std::vector<SessionId>& sessions,
                AutotuneDecision* decision);
  // Setting it for the job failed: rolled back for good.
  Action PromotionFailed(const std::string& error);
  // Starts a rollback unless one is under way: `requested`, what the job
  // requested at most when rolled back for what it realised (0: for good).
  bool StartRollBack(int64_t requested);

 private:
  bool SettledUnderPush(const std::optional<RecordedStream>& stream) const;
  bool WatchedWithinMargin() const;
  bool FirstStepJudged(const std::optional<RecordedStream>& stream) const;
  Action PromoteToRanks();
  // The realised peak against what the push was predicted at, scaled by
  // the job's growth (Growth), and against staying: `past` when it left the
  // rollback margin, nearer to staying, and past the peak a judgement kept.
  struct Margin {
    double growth = 1.0;
    double expected = 0;
    bool past = false;
  };
  Margin CheckMargin() const;
  double Growth() const;
  double Growth(int64_t predicted_requested, int64_t predicted_allocated) const;

  Push push_;
  CanaryOptions options_;
  Phase phase_ = Phase::kPushed;
  uint64_t canary_version_ = 0;
  // The canary's answer when it came before the push returned.
  std::optional<std::pair<uint64_t, std::string>> early_nack_;
  std::optional<uint64_t> early_ack_;
  uint64_t job_version_ = 0;
  absl::Time watch_since_;
  // The newest prediction for the pushed config (see
  // AutotuneDecision::predicted_peak_at_need): the push's own until a
  // replay of the canary's events after the push or a later decision that
  // kept the config covers more of what the job requests.
  Prediction standing_;
  bool repredicting_ = false;  // a reprediction is queued or running
  // What the canary had requested when the last reprediction was queued.
  int64_t repredicted_on_ = 0;
  int64_t realized_peak_ = -1;
  int64_t realized_allocated_ = 0;  // PyTorch's peak in the stats reports
  // What the canary held requested since the push, as a replay from its
  // state counts it (JobWindow::peak_held_requested_bytes; 0: none yet).
  int64_t realized_requested_ = 0;
  std::optional<uint64_t> pushed_at_;
  uint64_t marks_at_push_ = 0;  // the canary's step marks then
  // The phase a judgement interrupted, and the realised peak it kept the
  // push at (0: never judged).
  Phase judged_from_ = Phase::kWatching;
  int64_t judged_realized_ = 0;
  // The recorded stream's length below which a judgement that found the
  // realised peak unexplained by the events waits (0: none waits).
  uint64_t judge_after_events_ = 0;
  // The recorded stream's length at the last stats report the watch found
  // within the rollback margin (0: none).
  uint64_t within_margin_at_ = 0;
  int64_t rolled_back_on_requested_ = 0;
  // Promoted once its first step under the push was judged (lockstep).
  bool promoted_on_first_step_ = false;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_CANARY_H_
