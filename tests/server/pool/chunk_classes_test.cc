#include "server/pool/chunk_classes.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kChunk = 2 * kMiB;

TEST(DefaultChunkClassesTest, EachIsEightTimesTheLastUpToAGibibyte) {
  EXPECT_THAT(DefaultChunkClasses(kChunk),
              ElementsAre(kChunk, 16 * kMiB, 128 * kMiB, kGiB));
}

TEST(ChunkClassesTest, TheGranularityIsTheSmallestAndOthersItsMultiples) {
  const ChunkClasses classes({16 * kMiB, 3 * kMiB, 0, 16 * kMiB, 4 * kMiB},
                             kChunk);
  EXPECT_THAT(classes.sizes(), ElementsAre(kChunk, 4 * kMiB, 16 * kMiB));
  EXPECT_EQ(classes.smallest(), kChunk);
  EXPECT_TRUE(classes.Contains(4 * kMiB));
  EXPECT_FALSE(classes.Contains(3 * kMiB));
  EXPECT_EQ(classes.Describe(), "2.00 MiB, 4.00 MiB, 16.00 MiB");
  EXPECT_THAT(ChunkClasses({}, kChunk).sizes(), ElementsAre(kChunk));
}

TEST(ChunkClassesTest, ARequestIsRoundedUpAndSplitLargestFirst) {
  const ChunkClasses classes(DefaultChunkClasses(kChunk), kChunk);
  EXPECT_EQ(classes.RoundUp(1), kChunk);
  EXPECT_EQ(classes.RoundUp(20 * kMiB), 20 * kMiB);
  EXPECT_THAT(classes.Split(20 * kMiB), ElementsAre(16 * kMiB, kChunk, kChunk));
  EXPECT_THAT(classes.Split(2 * kGiB + 16 * kMiB),
              ElementsAre(kGiB, kGiB, 16 * kMiB));
  // No class above the cap, but never below the smallest.
  EXPECT_THAT(classes.Split(20 * kMiB, 4 * kMiB), ::testing::Each(kChunk));
  EXPECT_THAT(classes.Split(kChunk, 1), ElementsAre(kChunk));
  // A capacity as the pool would fill it with its largest chunks.
  EXPECT_EQ(classes.Split(80 * kGiB).size(), 80u);
}

}  // namespace
}  // namespace allocd
