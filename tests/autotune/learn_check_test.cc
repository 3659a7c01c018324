#include "server/autotune/learn_check.h"

#include <string>

#include "absl/status/statusor.h"
#include "allocator/trace/snapshot_reader.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// llama_lora's first 30% of events: the model built and its first steps,
// where how a run started matters most.
const Trace& LlamaLoraStart() {
  static const Trace* trace = [] {
    absl::StatusOr<Trace> t =
        ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
    EXPECT_TRUE(t.ok()) << t.status();
    auto* start = new Trace(t.ok() ? *std::move(t) : Trace{});
    start->events.resize(start->events.size() * 3 / 10);
    return start;
  }();
  return *trace;
}

// What the autotuner pushed a job started on roundup_power2_divisions:4
// after these events: switched there, it peaked 3.67 GiB against 4.65
// staying; from the start it peaks above staying.
constexpr char kPushedMidRun[] =
    "max_split_size_mb:128,max_non_split_rounding_mb:256,expandable_segments:True";
constexpr char kReplaced[] = "roundup_power2_divisions:4";

TEST(LearnCheckTest, APushThatPeaksAboveWhatTheRunHadFromTheStartIsNotLearned) {
  const LearnCheckInput in{.trace = LlamaLoraStart(),
                           .pushed = kPushedMidRun,
                           .alternatives = {kReplaced, "max_split_size_mb:64"}};
  absl::StatusOr<LearnedFromPush> learned = CheckLearned(in, 0.05, {});
  ASSERT_TRUE(learned.ok()) << learned.status();
  // The lowest of what the run had: max_split_size_mb:64 peaks higher still.
  EXPECT_EQ(learned->config, kReplaced) << learned->why;
  EXPECT_LT(learned->peak, learned->pushed_peak * 95 / 100) << learned->why;
  EXPECT_GT(learned->peak, 4 * kGiB);
  EXPECT_NE(learned->why.find("instead of the push's"), std::string::npos) << learned->why;
  EXPECT_NE(learned->why.find(GiB(learned->peak)), std::string::npos) << learned->why;
  EXPECT_NE(learned->why.find(GiB(learned->pushed_peak)), std::string::npos) << learned->why;
}

// Above by less than min_saving: a decision at the run's start would not
// have left the alternative for it either.
TEST(LearnCheckTest, APushAboveByLessThanTheMinimumSavingIsLearned) {
  const LearnCheckInput in{
      .trace = LlamaLoraStart(), .pushed = kPushedMidRun, .alternatives = {kReplaced}};
  absl::StatusOr<LearnedFromPush> learned = CheckLearned(in, 0.25, {});
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->config, kPushedMidRun) << learned->why;
  EXPECT_EQ(learned->peak, learned->pushed_peak);
  EXPECT_NE(learned->why.find("no config the run had without it peaks lower by more than 25%"),
            std::string::npos)
      << learned->why;
}

TEST(LearnCheckTest, APushBetterFromTheStartIsLearned) {
  const LearnCheckInput in{.trace = LlamaLoraStart(),
                           .pushed = "expandable_segments:True",
                           .alternatives = {"max_split_size_mb:64", ""}};
  absl::StatusOr<LearnedFromPush> learned = CheckLearned(in, 0.05, {});
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->config, "expandable_segments:True") << learned->why;
  EXPECT_GT(learned->pushed_peak, 0);
  EXPECT_NE(learned->why.find("(defaults) at"), std::string::npos) << learned->why;
}

// On a device of 3900 MiB, roundup_power2_divisions:4 runs out of memory
// on these events where expandable segments fit (both at about the
// device's size, the cache freed to fit): the one that ran out is the
// worse, pushed or not.
TEST(LearnCheckTest, AConfigThatRunsOutOfMemoryFromTheStartIsTheWorse) {
  ReplayOptions device;
  device.capacity = 3900 * (int64_t{1} << 20);
  absl::StatusOr<LearnedFromPush> learned =
      CheckLearned({.trace = LlamaLoraStart(),
                    .pushed = kReplaced,
                    .alternatives = {"expandable_segments:True"}},
                   0.05, device);
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->config, "expandable_segments:True") << learned->why;
  EXPECT_NE(learned->why.find("(out of memory)"), std::string::npos) << learned->why;
  EXPECT_NE(learned->why.find("from the start it runs out of memory"), std::string::npos)
      << learned->why;

  learned = CheckLearned({.trace = LlamaLoraStart(),
                          .pushed = "expandable_segments:True",
                          .alternatives = {kReplaced}},
                         0.05, device);
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->config, "expandable_segments:True") << learned->why;
  EXPECT_NE(learned->why.find("roundup_power2_divisions:4 runs out of memory"),
            std::string::npos)
      << learned->why;
}

TEST(LearnCheckTest, WithoutAlternativesThePushIsLearnedUnreplayed) {
  const LearnCheckInput in{.trace = LlamaLoraStart(), .pushed = kPushedMidRun};
  absl::StatusOr<LearnedFromPush> learned = CheckLearned(in, 0.05, {});
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->config, kPushedMidRun);
  EXPECT_EQ(learned->pushed_peak, 0);
}

TEST(LearnCheckTest, APushThatDoesNotParseIsAnError) {
  const LearnCheckInput in{
      .trace = LlamaLoraStart(), .pushed = "no_such_key:1", .alternatives = {kReplaced}};
  EXPECT_FALSE(CheckLearned(in, 0.05, {}).ok());
}

}  // namespace
}  // namespace allocd
