#include "server/autotune/rollback_model.h"

#include <vector>

#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Staying 4 GiB on the events after the push; keeping the push 2 GiB and a
// rollback 3 GiB over their repeat.
RollbackPrediction RollbackLowerThanKeeping() {
  return {.staying = 4 * kGiB, .keeping = 3 * kGiB, .rolled_back = 2 * kGiB};
}

TEST(JudgePushTest, APushThatRealisedNoMoreThanStayingIsKept) {
  EXPECT_EQ(JudgePush(4 * kGiB, 4 * kGiB, 4 * kGiB, RollbackLowerThanKeeping(), 0.1),
            PushVerdict::kKeepNoWorse);
}

TEST(JudgePushTest, APushWhoseRollbackWouldLeaveTheJobNoLowerIsKept) {
  RollbackPrediction rollback = RollbackLowerThanKeeping();
  rollback.rolled_back = rollback.keeping;
  EXPECT_EQ(JudgePush(6 * kGiB, 4 * kGiB, 6 * kGiB, rollback, 0.1),
            PushVerdict::kKeepRollbackNoBetter);
}

// The generation job's rollback on the H200: realised 2.00 GiB where staying
// replayed to 1.46 and the pushed config to 0.76 on the same events. The
// peak came from events the window did not have yet: no verdict on them.
TEST(JudgePushTest, ARealisedPeakTheEventsDoNotAccountForWaitsForMoreEvents) {
  EXPECT_EQ(JudgePush(2 * kGiB, 146 * kGiB / 100, 76 * kGiB / 100, RollbackLowerThanKeeping(),
                      0.1),
            PushVerdict::kWaitForEvents);
  // Within the margin of the pushed config's replay, the events explain it.
  EXPECT_EQ(JudgePush(5 * kGiB, 4 * kGiB, 46 * kGiB / 10, RollbackLowerThanKeeping(), 0.1),
            PushVerdict::kRollBack);
}

TEST(JudgePushTest, APushTheEventsShowWorseThanStayingWithABetterRollbackIsRolledBack) {
  EXPECT_EQ(JudgePush(5 * kGiB, 4 * kGiB, 5 * kGiB, RollbackLowerThanKeeping(), 0.1),
            PushVerdict::kRollBack);
}

// Ids of the repeat are new; a free of what the repeat did not allocate is
// left out (live at the window's end, it stays live).
TEST(RepeatTailTest, RepeatsTheEventsFromTheGivenOneWithTheirOwnIds) {
  Trace window;
  window.streams = {0};
  window.num_ids = 2;
  window.events = {{.op = TraceOp::kAlloc, .id = 0, .size = 100},
                   {.op = TraceOp::kAlloc, .id = 1, .size = 200},
                   {.op = TraceOp::kFreeCompleted, .id = 0},
                   {.op = TraceOp::kFreeCompleted, .id = 1}};
  const Trace out = RepeatTail(window, 1);
  ASSERT_EQ(out.events.size(), 6u);
  EXPECT_EQ(out.num_ids, 3u);
  // The repeat: id 1's alloc as id 2, id 0's free left out, id 1's free as 2.
  EXPECT_EQ(out.events[4].op, TraceOp::kAlloc);
  EXPECT_EQ(out.events[4].id, 2u);
  EXPECT_EQ(out.events[4].size, 200u);
  EXPECT_EQ(out.events[5].op, TraceOp::kFreeCompleted);
  EXPECT_EQ(out.events[5].id, 2u);
  // From past the end: the window itself.
  EXPECT_EQ(RepeatTail(window, 4).events.size(), 4u);
}

}  // namespace
}  // namespace allocd
