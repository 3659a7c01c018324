#include "server/autotune/canary.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr SessionId kCanary = 1;
constexpr uint64_t kVersion = 5;
const absl::Time kAck = absl::FromUnixSeconds(1000);

// Predicted: staying 10 GiB, the push 4 GiB for a job that needs 3 GiB.
// `lockstep`: the canary is one of several ranks.
Canary NewCanary(bool lockstep = false) {
  return Canary(Canary::Push{.decision_id = 7,
                             .canary = kCanary,
                             .to_config = "expandable_segments:True",
                             .pushed_config = "expandable_segments:True",
                             .rollback_config = "max_split_size_mb:64",
                             .predicted_current = 10 * kGiB,
                             .predicted = {4 * kGiB, 3 * kGiB, 3 * kGiB},
                             .lockstep = lockstep},
                CanaryOptions{.canary_window = absl::Seconds(10),
                              .rollback_margin = 0.10,
                              .min_events_watched = 100});
}

// The canary's own stream, recorded, with no step marks.
RecordedStream CanaryStream(uint64_t total_events) {
  return {.session = kCanary, .total_events = total_events};
}

// A canary whose push returned kVersion and whose ACK started its watch at
// kAck, 1000 events into its recorded stream.
Canary Watching() {
  Canary canary = NewCanary();
  EXPECT_TRUE(canary.PushAnswered(kVersion).empty());
  EXPECT_EQ(canary.Acked({kCanary, kVersion, true, ""}, kAck, CanaryStream(1000)),
            Canary::AckResult::kWatchStarted);
  return canary;
}

Canary::Action Watch(Canary& canary, int64_t reserved, absl::Time now,
                     std::optional<RecordedStream> stream, AutotuneDecision* d = nullptr) {
  bool changed = false;
  return canary.Watch(reserved, 3 * kGiB, now, stream, d, changed);
}

ReplayResult AfterSwitchPeak(int64_t reserved) {
  ReplayResult r;
  r.after_switch.emplace();
  r.after_switch->peak_reserved = reserved;
  return r;
}

TEST(CanaryTest, AnAckStartsTheWatchWhereTheCanaryIsRecorded) {
  Canary canary = NewCanary();
  EXPECT_EQ(canary.phase(), Canary::Phase::kPushed);
  EXPECT_TRUE(canary.PushAnswered(kVersion).empty());
  EXPECT_EQ(canary.Acked({kCanary, kVersion, true, ""}, kAck, CanaryStream(1000)),
            Canary::AckResult::kWatchStarted);
  EXPECT_EQ(canary.phase(), Canary::Phase::kWatching);
  EXPECT_EQ(canary.watch_since(), kAck);
  EXPECT_EQ(canary.pushed_at(), 1000u);
  EXPECT_TRUE(canary.RunsPushedVersion(kCanary, kVersion));
  EXPECT_FALSE(canary.RunsPushedVersion(2, kVersion));  // another session: not pushed to
  EXPECT_FALSE(canary.RunsPushedVersion(kCanary, kVersion - 1));
  // Answered again: it runs it, the watch goes on.
  EXPECT_EQ(canary.Acked({kCanary, kVersion, true, ""}, kAck + absl::Seconds(1), std::nullopt),
            Canary::AckResult::kRuns);
  EXPECT_EQ(canary.watch_since(), kAck);
}

TEST(CanaryTest, AWatchWhileAnotherSessionIsRecordedHasNoPushPoint) {
  Canary canary = NewCanary();
  canary.PushAnswered(kVersion);
  RecordedStream other = CanaryStream(1000);
  other.session = 2;
  EXPECT_EQ(canary.Acked({kCanary, kVersion, true, ""}, kAck, other),
            Canary::AckResult::kWatchStarted);
  EXPECT_FALSE(canary.pushed_at().has_value());
}

TEST(CanaryTest, AnAnswerBeforeThePushReturnedIsHeldUntilItDoes) {
  Canary canary = NewCanary();
  EXPECT_EQ(canary.Acked({kCanary, kVersion, true, ""}, kAck, std::nullopt),
            Canary::AckResult::kHeld);
  EXPECT_EQ(canary.phase(), Canary::Phase::kPushed);
  const std::vector<Canary::Ack> held = canary.PushAnswered(kVersion);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].session, kCanary);
  EXPECT_EQ(held[0].version, kVersion);
  EXPECT_TRUE(held[0].applied);
  EXPECT_EQ(canary.Acked(held[0], kAck, std::nullopt), Canary::AckResult::kWatchStarted);

  Canary refused = NewCanary();
  EXPECT_EQ(refused.Acked({kCanary, kVersion, false, "unknown key"}, kAck, std::nullopt),
            Canary::AckResult::kHeld);
  // An early answer to another version than the push returned is dropped.
  Canary other = NewCanary();
  EXPECT_EQ(other.Acked({kCanary, kVersion + 1, true, ""}, kAck, std::nullopt),
            Canary::AckResult::kHeld);
  EXPECT_TRUE(other.PushAnswered(kVersion).empty());
  const std::vector<Canary::Ack> nack = refused.PushAnswered(kVersion);
  ASSERT_EQ(nack.size(), 1u);
  EXPECT_FALSE(nack[0].applied);
  EXPECT_EQ(nack[0].error, "unknown key");
  EXPECT_EQ(refused.Acked(nack[0], kAck, std::nullopt), Canary::AckResult::kRefused);
}

TEST(CanaryTest, ANackRollsBackForGoodOnce) {
  Canary canary = NewCanary();
  canary.PushAnswered(kVersion);
  EXPECT_EQ(canary.Acked({kCanary, kVersion - 1, false, "old"}, kAck, std::nullopt),
            Canary::AckResult::kIgnored);
  EXPECT_EQ(canary.Acked({kCanary, kVersion, false, "bad"}, kAck, std::nullopt),
            Canary::AckResult::kRefused);
  EXPECT_TRUE(canary.StartRollBack(0));
  EXPECT_EQ(canary.phase(), Canary::Phase::kRollingBack);
  EXPECT_EQ(canary.rolled_back_on_requested(), 0);
  EXPECT_FALSE(canary.StartRollBack(0));  // one rollback at a time
  // A rollback under way watches nothing.
  EXPECT_EQ(Watch(canary, 20 * kGiB, kAck + absl::Minutes(1), CanaryStream(5000)).next,
            Canary::Next::kNothing);
}

TEST(CanaryTest, AWatchWithinTheMarginPromotesAfterTheWindow) {
  Canary canary = Watching();
  AutotuneDecision d;
  bool changed = false;
  EXPECT_EQ(canary.Watch(4 * kGiB, 3 * kGiB, kAck + absl::Seconds(5), CanaryStream(1500), &d,
                         changed)
                .next,
            Canary::Next::kNothing);
  EXPECT_TRUE(changed);
  EXPECT_EQ(d.realized_peak, 4 * kGiB);
  EXPECT_EQ(d.realized_saving, 6 * kGiB);
  EXPECT_EQ(d.predicted_peak_at_need, 4 * kGiB);
  EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(10), CanaryStream(2000)).next,
            Canary::Next::kPromote);
  EXPECT_EQ(canary.phase(), Canary::Phase::kPromoting);
  EXPECT_FALSE(canary.Applied());

  canary.Promoted(9, {2, kCanary, 3}, &d);
  EXPECT_EQ(canary.phase(), Canary::Phase::kApplied);
  EXPECT_TRUE(canary.Applied());
  EXPECT_EQ(canary.job_version(), 9u);
  EXPECT_EQ(d.version, 9u);
  EXPECT_EQ(d.sessions, (std::vector<uint64_t>{kCanary, 2, 3}));
  EXPECT_TRUE(canary.RunsPushedVersion(2, 9));  // every session of the job now
}

TEST(CanaryTest, AFailedPromotionRollsBackForGood) {
  Canary canary = Watching();
  ASSERT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(10), CanaryStream(2000)).next,
            Canary::Next::kPromote);
  const Canary::Action action = canary.PromotionFailed("no session");
  EXPECT_EQ(action.next, Canary::Next::kRollBack);
  EXPECT_FALSE(action.for_what_it_realised);
  EXPECT_EQ(action.reason, "setting the job's config failed: no session");
  EXPECT_TRUE(canary.StartRollBack(0));
}

TEST(CanaryTest, ARealisedPeakPastTheMarginIsJudged) {
  Canary canary = Watching();
  const Canary::Action action =
      Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), CanaryStream(1500));
  EXPECT_EQ(action.next, Canary::Next::kJudge);
  EXPECT_EQ(action.reason,
            "the realised peak 9.00 GiB is above the predicted 4.00 GiB by more than 10%, and "
            "nearer to what staying was predicted to cost");
  canary.StartJudging();
  EXPECT_EQ(canary.phase(), Canary::Phase::kJudging);
  // Under judgement, reports update the peak but start nothing.
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(20), CanaryStream(1600)).next,
            Canary::Next::kNothing);
}

// The first steps after a push pay for moving the job's memory over: a job
// that marks its steps is judged only once it has run two under the push.
TEST(CanaryTest, AMarkedJobIsJudgedOnlyAfterTwoStepsUnderThePush) {
  Canary canary = NewCanary();
  canary.PushAnswered(kVersion);
  RecordedStream stream = CanaryStream(1000);
  stream.steps_marked = 4;
  canary.Acked({kCanary, kVersion, true, ""}, kAck, stream);
  stream.steps_marked = 5;
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), stream).next,
            Canary::Next::kNothing);
  stream.steps_marked = 6;
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(2), stream).next,
            Canary::Next::kJudge);
}

TEST(CanaryTest, AJudgementThatKeepsThePushResumesWhatItInterrupted) {
  Canary canary = Watching();
  ASSERT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), CanaryStream(1500)).next,
            Canary::Next::kJudge);
  canary.StartJudging();
  AutotuneDecision d;
  // Staying would have cost more on the same events.
  const Canary::Action action = canary.Judged(
      {AfterSwitchPeak(12 * kGiB), AfterSwitchPeak(9 * kGiB),
       RollbackPrediction{.keeping = 9 * kGiB, .rolled_back = 11 * kGiB}},
      500, "judged", &d);
  EXPECT_EQ(action.next, Canary::Next::kNothing);
  EXPECT_EQ(canary.phase(), Canary::Phase::kWatching);
  EXPECT_EQ(d.staying_after_push, 12 * kGiB);
  EXPECT_EQ(d.judged_events, 500u);
  EXPECT_NE(d.why.find("no worse than not pushing: kept"), std::string::npos) << d.why;
  // Kept at 9 GiB: judged again only past it by the margin.
  EXPECT_EQ(Watch(canary, 9 * kGiB + kGiB / 2, kAck + absl::Seconds(2), CanaryStream(1600)).next,
            Canary::Next::kNothing);
  // And, kept by a judgement, it is set for the job when its canary ends.
  EXPECT_EQ(canary.SessionEnded(kCanary), Canary::Ended::kPromoteKept);
  EXPECT_EQ(canary.phase(), Canary::Phase::kPromoting);
}

TEST(CanaryTest, AJudgementOfAPromotionItInterruptedPromotesWhenKept) {
  Canary canary = Watching();
  ASSERT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(10), CanaryStream(2000)).next,
            Canary::Next::kPromote);
  ASSERT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(11), CanaryStream(2100)).next,
            Canary::Next::kJudge);
  canary.StartJudging();
  const Canary::Action action = canary.Judged(
      {absl::InternalError("replay failed"), AfterSwitchPeak(9 * kGiB), RollbackPrediction{}},
      500, "judged", nullptr);
  EXPECT_EQ(action.next, Canary::Next::kPromote);
  EXPECT_EQ(canary.phase(), Canary::Phase::kPromoting);
}

TEST(CanaryTest, AJudgementShortOfEventsWaitsForTwiceAsMany) {
  Canary canary = Watching();  // pushed at event 1000
  ASSERT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), CanaryStream(1500)).next,
            Canary::Next::kJudge);
  canary.StartJudging();
  // The pushed config replays to far less than the job realised.
  const Canary::Action action = canary.Judged(
      {AfterSwitchPeak(5 * kGiB), AfterSwitchPeak(4 * kGiB),
       RollbackPrediction{.keeping = 9 * kGiB, .rolled_back = 6 * kGiB}},
      500, "judged", nullptr);
  EXPECT_EQ(action.next, Canary::Next::kNothing);
  EXPECT_EQ(canary.phase(), Canary::Phase::kWatching);
  // Not judged again before event 1000 + 2 * 500.
  EXPECT_EQ(Watch(canary, 10 * kGiB, kAck + absl::Seconds(2), CanaryStream(1999)).next,
            Canary::Next::kNothing);
  EXPECT_EQ(Watch(canary, 10 * kGiB, kAck + absl::Seconds(3), CanaryStream(2000)).next,
            Canary::Next::kJudge);
}

TEST(CanaryTest, AJudgementThatFindsThePushWorseRollsItBackOnWhatItRealised) {
  Canary canary = Watching();
  ASSERT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), CanaryStream(1500)).next,
            Canary::Next::kJudge);
  canary.StartJudging();
  const Canary::Action action = canary.Judged(
      {AfterSwitchPeak(5 * kGiB), AfterSwitchPeak(9 * kGiB),
       RollbackPrediction{.keeping = 9 * kGiB, .rolled_back = 6 * kGiB}},
      500, "judged", nullptr);
  EXPECT_EQ(action.next, Canary::Next::kRollBack);
  EXPECT_TRUE(action.for_what_it_realised);
  EXPECT_EQ(action.reason.rfind("judged; on the 500 events the canary ran after the push", 0),
            0u)
      << action.reason;
  EXPECT_EQ(canary.phase(), Canary::Phase::kJudging);
  EXPECT_TRUE(canary.StartRollBack(7 * kGiB));
  EXPECT_EQ(canary.rolled_back_on_requested(), 7 * kGiB);
}

TEST(CanaryTest, ACanaryThatEndsEarlyPromotesOnlyWhatItsWatchCovered) {
  // Ended before the watch saw enough events after the push: dropped.
  Canary early = Watching();
  Watch(early, 4 * kGiB, kAck + absl::Seconds(1), CanaryStream(1050));
  EXPECT_EQ(early.SessionEnded(2), Canary::Ended::kNothing);  // not the canary
  EXPECT_EQ(early.SessionEnded(kCanary), Canary::Ended::kDrop);

  // Within the margin over min_events_watched events after the push: set.
  Canary watched = Watching();
  Watch(watched, 4 * kGiB, kAck + absl::Seconds(1), CanaryStream(1100));
  EXPECT_EQ(watched.SessionEnded(kCanary), Canary::Ended::kPromoteWithinMargin);

  // Set for the job already: nothing to do.
  Canary applied = Watching();
  Watch(applied, 4 * kGiB, kAck + absl::Seconds(10), CanaryStream(1100));
  applied.Promoted(9, {kCanary}, nullptr);
  EXPECT_EQ(applied.SessionEnded(kCanary), Canary::Ended::kNothing);
}

TEST(CanaryTest, ACanaryRequestingMoreThanPredictedIsRepredictedOnceItsPeakPassed) {
  Canary canary = Watching();
  RecordedStream stream = CanaryStream(1500);
  stream.held_requested = 2 * kGiB;
  stream.peak_held_requested = 4 * kGiB;
  canary.SawRequested(3 * kGiB);  // within what the push predicted
  EXPECT_FALSE(canary.WantsReprediction(stream));
  canary.SawRequested(4 * kGiB);
  EXPECT_TRUE(canary.WantsReprediction(stream));
  stream.held_requested = 4 * kGiB;  // still at its peak
  EXPECT_FALSE(canary.WantsReprediction(stream));
  stream.held_requested = 2 * kGiB;
  canary.RepredictionQueued();
  EXPECT_FALSE(canary.WantsReprediction(stream));  // one at a time
  canary.RepredictionDone();
  EXPECT_FALSE(canary.WantsReprediction(stream));  // nothing new since it was queued

  // A prediction covering more becomes the standing one; one covering less
  // does not.
  EXPECT_FALSE(canary.TakePrediction({5 * kGiB, 3 * kGiB, 2 * kGiB}));
  EXPECT_TRUE(canary.TakePrediction({6 * kGiB, 4 * kGiB, 4 * kGiB}));
  EXPECT_EQ(canary.standing().reserved, 6 * kGiB);
  AutotuneDecision d;
  EXPECT_TRUE(canary.UpdatePredictionAtNeed(&d));
  EXPECT_EQ(d.predicted_peak_at_need, 6 * kGiB);
  EXPECT_EQ(d.realized_peak_requested, 4 * kGiB);
  EXPECT_FALSE(canary.UpdatePredictionAtNeed(&d));  // unchanged
}

// The ranks of a job run in lockstep, so the job needs what its worst rank
// needs: a canary rank's push reaches the other ranks once the step the
// push landed in is judged within the margin (the client sent its events
// before its ACK, so that step is its first mark after it), not after the
// canary_window, which a DDP job of 0.4 s steps outlived on its other rank,
// nor a whole step later, which left a rank 4 steps behind (issue 40).
TEST(CanaryTest, ALockstepCanaryThatMarksStepsPromotesAfterItsFirstStepUnderThePush) {
  Canary canary = NewCanary(/*lockstep=*/true);
  EXPECT_TRUE(canary.lockstep());
  canary.PushAnswered(kVersion);
  RecordedStream stream = CanaryStream(1000);
  stream.steps_marked = 4;
  canary.Acked({kCanary, kVersion, true, ""}, kAck, stream);
  // Events of the step under way: not judged yet.
  stream.total_events = 1100;
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);
  EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Milliseconds(100), stream).next,
            Canary::Next::kNothing);
  // The step the push landed in ends within the margin: every rank.
  stream.steps_marked = 5;
  stream.total_events = 1200;
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kPromote);
  EXPECT_EQ(canary.phase(), Canary::Phase::kPromoting);
  EXPECT_NE(canary.PromotionReason().find("first step"), std::string::npos)
      << canary.PromotionReason();
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);  // once
  AutotuneDecision d;
  canary.Promoted(9, {kCanary, 2}, &d);
  EXPECT_TRUE(canary.RunsPushedVersion(2, 9));
  EXPECT_EQ(d.sessions, (std::vector<uint64_t>{kCanary, 2}));
}

// A stats report after the first step promotes as well (the step mark came
// with no event batch after it yet); one that is not a rank's waits for the
// canary_window.
TEST(CanaryTest, OnlyALockstepCanaryIsPromotedBeforeItsWindow) {
  for (const bool lockstep : {false, true}) {
    Canary canary = NewCanary(lockstep);
    canary.PushAnswered(kVersion);
    RecordedStream stream = CanaryStream(1000);
    stream.steps_marked = 4;
    canary.Acked({kCanary, kVersion, true, ""}, kAck, stream);
    stream.steps_marked = 6;
    stream.total_events = 1400;
    EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(1), stream).next,
              lockstep ? Canary::Next::kPromote : Canary::Next::kNothing)
        << lockstep;
    if (!lockstep) {
      EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);
      EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(10), stream).next,
                Canary::Next::kPromote);
    }
  }
}

// A first step that leaves the margin is not promoted: it is judged once
// the canary settled under the push (a rollback then reaches only the
// canary), and promoted when the judgement keeps it.
TEST(CanaryTest, ALockstepCanaryPastTheMarginAtItsFirstStepIsJudgedFirst) {
  Canary canary = NewCanary(/*lockstep=*/true);
  canary.PushAnswered(kVersion);
  RecordedStream stream = CanaryStream(1000);
  stream.steps_marked = 4;
  canary.Acked({kCanary, kVersion, true, ""}, kAck, stream);
  stream.steps_marked = 5;
  stream.total_events = 1200;
  // The step it landed in peaked past the margin (the old config's
  // segments beside the new one's): neither promoted nor judged yet.
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Milliseconds(100), stream).next,
            Canary::Next::kNothing);
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);
  stream.steps_marked = 6;
  stream.total_events = 1400;
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(1), stream).next,
            Canary::Next::kJudge);
  canary.StartJudging();
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kNothing);
  // Kept: no worse than staying on the canary's own events.
  EXPECT_EQ(canary
                .Judged({AfterSwitchPeak(12 * kGiB), AfterSwitchPeak(9 * kGiB),
                         RollbackPrediction{.keeping = 9 * kGiB, .rolled_back = 11 * kGiB}},
                        400, "past the margin", nullptr)
                .next,
            Canary::Next::kNothing);
  EXPECT_EQ(canary.phase(), Canary::Phase::kWatching);
  stream.steps_marked = 7;
  stream.total_events = 1600;
  EXPECT_EQ(canary.Stepped(stream).next, Canary::Next::kPromote);
}

// A rank whose client marks no steps is promoted once its watch found the
// push within the margin over a first pass's events after it.
TEST(CanaryTest, ALockstepCanaryThatMarksNoStepsPromotesOnceWatchedOverAFirstPassOfEvents) {
  Canary canary = NewCanary(/*lockstep=*/true);
  canary.PushAnswered(kVersion);
  canary.Acked({kCanary, kVersion, true, ""}, kAck, CanaryStream(1000));
  EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(1), CanaryStream(1050)).next,
            Canary::Next::kNothing);
  EXPECT_EQ(canary.Stepped(CanaryStream(1099)).next, Canary::Next::kNothing);
  EXPECT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(2), CanaryStream(1100)).next,
            Canary::Next::kPromote);
}

// Set for every rank, the push rolls back on any of them: a NACK of the
// job's version, or a realised peak past the margin on another rank.
TEST(CanaryTest, AnyRankUnderThePromotedVersionCanRollItBack) {
  Canary canary = NewCanary(/*lockstep=*/true);
  canary.PushAnswered(kVersion);
  canary.Acked({kCanary, kVersion, true, ""}, kAck, CanaryStream(1000));
  ASSERT_EQ(Watch(canary, 4 * kGiB, kAck + absl::Seconds(1), CanaryStream(1100)).next,
            Canary::Next::kPromote);
  canary.Promoted(9, {kCanary, 2}, nullptr);
  EXPECT_EQ(canary.Acked({2, 9, false, "rejected"}, kAck + absl::Seconds(2), std::nullopt),
            Canary::AckResult::kRefused);
  // Rank 2's report under the job's version, seen as the job's realised peak.
  EXPECT_EQ(Watch(canary, 9 * kGiB, kAck + absl::Seconds(3), CanaryStream(1200)).next,
            Canary::Next::kJudge);
}

}  // namespace
}  // namespace allocd
