#include "server/autotune/autotune_job.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/autotune/decider.h"

namespace allocd {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
const absl::Time kStart = absl::FromUnixSeconds(1000);

EvidenceEvent Alloc(uint64_t id, uint64_t size) { return {TraceOp::kAlloc, 7, id, size}; }
EvidenceEvent Free(uint64_t id) { return {TraceOp::kFreeRequested, 7, id, 0}; }
EvidenceEvent Mark() { return {kStepMark, 7, 0, 0}; }

AutotuneOptions Options() {
  AutotuneOptions options;
  options.first_pass_min_events = 4;
  options.first_pass_steps = 3;
  options.window_events = 100;
  options.growth_margin = 0.10;
  options.fragmentation_ratio = 1.5;
  options.fragmentation_for = absl::Seconds(30);
  return options;
}

AutotuneJob RecordingJob() {
  AutotuneJob job;
  job.sessions = {1};
  job.recorded = 1;
  job.window = std::make_unique<JobWindow>(100);
  return job;
}

TEST(AutotuneJobTest, KeepsTheNewestDecisionsAndFindsThemById) {
  AutotuneJob job;
  for (uint64_t id = 1; id <= 3; ++id) job.Record(AutotuneDecision{.id = id}, 2);
  EXPECT_EQ(job.FindDecision(1), nullptr);
  ASSERT_NE(job.FindDecision(3), nullptr);
  EXPECT_EQ(job.FindDecision(3)->id, 3u);
  EXPECT_EQ(job.history.size(), 2u);
}

TEST(AutotuneJobTest, AConfigRolledBackOnWhatItRealisedIsProposedAgainOnlyForLargerRequests) {
  AutotuneJob job;
  job.rolled_back["expandable_segments:True"] = 10 * kGiB;
  job.rolled_back["max_split_size_mb:64"] = kRolledBackForGood;
  EXPECT_FALSE(job.NotProposedAgain("garbage_collection_threshold:0.6", kGiB, 0.10));
  EXPECT_EQ(job.NotProposedAgain("max_split_size_mb:64", 100 * kGiB, 0.10),
            "; it was rolled back before, so it is not pushed again");
  EXPECT_TRUE(job.NotProposedAgain("expandable_segments:True", 11 * kGiB, 0.10));
  EXPECT_FALSE(job.NotProposedAgain("expandable_segments:True", 12 * kGiB, 0.10));
}

TEST(AutotuneJobTest, AMarkedJobIsDueItsFirstPassAfterItsSteps) {
  AutotuneJob job = RecordingJob();
  const AutotuneOptions options = Options();
  job.window->Add({Alloc(1, 100), Alloc(2, 100), Mark(), Alloc(3, 100), Mark()}, 0);
  EXPECT_FALSE(job.DueOnEvents(options));  // two marks of the three
  job.window->Add({Alloc(4, 100), Mark()}, 0);
  std::optional<AutotuneJob::Due> due = job.DueOnEvents(options);
  ASSERT_TRUE(due);
  EXPECT_EQ(due->trigger, AutotuneTrigger::kFirstPass);
  EXPECT_TRUE(due->first_pass);
  EXPECT_FALSE(due->probe);

  // On a harmful start config, after its first whole step.
  AutotuneJob harmful = RecordingJob();
  harmful.first_trigger = AutotuneTrigger::kBadStartConfig;
  harmful.window->Add({Alloc(1, 100), Alloc(2, 100), Mark(), Alloc(3, 100), Alloc(4, 100), Mark()},
                      0);
  due = harmful.DueOnEvents(options);
  ASSERT_TRUE(due);
  EXPECT_EQ(due->trigger, AutotuneTrigger::kBadStartConfig);
}

TEST(AutotuneJobTest, AnUnmarkedJobIsProbedAndThenWaitsForHalfAsManyEventsAgain) {
  AutotuneJob job = RecordingJob();
  job.next_first_pass_check = 4;
  job.window->Add({Alloc(1, 100), Alloc(2, 100), Alloc(3, 100)}, 0);
  EXPECT_FALSE(job.DueOnEvents(Options()));
  job.window->Add({Alloc(4, 100)}, 0);
  std::optional<AutotuneJob::Due> due = job.DueOnEvents(Options());
  ASSERT_TRUE(due);
  EXPECT_TRUE(due->probe);
  job.Probed(100);
  EXPECT_EQ(job.next_first_pass_check, 6u);
  EXPECT_FALSE(job.DueOnEvents(Options()));
}

TEST(AutotuneJobTest, ALargerRequestIsDueOnceItPeaked) {
  AutotuneJob job = RecordingJob();
  job.first_pass_done = true;
  job.decided_requested = 100;
  job.window->Add({Alloc(1, 200)}, 0);
  EXPECT_FALSE(job.DueOnEvents(Options()));  // not peaked yet
  job.window->Add({Free(1), Alloc(2, 1), Free(2), Alloc(3, 1)}, 0);
  std::optional<AutotuneJob::Due> due = job.DueOnEvents(Options());
  ASSERT_TRUE(due);
  EXPECT_EQ(due->trigger, AutotuneTrigger::kLargerRequest);
  EXPECT_FALSE(due->first_pass);
}

TEST(AutotuneJobTest, GrowsPastWhatItsConfigNeedsAndPastItsLastGrowthRun) {
  AutotuneJob job;
  job.first_pass_done = true;
  job.settled_need = 10 * kGiB;
  EXPECT_FALSE(job.Grew(11 * kGiB, 0.10));
  EXPECT_TRUE(job.Grew(12 * kGiB, 0.10));
  job.growth_reserved = 12 * kGiB;
  EXPECT_FALSE(job.Grew(13 * kGiB, 0.10));
  EXPECT_TRUE(job.Grew(14 * kGiB, 0.10));
}

TEST(AutotuneJobTest, ASessionFragmentedLongEnoughTriggersOnceAndStartsOver) {
  AutotuneSession session;
  const AutotuneOptions options = Options();
  EXPECT_FALSE(session.Fragmented(2 * kGiB, kGiB, kStart, options));  // starts the clock
  EXPECT_FALSE(session.Fragmented(2 * kGiB, kGiB, kStart + absl::Seconds(29), options));
  EXPECT_TRUE(session.Fragmented(2 * kGiB, kGiB, kStart + absl::Seconds(30), options));
  EXPECT_FALSE(session.Fragmented(2 * kGiB, kGiB, kStart + absl::Seconds(31), options));
  // Back under the ratio: the clock stops.
  EXPECT_FALSE(session.Fragmented(kGiB, kGiB, kStart + absl::Seconds(40), options));
  EXPECT_FALSE(session.fragmented_since.has_value());
}

TEST(AutotuneJobTest, AProposalInApplyModeStartsAPushOnTheOldestSession) {
  AutotuneJob job = RecordingJob();
  job.sessions = {4, 5};
  job.queued = true;
  Decision d;
  d.result = Decision::Result::kPropose;
  d.to_config = "expandable_segments:True";
  d.to.config.expandable_segments = true;
  d.predicted_peak_current = 10 * kGiB;
  d.predicted_peak_switched = 4 * kGiB;
  AutotuneDecision rec{.id = 9};
  const AutotuneJob::Taken taken =
      job.Decided(rec, d, RunningConfig{}, kGiB, AutotuneMode::kApply, Options(), kStart);
  EXPECT_EQ(rec.result, AutotuneResult::kPushed);
  EXPECT_EQ(rec.to_config, "expandable_segments:True");
  EXPECT_EQ(taken.canary, 4u);
  ASSERT_TRUE(job.acting);
  EXPECT_EQ(job.acting->decision_id(), 9u);
  EXPECT_EQ(job.acting->canary(), 4u);
  EXPECT_FALSE(job.queued);
  EXPECT_TRUE(job.first_pass_done);
  EXPECT_EQ(job.settled_need, 4 * kGiB);
  EXPECT_EQ(job.cooldown_until, kStart + Options().cooldown);
  ASSERT_NE(job.FindDecision(9), nullptr);

  // Recommend mode records the proposal and pushes nothing.
  AutotuneJob recommended = RecordingJob();
  AutotuneDecision other{.id = 10};
  EXPECT_FALSE(recommended
                   .Decided(other, d, RunningConfig{}, kGiB, AutotuneMode::kRecommend,
                            Options(), kStart)
                   .canary);
  EXPECT_EQ(other.result, AutotuneResult::kRecommended);
  EXPECT_FALSE(recommended.acting);
  EXPECT_EQ(recommended.settled_need, 10 * kGiB);
}

// A job of several ranks pushes in lockstep: every rank once the canary's
// first step under the push is judged (Canary::Push::lockstep).
TEST(AutotuneJobTest, AJobOfSeveralRanksPushesInLockstep) {
  Decision d;
  d.result = Decision::Result::kPropose;
  d.to_config = "expandable_segments:True";
  d.to.config.expandable_segments = true;
  d.predicted_peak_current = 10 * kGiB;
  d.predicted_peak_switched = 4 * kGiB;
  for (const bool lockstep : {false, true}) {
    AutotuneJob job = RecordingJob();
    job.sessions = {4, 5};
    job.lockstep = lockstep;
    AutotuneDecision rec{.id = 9};
    EXPECT_EQ(job.Decided(rec, d, RunningConfig{}, kGiB, AutotuneMode::kApply, Options(), kStart)
                  .canary,
              4u);
    ASSERT_TRUE(job.acting);
    EXPECT_EQ(job.acting->lockstep(), lockstep);
  }
}

}  // namespace
}  // namespace allocd
