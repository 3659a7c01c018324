#include "server/autotune/grown_sizes.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(GrowRequestsTest, GrowsWhatIsAllocatedFromThePointOnAndKeepsWhatWasBefore) {
  TraceBuilder b;
  const uint32_t before = b.Alloc(100 * kMiB);  // event 0
  const uint32_t after = b.Alloc(1000);        // event 1
  b.Free(before);
  b.Free(after);
  b.Free(b.Alloc(3 * kMiB, /*stream=*/1));
  const Trace trace = b.Build();
  const Trace grown = GrowRequests(trace, /*from=*/1, 1.25);
  ASSERT_EQ(grown.events.size(), trace.events.size());
  EXPECT_EQ(grown.events[0].size, 100 * kMiB);
  EXPECT_EQ(grown.events[1].size, 1250u);
  EXPECT_EQ(grown.events[2], trace.events[2]);  // the free of what came before
  EXPECT_EQ(grown.events[6].size, 3 * kMiB + 3 * kMiB / 4);
  EXPECT_EQ(grown.events[6].stream, 1);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    EXPECT_EQ(grown.events[i].op, trace.events[i].op);
    EXPECT_EQ(grown.events[i].id, trace.events[i].id);
  }
  EXPECT_EQ(grown.num_ids, trace.num_ids);
}

// Steps that each hold `adds[k]` MiB on top of a resident 1 GiB; `marks`
// gets each step's end.
Trace Steps(const std::vector<uint64_t>& adds, std::vector<uint64_t>& marks) {
  TraceBuilder b;
  b.Alloc(1024 * kMiB);  // the model, never freed
  uint64_t events = 1;
  for (uint64_t add : adds) {
    const uint32_t first = b.Alloc(add * kMiB / 2);
    const uint32_t second = b.Alloc(add * kMiB / 2);
    b.Free(first).Free(second);
    events += 6;
    marks.push_back(events);
  }
  return b.Build();
}

TEST(StepGrowthTest, TheNewestStepsOwnPeakOverTheLargestBefore) {
  std::vector<uint64_t> marks;
  const Trace trace = Steps({100, 200, 160, 300}, marks);
  // The resident gigabyte counts in no step: 300 over 200.
  EXPECT_DOUBLE_EQ(*StepGrowth(trace, marks, std::nullopt), 1.5);
  // A newest step smaller than one before it.
  std::vector<uint64_t> shrinking_marks;
  const Trace shrinking = Steps({100, 200, 100}, shrinking_marks);
  EXPECT_DOUBLE_EQ(*StepGrowth(shrinking, shrinking_marks, std::nullopt), 0.5);
}

TEST(StepGrowthTest, WithoutMarksThePeriodsEndingAtTheTracesEnd) {
  std::vector<uint64_t> marks;
  const Trace trace = Steps({100, 100, 100, 250}, marks);
  // Events 0..24: periods of 6 ending at 25 (the first, with the model,
  // not counted).
  EXPECT_DOUBLE_EQ(*StepGrowth(trace, {}, uint64_t{6}), 2.5);
}

TEST(StepGrowthTest, NoneWithoutTwoWholeSteps) {
  std::vector<uint64_t> marks;
  const Trace trace = Steps({100, 200}, marks);
  EXPECT_FALSE(StepGrowth(trace, {marks.back()}, std::nullopt).has_value());
  EXPECT_FALSE(StepGrowth(trace, {}, std::nullopt).has_value());
  ASSERT_EQ(marks.size(), 2u);
  EXPECT_FALSE(StepGrowth(trace, marks, std::nullopt).has_value());
  // Three marks: two whole steps.
  std::vector<uint64_t> three = {1};
  three.insert(three.end(), marks.begin(), marks.end());
  EXPECT_DOUBLE_EQ(*StepGrowth(trace, three, std::nullopt), 2.0);
}

TEST(GrowthFactorsTest, AQuarterAndTheWindowsOwnGrowthUpToDoubled) {
  EXPECT_EQ(GrowthFactors(std::nullopt), std::vector<double>{kGrowBy});
  EXPECT_EQ(GrowthFactors(0.8), std::vector<double>{kGrowBy});
  EXPECT_EQ(GrowthFactors(1.25), std::vector<double>{kGrowBy});
  EXPECT_EQ(GrowthFactors(1.6), (std::vector<double>{kGrowBy, 1.6}));
  EXPECT_EQ(GrowthFactors(3.0), (std::vector<double>{kGrowBy, kMaxGrowth}));
}

// A buffer cut for a smaller request under PyTorch's defaults, so that it
// is asked for again in a segment of its own: expandable segments hold the
// two at any size; rounding to quarters of powers of two (the simpler
// alternative here) cuts larger blocks the same way.
TEST(CheckGrownSizesTest, ReplaysEachGrowthUnderStayingTheCandidateAndTheSimplerOne) {
  TraceBuilder b;
  for (int step = 0; step < 4; ++step) {
    b.Free(b.Alloc(480 * kMiB));
    const uint32_t first = b.Alloc(300 * kMiB);
    const uint32_t buffer = b.Alloc(480 * kMiB);
    b.Free(first).Free(buffer);
  }
  const Trace trace = b.Build();
  AllocatorConfig expandable;
  expandable.expandable_segments = true;
  AllocatorConfig rounded = *ParseAllocatorConfig("roundup_power2_divisions:4");
  GrownSizesOptions options{
      .replays = EvaluatorOptions{.live_start = LiveStart{AllocatorConfig{}, std::nullopt, 18}},
      .min_saving = 0.05,
      .factors = {1.25, 2.0}};
  const GrownSizesCheck check = CheckGrownSizes(trace, Candidate{}, Candidate{expandable},
                                                Candidate{rounded}, options);
  EXPECT_TRUE(check.holds);
  ASSERT_EQ(check.grown.size(), 2u);
  for (const GrownPeaks& p : check.grown) {
    EXPECT_LT(p.candidate.peak_reserved, p.staying.peak_reserved);
    EXPECT_LT(p.candidate.peak_reserved, p.simpler.peak_reserved);
  }
  EXPECT_LT(check.grown[0].staying.peak_reserved, check.grown[1].staying.peak_reserved);
  EXPECT_FALSE(check.failed.has_value());

  // Staying itself saves nothing: refused at the first growth.
  const GrownSizesCheck same =
      CheckGrownSizes(trace, Candidate{}, Candidate{}, std::nullopt, options);
  EXPECT_FALSE(same.holds);
  EXPECT_EQ(same.failed, 0u);
  ASSERT_EQ(same.grown.size(), 1u);
  EXPECT_EQ(same.grown[0].simpler.peak_reserved, same.grown[0].staying.peak_reserved);
}

}  // namespace
}  // namespace allocd
