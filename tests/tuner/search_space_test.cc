#include "tuner/search_space.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using testing::HasSubstr;

TEST(SearchSpaceTest, DefaultSpaceCoversEveryKnobWithDefaultsFirst) {
  const SearchSpace space = DefaultSearchSpace();
  EXPECT_FALSE(space.max_split_size_mb.front().has_value());
  EXPECT_EQ(space.max_non_split_rounding_mb.front(), 20u);
  EXPECT_EQ(RoundupLabel(space.roundup_power2_divisions.front()), "unset");
  EXPECT_FALSE(space.expandable_segments.front());
  EXPECT_EQ(space.garbage_collection.front().threshold, 0.0);
  EXPECT_EQ(space.GridSize(), space.max_split_size_mb.size() *
                                  space.max_non_split_rounding_mb.size() *
                                  space.roundup_power2_divisions.size() * 2 *
                                  space.garbage_collection.size());
  // Every value is one PyTorch accepts: the smallest max_split_size_mb is 20.
  for (const auto& mb : space.max_split_size_mb) {
    if (mb) {
      EXPECT_GE(*mb, 20u);
    }
  }
}

TEST(SearchSpaceTest, RangeIsEveryPowerOfTwoBetweenTheEnds) {
  absl::StatusOr<SearchSpace> space =
      ApplySpaceSpec(DefaultSearchSpace(), "max_split_size_mb=48..1024");
  ASSERT_TRUE(space.ok()) << space.status();
  std::vector<size_t> values;
  for (const auto& mb : space->max_split_size_mb) values.push_back(*mb);
  EXPECT_EQ(values, (std::vector<size_t>{48, 64, 128, 256, 512, 1024}));
}

TEST(SearchSpaceTest, ListsUnsetAndBracketedRoundupValues) {
  absl::StatusOr<SearchSpace> space = ApplySpaceSpec(
      DefaultSearchSpace(),
      "max_split_size_mb=unset|128,roundup_power2_divisions=unset|4|[256:1,>:8],"
      "expandable_segments=True");
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_EQ(space->max_split_size_mb.size(), 2u);
  EXPECT_FALSE(space->max_split_size_mb[0].has_value());
  EXPECT_EQ(*space->max_split_size_mb[1], 128u);
  ASSERT_EQ(space->roundup_power2_divisions.size(), 3u);
  EXPECT_EQ(RoundupLabel(space->roundup_power2_divisions[1]), "4");
  // [256:1,>:8]: intervals up to 256 MiB get 1, everything after 8.
  EXPECT_EQ(space->roundup_power2_divisions[2][0], 1u);
  EXPECT_EQ(space->roundup_power2_divisions[2][8], 1u);
  EXPECT_EQ(space->roundup_power2_divisions[2][9], 8u);
  EXPECT_EQ(space->expandable_segments, std::vector<bool>{true});
}

TEST(SearchSpaceTest, GcThresholdsCombineWithHeadrooms) {
  absl::StatusOr<SearchSpace> space = ApplySpaceSpec(
      DefaultSearchSpace(), "garbage_collection_threshold=0.7|0.9,gc_headroom=0.5");
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_EQ(space->garbage_collection.size(), 3u);  // off, 0.7, 0.9
  EXPECT_EQ(space->garbage_collection[0].threshold, 0.0);
  EXPECT_EQ(space->garbage_collection[1], (GcSetting{0.7, 0.5}));
  EXPECT_EQ(space->garbage_collection[2], (GcSetting{0.9, 0.5}));
}

TEST(SearchSpaceTest, RejectsWhatPyTorchRejects) {
  const SearchSpace base = DefaultSearchSpace();
  absl::StatusOr<SearchSpace> small = ApplySpaceSpec(base, "max_split_size_mb=10|64");
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("max_split_size_mb"));
  EXPECT_FALSE(ApplySpaceSpec(base, "expandable_segments=true").ok());
  EXPECT_FALSE(ApplySpaceSpec(base, "roundup_power2_divisions=3").ok());
  EXPECT_FALSE(ApplySpaceSpec(base, "garbage_collection_threshold=1.5").ok());
}

TEST(SearchSpaceTest, RejectsMalformedSpecsClearly) {
  const SearchSpace base = DefaultSearchSpace();
  absl::StatusOr<SearchSpace> unknown = ApplySpaceSpec(base, "max_split=64");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown dimension"));
  EXPECT_FALSE(ApplySpaceSpec(base, "max_split_size_mb").ok());
  EXPECT_FALSE(ApplySpaceSpec(base, "max_split_size_mb=1024..64").ok());
  EXPECT_FALSE(ApplySpaceSpec(base, "max_non_split_rounding_mb=abc").ok());
}

TEST(SearchSpaceTest, EmptySpecKeepsTheSpace) {
  absl::StatusOr<SearchSpace> space = ApplySpaceSpec(DefaultSearchSpace(), "");
  ASSERT_TRUE(space.ok());
  EXPECT_EQ(space->GridSize(), DefaultSearchSpace().GridSize());
}

TEST(SearchSpaceTest, CandidatesDropKnobsThatCannotAct) {
  const SearchSpace space = DefaultSearchSpace();
  SpacePoint p;
  p.rounding = 2;  // 256 MiB, but max_split_size is unset
  const Candidate c = MakeCandidate(space, p, 1 << 30, 80ull << 30);
  EXPECT_EQ(c, Candidate{});
  EXPECT_EQ(CandidateKey(c), "");
}

TEST(SearchSpaceTest, GcFractionIsHeadroomOverPeakAllocated) {
  const SearchSpace space = DefaultSearchSpace();
  SpacePoint p;
  p.gc = 1;  // threshold 0.5, headroom 0.25
  ASSERT_EQ(space.garbage_collection[1], (GcSetting{0.5, 0.25}));
  // 8 GiB allocated at peak on an 80 GiB device: 1.25 x 8 / 80 = 0.125.
  const Candidate c = MakeCandidate(space, p, 8ull << 30, 80ull << 30);
  EXPECT_EQ(c.config.garbage_collection_threshold, 0.5);
  ASSERT_TRUE(c.memory_fraction.has_value());
  EXPECT_DOUBLE_EQ(*c.memory_fraction, 0.125);
  EXPECT_EQ(CandidateKey(c), "garbage_collection_threshold:0.5 @ fraction 0.125");
  // With no device size there is no fraction, so no GC either.
  EXPECT_EQ(MakeCandidate(space, p, 8ull << 30, 0), Candidate{});
}

}  // namespace
}  // namespace allocd
