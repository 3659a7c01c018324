#include "server/autotune/canary.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace allocd {
namespace {

// Steps a job that marks them runs under a push before the push is judged
// on what it realised (Canary::SettledUnderPush).
constexpr uint64_t kStepsBeforeJudging = 2;
// Steps a lockstep canary runs under a push, within the margin, before the
// push reaches its other ranks (Canary::FirstStepJudged): the step the push
// landed in. The client sends its events before it ACKs a push, so that
// step is the canary's first mark after the ACK. A step past the margin
// waits for the judgement instead (kStepsBeforeJudging).
constexpr uint64_t kStepsBeforePromoting = 1;
// How much more than the standing prediction covered a canary under watch
// requests before its pushed config is replayed on its own events
// (WantsReprediction): the bound on a prediction's error. Scaled
// linearly past what a replay covered, expandable segments reserve more per
// byte of a larger step than per byte of the window's (on the H100
// llama_lora's 10% more requested cost 16% more reserved, generation's 75%
// more cost 85% more).
constexpr double kRepredictGrowth = 0.05;

}  // namespace

CanaryOptions CanaryOptionsOf(const AutotuneOptions& options) {
  return {.canary_window = options.canary_window,
          .rollback_margin = options.rollback_margin,
          .min_events_watched = options.first_pass_min_events};
}

Canary::Canary(Push push, CanaryOptions options)
    : push_(std::move(push)), options_(options), standing_(push_.predicted) {}

bool Canary::Applied() const {
  return phase_ == Phase::kApplied ||
         (phase_ == Phase::kJudging && judged_from_ == Phase::kApplied);
}

bool Canary::RunsPushedVersion(SessionId id, uint64_t version) const {
  return (id == push_.canary && version == canary_version_ && version != 0) ||
         (version == job_version_ && version != 0);
}

Canary::AckResult Canary::Acked(const Ack& ack, absl::Time now,
                                const std::optional<RecordedStream>& stream) {
  if (phase_ == Phase::kPushed && ack.session == push_.canary && canary_version_ == 0) {
    if (ack.applied) {
      early_ack_ = ack.version;
    } else {
      early_nack_ = {ack.version, ack.error};
    }
    return AckResult::kHeld;
  }
  if (!RunsPushedVersion(ack.session, ack.version)) return AckResult::kIgnored;
  if (!ack.applied) return AckResult::kRefused;
  if (phase_ != Phase::kPushed || ack.session != push_.canary) return AckResult::kRuns;
  phase_ = Phase::kWatching;
  watch_since_ = now;
  if (stream && stream->session == ack.session) {
    pushed_at_ = stream->total_events;
    marks_at_push_ = stream->steps_marked;
  }
  return AckResult::kWatchStarted;
}

std::vector<Canary::Ack> Canary::PushAnswered(uint64_t version) {
  canary_version_ = version;
  std::vector<Ack> answers;
  if (early_ack_ == version) answers.push_back({push_.canary, version, true, ""});
  if (early_nack_ && early_nack_->first == version) {
    answers.push_back({push_.canary, version, false, early_nack_->second});
  }
  return answers;
}

Canary::Action Canary::Watch(int64_t reserved, int64_t allocated, absl::Time now,
                             const std::optional<RecordedStream>& stream,
                             AutotuneDecision* decision, bool& changed) {
  changed = false;
  if (phase_ == Phase::kRollingBack || phase_ == Phase::kPushed) return {};
  realized_allocated_ = std::max(realized_allocated_, allocated);
  changed = UpdatePredictionAtNeed(decision);
  if (reserved > realized_peak_) {
    realized_peak_ = reserved;
    if (decision != nullptr) {
      decision->realized_peak = reserved;
      decision->realized_saving = push_.predicted_current - reserved;
      changed = true;
    }
  }
  if (phase_ == Phase::kJudging) return {};
  const auto [growth, expected, past] = CheckMargin();
  if (SettledUnderPush(stream) && past) {
    // A judgement that found the events short of the realised peak
    // waits for more of them; meanwhile the push is not promoted.
    if (stream && stream->total_events < judge_after_events_) return {};
    return {Next::kJudge,
            absl::StrFormat(
                "the realised peak %s is above the predicted %s by more than %.0f%%, and "
                "nearer to what staying was predicted to cost%s",
                GiB(realized_peak_), GiB(static_cast<int64_t>(expected)),
                100 * options_.rollback_margin,
                growth > 1.0
                    ? absl::StrFormat(" (%s predicted for the window, scaled by the job "
                                      "allocating %.2fx what it did there)",
                                      GiB(push_.predicted.reserved), growth)
                    : std::string()),
            false};
  }
  if (stream && stream->session == push_.canary && SettledUnderPush(stream)) {
    within_margin_at_ = stream->total_events;
  }
  if (phase_ == Phase::kWatching && now - watch_since_ >= options_.canary_window) {
    phase_ = Phase::kPromoting;
    return {Next::kPromote, "", false};
  }
  return FirstStepJudged(stream) ? PromoteToRanks() : Action{};
}

Canary::Action Canary::PromoteToRanks() {
  phase_ = Phase::kPromoting;
  promoted_on_first_step_ = true;
  return {Next::kPromote, "", false};
}

Canary::Margin Canary::CheckMargin() const {
  Margin m;
  m.growth = Growth();
  m.expected = static_cast<double>(push_.predicted.reserved) * m.growth;
  const double staying = static_cast<double>(push_.predicted_current) * m.growth;
  const double realized = static_cast<double>(realized_peak_);
  m.past = realized > m.expected * (1.0 + options_.rollback_margin) &&
           realized > (m.expected + staying) / 2 &&
           realized > static_cast<double>(judged_realized_) * (1.0 + options_.rollback_margin);
  return m;
}

void Canary::SawRequested(int64_t peak_held_requested) {
  realized_requested_ = std::max(realized_requested_, peak_held_requested);
}

Canary::Action Canary::Stepped(const std::optional<RecordedStream>& stream) {
  // A realised peak past the margin waits for the stats report that
  // brought it to ask for a judgement (Watch): no promotion before that.
  return FirstStepJudged(stream) ? PromoteToRanks() : Action{};
}

// Whether a lockstep push may reach the job's other ranks: its canary ran
// the step the push landed in (kStepsBeforePromoting) within the margin,
// with no judgement asked for, or, for a client that marks no steps, its
// watch found it within the margin over as many events after the push as
// a first pass decides on (WatchedWithinMargin). Its other ranks then run
// their old config a step or two more than the canary, where the
// canary_window let a job of 0.4 s steps run the harmful config on its
// other rank to its end (DDP on 2 x H200: 30 steps), and waiting for a
// whole step after that one left a rank 4 steps behind (DDP, 2 ranks on
// an H200, issue 40).
bool Canary::FirstStepJudged(const std::optional<RecordedStream>& stream) const {
  if (!push_.lockstep || phase_ != Phase::kWatching || !pushed_at_) return false;
  if (stream && stream->session == push_.canary && stream->steps_marked > 0) {
    return stream->steps_marked >= marks_at_push_ + kStepsBeforePromoting &&
           stream->total_events >= judge_after_events_ && !CheckMargin().past;
  }
  return WatchedWithinMargin();
}

// Whether a push can be judged on what the job realised: for a job that
// marks its steps, once the canary has marked kStepsBeforeJudging steps
// under it. The first step after a push pays for moving the job's memory
// over (the old config's segments still held beside the new one's), and
// a realised peak can reach the daemon before the events it came from:
// judged then, a push that saves memory was rolled back blind (on the
// H200, ResNet-50 from defaults at 0.1 s telemetry rounds: rolled back
// 0.6 s after its ACK, then 31% above staying).
bool Canary::SettledUnderPush(const std::optional<RecordedStream>& stream) const {
  if (!stream || stream->session != push_.canary || !pushed_at_ || stream->steps_marked == 0) {
    return true;
  }
  return stream->steps_marked >= marks_at_push_ + kStepsBeforeJudging;
}

// Whether a stats report of the canary found the push within the
// rollback margin once the steps a judgement waits for had run
// (SettledUnderPush), after the events a waiting judgement asked for, and
// at least as many recorded events after the push as a first pass decides
// on. (Watch judges a push the moment a report leaves the margin.)
bool Canary::WatchedWithinMargin() const {
  return pushed_at_ && within_margin_at_ >= judge_after_events_ &&
         within_margin_at_ >= *pushed_at_ + options_.min_events_watched;
}

// How much more the job needs since the push than in the window's events
// after the switch point (at least 1): on the canary's own stream once
// it sent events after the push (exact, and no job resets it), else on
// PyTorch's allocated peak in the stats reports. (A varying-shape job on
// an H100 that reset that peak every step showed little growth there
// while its later steps needed far more than the window's: its push was
// rolled back at 21.19 GiB realised against 8.90 predicted, where staying
// went on to cost it 69.8.)
double Canary::Growth() const {
  return Growth(push_.predicted.requested, push_.predicted.allocated);
}

// The same beyond what a prediction covered.
double Canary::Growth(int64_t predicted_requested, int64_t predicted_allocated) const {
  const auto ratio = [](int64_t realized, int64_t predicted) {
    return std::max(1.0, static_cast<double>(realized) / static_cast<double>(predicted));
  };
  if (realized_requested_ > 0 && predicted_requested > 0) {
    return ratio(realized_requested_, predicted_requested);
  }
  return predicted_allocated > 0 ? ratio(realized_allocated_, predicted_allocated) : 1.0;
}

bool Canary::UpdatePredictionAtNeed(AutotuneDecision* decision) const {
  if (decision == nullptr || standing_.reserved <= 0) return false;
  const auto at_need =
      static_cast<int64_t>(static_cast<double>(standing_.reserved) *
                           Growth(standing_.requested, standing_.allocated));
  const std::optional<int64_t> requested =
      realized_requested_ > 0 ? std::optional<int64_t>(realized_requested_) : std::nullopt;
  if (decision->predicted_peak_at_need == at_need &&
      decision->realized_peak_requested == requested) {
    return false;
  }
  decision->predicted_peak_at_need = at_need;
  decision->realized_peak_requested = requested;
  return true;
}

Canary::Ended Canary::SessionEnded(SessionId id) {
  if (id != push_.canary) return Ended::kNothing;
  const bool judged_kept = judged_realized_ > 0;
  if (phase_ == Phase::kWatching && (judged_kept || WatchedWithinMargin())) {
    phase_ = Phase::kPromoting;
    return judged_kept ? Ended::kPromoteKept : Ended::kPromoteWithinMargin;
  }
  return Applied() ? Ended::kNothing : Ended::kDrop;
}

bool Canary::WantsReprediction(const RecordedStream& stream) const {
  const bool watched = phase_ == Phase::kWatching || phase_ == Phase::kPromoting ||
                       phase_ == Phase::kJudging;
  return watched && !repredicting_ && standing_.requested > 0 &&
         static_cast<double>(realized_requested_) >
             (1.0 + kRepredictGrowth) *
                 static_cast<double>(std::max(standing_.requested, repredicted_on_)) &&
         stream.held_requested < stream.peak_held_requested;
}

void Canary::RepredictionQueued() {
  repredicting_ = true;
  repredicted_on_ = realized_requested_;
}

bool Canary::TakePrediction(const Prediction& p) {
  if (p.requested <= standing_.requested) return false;
  standing_ = p;
  return true;
}

void Canary::StartJudging() {
  judged_from_ = phase_;
  phase_ = Phase::kJudging;
}

Canary::Action Canary::Judged(const Replays& replays, uint64_t events, const std::string& reason,
                              AutotuneDecision* d) {
  const int64_t realized = realized_peak_;
  Action action;
  std::optional<std::string> kept_because;
  if (!replays.stayed.ok() || !replays.kept.ok() || !replays.rollback.ok()) {
    const absl::Status error = !replays.stayed.ok()
                                   ? replays.stayed.status()
                                   : (!replays.kept.ok() ? replays.kept.status()
                                                         : replays.rollback.status());
    kept_because = absl::StrCat("the events after the push do not replay (", error.message(),
                                "), so it cannot be said that staying would have cost less");
  } else {
    const RollbackPrediction& rollback = *replays.rollback;
    const int64_t staying = replays.stayed->after_switch->peak_reserved;
    if (d != nullptr) {
      d->staying_after_push = staying;
      d->rollback_after_push = rollback.rolled_back;
      d->keeping_after_push = rollback.keeping;
      d->judged_events = events;
    }
    const std::string judged = absl::StrFormat(
        "on the %d events the canary ran after the push, staying on %s replays to a peak of "
        "%s and the job realised %s",
        events, ConfigName(d != nullptr ? d->from_config : ""),
        GiB(staying), GiB(realized));
    const int64_t pushed_replayed = replays.kept->after_switch->peak_reserved;
    switch (JudgePush(realized, staying, pushed_replayed, rollback, options_.rollback_margin)) {
      case PushVerdict::kKeepNoWorse:
        kept_because = absl::StrCat(judged, ": no worse than not pushing");
        break;
      case PushVerdict::kKeepRollbackNoBetter:
        kept_because = absl::StrFormat(
            "%s; a rollback would leave it at %s over those events again (%s made under the "
            "push still reserved at the rollback), no lower than keeping the push (%s)",
            judged, GiB(rollback.rolled_back), GiB(rollback.held_at_rollback),
            GiB(rollback.keeping));
        break;
      case PushVerdict::kWaitForEvents:
        // Judged again once the canary has run as many events again; a
        // promotion the judgement interrupted waits for it.
        phase_ = judged_from_ == Phase::kPromoting ? Phase::kWatching : judged_from_;
        judge_after_events_ = *pushed_at_ + 2 * events;
        if (d != nullptr) {
          absl::StrAppend(&d->why, absl::StrFormat(
              "; %s, but the pushed config replays to %s on them: the realised peak came "
              "from events not recorded yet, so it is judged again once the canary has run "
              "%d events after the push",
              judged, GiB(pushed_replayed), 2 * events));
        }
        break;
      case PushVerdict::kRollBack:
        action = {Next::kRollBack,
                  absl::StrFormat(
                      "%s; %s (the pushed config replays to %s on them), above staying, and a "
                      "rollback is predicted at %s over those events again against %s keeping "
                      "the push",
                      reason, judged, GiB(pushed_replayed), GiB(rollback.rolled_back),
                      GiB(rollback.keeping)),
                  true};
        break;
    }
  }
  if (kept_because) {
    phase_ = judged_from_;
    judged_realized_ = realized;
    if (phase_ == Phase::kPromoting) action = {Next::kPromote, "", false};
    if (d != nullptr) absl::StrAppend(&d->why, "; ", reason, ", but ", *kept_because, ": kept");
  }
  return action;
}

std::string Canary::PromotionReason() const {
  if (promoted_on_first_step_) {
    return absl::StrFormat(
        "autotune decision %d: the canary rank ran its first step under it, peaking at %s "
        "(predicted %s); the job's ranks run in lockstep, so every rank runs it from now on",
        push_.decision_id, GiB(realized_peak_), GiB(push_.predicted.reserved));
  }
  return absl::StrFormat(
      "autotune decision %d: the canary ran it for %s, peaking at %s (predicted %s)",
      push_.decision_id, absl::FormatDuration(options_.canary_window), GiB(realized_peak_),
      GiB(push_.predicted.reserved));
}

void Canary::Promoted(uint64_t version, const std::vector<SessionId>& sessions,
                      AutotuneDecision* d) {
  phase_ = Phase::kApplied;
  job_version_ = version;
  if (d == nullptr) return;
  d->version = version;
  d->sessions = {push_.canary};
  for (SessionId s : sessions) {
    if (s != push_.canary) d->sessions.push_back(s);
  }
}

Canary::Action Canary::PromotionFailed(const std::string& error) {
  phase_ = Phase::kWatching;  // lets the rollback start
  return {Next::kRollBack, absl::StrCat("setting the job's config failed: ", error), false};
}

bool Canary::StartRollBack(int64_t requested) {
  if (phase_ == Phase::kRollingBack) return false;
  phase_ = Phase::kRollingBack;
  rolled_back_on_requested_ = requested;
  return true;
}

}  // namespace allocd
