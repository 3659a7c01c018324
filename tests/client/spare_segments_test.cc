#include "client/spare_segments.h"

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Origin = SpareSegments::Origin;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
const absl::Time kStart = absl::FromUnixSeconds(1000);

SpareSegments::Spare Kept(uint64_t address, uint64_t bytes,
                          absl::Duration after = absl::ZeroDuration()) {
  return {.address = address, .bytes = bytes, .origin = Origin::kKept,
          .since = kStart + after};
}

std::vector<uint64_t> Addresses(const std::vector<SpareSegments::Spare>& spares) {
  std::vector<uint64_t> out;
  for (const SpareSegments::Spare& s : spares) out.push_back(s.address);
  return out;
}

TEST(SpareSegmentsTest, ARequestTakesASpareOfItsExactSizeOnly) {
  SpareSegments spares;
  spares.Add(Kept(0x1000, 20 * kMiB));
  spares.Add(Kept(0x2000, 60 * kGiB));
  EXPECT_EQ(spares.bytes(), 60 * kGiB + 20 * kMiB);
  // A larger spare would serve a smaller request with memory PyTorch does
  // not count: no.
  EXPECT_EQ(spares.Take(2 * kMiB), std::nullopt);
  EXPECT_EQ(spares.Take(40 * kGiB), std::nullopt);
  EXPECT_EQ(spares.Take(60 * kGiB), 0x2000u);
  EXPECT_EQ(spares.Take(60 * kGiB), std::nullopt) << "taken once";
  EXPECT_EQ(spares.bytes(), 20 * kMiB);
  EXPECT_EQ(spares.size(), 1u);
}

TEST(SpareSegmentsTest, SparesOfOneSizeAreTakenInTheOrderTheyCame) {
  SpareSegments spares;
  spares.Add(Kept(0x1000, 20 * kMiB));
  spares.Add(Kept(0x5000, 20 * kMiB));
  EXPECT_EQ(spares.Take(20 * kMiB), 0x1000u);
  EXPECT_EQ(spares.Take(20 * kMiB), 0x5000u);
  EXPECT_TRUE(spares.empty());
  EXPECT_EQ(spares.bytes(), 0u);
}

// A neighbour short of 41 GiB: the 60 GiB batch goes, the KV caches stay.
TEST(SpareSegmentsTest, AGiveBackTakesTheLargestUntilItCoversTheAsk) {
  SpareSegments spares;
  spares.Add(Kept(0x1, 2 * kGiB));
  spares.Add(Kept(0x2, 60 * kGiB));
  spares.Add(Kept(0x3, 1 * kGiB));
  spares.Add(Kept(0x4, 2 * kGiB));
  EXPECT_THAT(Addresses(spares.TakeLargestCovering(41 * kGiB)), ElementsAre(0x2u));
  EXPECT_EQ(spares.bytes(), 5 * kGiB);
  // 3 GiB: the two of 2 GiB, not the one of 1.
  EXPECT_THAT(Addresses(spares.TakeLargestCovering(3 * kGiB)),
              UnorderedElementsAre(0x1u, 0x4u));
  EXPECT_EQ(spares.bytes(), 1 * kGiB);
}

TEST(SpareSegmentsTest, AGiveBackOfMoreThanAllOrOfZeroTakesEverySpare) {
  SpareSegments spares;
  spares.Add(Kept(0x1, 2 * kGiB));
  spares.Add(Kept(0x2, 4 * kGiB));
  EXPECT_THAT(Addresses(spares.TakeLargestCovering(100 * kGiB)), ElementsAre(0x2u, 0x1u));
  EXPECT_TRUE(spares.empty());
  spares.Add(Kept(0x3, 2 * kGiB));
  EXPECT_THAT(Addresses(spares.TakeLargestCovering(0)), ElementsAre(0x3u));
  EXPECT_EQ(spares.bytes(), 0u);
  EXPECT_THAT(spares.TakeLargestCovering(0), IsEmpty());
}

TEST(SpareSegmentsTest, TakeAllTakesOneOriginAndLeavesTheOther) {
  SpareSegments spares;
  spares.Add(Kept(0x1, 2 * kGiB));
  spares.Add({.address = 0x2, .bytes = 60 * kGiB, .origin = Origin::kPrewarmed,
              .since = kStart});
  spares.Add(Kept(0x3, 60 * kGiB));
  EXPECT_THAT(Addresses(spares.TakeAll(Origin::kPrewarmed)), ElementsAre(0x2u));
  EXPECT_EQ(spares.bytes(), 62 * kGiB);
  EXPECT_THAT(Addresses(spares.TakeAll(Origin::kKept)), UnorderedElementsAre(0x1u, 0x3u));
  EXPECT_TRUE(spares.empty());
}

TEST(SpareSegmentsTest, TakeSpareSinceTakesThoseSpareAtTheCutoffOrBefore) {
  SpareSegments spares;
  spares.Add(Kept(0x1, 2 * kGiB, absl::Seconds(0)));
  spares.Add(Kept(0x2, 4 * kGiB, absl::Seconds(10)));
  spares.Add(Kept(0x3, 2 * kGiB, absl::Seconds(20)));
  EXPECT_THAT(Addresses(spares.TakeSpareSince(kStart + absl::Seconds(10))),
              UnorderedElementsAre(0x1u, 0x2u));
  EXPECT_EQ(spares.bytes(), 2 * kGiB);
  EXPECT_THAT(spares.TakeSpareSince(kStart + absl::Seconds(19)), IsEmpty());
  EXPECT_EQ(spares.Take(2 * kGiB), 0x3u);
}

}  // namespace
}  // namespace allocd
