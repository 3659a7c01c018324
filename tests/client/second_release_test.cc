#include "client/second_release.h"

#include <cstdint>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/client/fake_allocator_target.h"

namespace allocd {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// The release after a push, once what was live at the switch is gone.
class SecondReleaseTest : public ::testing::Test {
 protected:
  void Round(bool marks_steps) {
    release_.AtRound(target_.Stats(), marks_steps, target_);
  }

  FakeAllocatorTarget target_;
  SecondRelease release_;
};

TEST_F(SecondReleaseTest, NothingIsReleasedBeforeASwitch) {
  release_.AtStepMark(target_);
  target_.allocated = 0;
  Round(/*marks_steps=*/false);
  EXPECT_EQ(target_.empty_cache_calls, 0);
}

TEST_F(SecondReleaseTest, AJobThatMarksStepsIsReleasedAtItsNextMarkOnce) {
  target_.allocated = 8 * kGiB;  // mid-step: the step's activations are live
  release_.Switched(target_);
  target_.allocated = kGiB;
  Round(/*marks_steps=*/true);  // rounds leave it to the mark
  EXPECT_EQ(target_.empty_cache_calls, 0);
  release_.AtStepMark(target_);
  release_.AtStepMark(target_);
  EXPECT_EQ(target_.empty_cache_calls, 1);
  EXPECT_EQ(release_.releases(), 1);
}

TEST_F(SecondReleaseTest,
       AnUnmarkedJobIsReleasedOnceItHoldsLessThanAtTheSwitch) {
  target_.allocated = 3 * kGiB;  // a generation's KV cache is live
  release_.Switched(target_);
  for (int64_t allocated : {3 * kGiB, 4 * kGiB}) {  // the call goes on, and grows
    target_.allocated = allocated;
    Round(/*marks_steps=*/false);
  }
  EXPECT_EQ(target_.empty_cache_calls, 0);
  target_.allocated = kGiB;  // the call ended: its cache is free
  Round(/*marks_steps=*/false);
  Round(/*marks_steps=*/false);
  EXPECT_EQ(target_.empty_cache_calls, 1);
}

TEST_F(SecondReleaseTest,
       AnUnmarkedJobIsReleasedAgainAtEachLowerLowAtMostThreeTimes) {
  target_.allocated = 3 * kGiB;  // mid-call: the KV cache is live
  release_.Switched(target_);
  const struct {
    int64_t allocated;
    int released;
  } rounds[] = {{static_cast<int64_t>(2.9 * kGiB), 1},  // a dip between tokens
                {static_cast<int64_t>(2.8 * kGiB), 1},  // not 10% below it
                {kGiB, 2},                              // the call ended
                {static_cast<int64_t>(0.95 * kGiB), 2},
                {kGiB / 2, 3},
                {int64_t{1} << 20, 3}};  // three in all
  for (const auto& round : rounds) {
    target_.allocated = round.allocated;
    Round(/*marks_steps=*/false);
    EXPECT_EQ(target_.empty_cache_calls, round.released) << round.allocated;
  }
  release_.Switched(target_);  // a new switch releases anew
  target_.allocated = 0;
  Round(/*marks_steps=*/false);
  EXPECT_EQ(target_.empty_cache_calls, 4);
}

// A start config applied before the job allocated anything (advise()
// before the model) left no block of the old config to release.
TEST_F(SecondReleaseTest, ASwitchWithNothingAllocatedReleasesNothingLater) {
  target_.allocated = 2 * kGiB;
  release_.Switched(target_);
  target_.allocated = 0;
  release_.Switched(target_);  // a second switch, nothing live: none pending
  target_.allocated = kGiB;
  release_.AtStepMark(target_);
  Round(/*marks_steps=*/false);
  target_.allocated = 0;
  Round(/*marks_steps=*/false);
  EXPECT_EQ(target_.empty_cache_calls, 0);
  EXPECT_EQ(release_.releases(), 0);
}

TEST_F(SecondReleaseTest, ANewSwitchWaitsForItsOwnRelease) {
  target_.allocated = 2 * kGiB;
  release_.Switched(target_);
  release_.AtStepMark(target_);
  release_.Switched(target_);
  release_.AtStepMark(target_);
  EXPECT_EQ(target_.empty_cache_calls, 2);
}

}  // namespace
}  // namespace allocd
