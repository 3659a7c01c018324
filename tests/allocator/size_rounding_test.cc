// Size classes, pinned to PyTorch's CUDACachingAllocator.cpp:
// DeviceCachingAllocator::round_size, roundup_power2_next_division,
// get_allocation_size, get_pool, and
// CUDAAllocatorConfig::roundup_power2_divisions(size) (the interval lookup).
// Every expected value below is worked out by hand from those functions.
#include "allocator/size_rounding.h"

#include <cstddef>

#include "allocator/config.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kGiB = size_t{1} << 30;

AllocatorConfig WithDivisions(size_t all) {
  AllocatorConfig config;
  config.roundup_power2_divisions.fill(all);
  return config;
}

// Pins: the kMinBlockSize, kSmallSize, kSmallBuffer, kMinLargeAlloc,
// kLargeBuffer, kRoundLarge constants at the top of CUDACachingAllocator.cpp.
TEST(SizeRoundingTest, ConstantsMatchPyTorch) {
  EXPECT_EQ(kMinBlockSize, 512u);
  EXPECT_EQ(kSmallSize, 1048576u);
  EXPECT_EQ(kSmallBuffer, 2097152u);
  EXPECT_EQ(kMinLargeAlloc, 10485760u);
  EXPECT_EQ(kLargeBuffer, 20971520u);
  EXPECT_EQ(kRoundLarge, 2097152u);
  EXPECT_EQ(kRoundupPower2Intervals, 16);
}

// Pins: round_size, "size < kMinBlockSize -> kMinBlockSize", else rounded up
// to a multiple of kMinBlockSize when no divisions apply.
TEST(SizeRoundingTest, RoundSizeWithoutDivisionsRoundsTo512) {
  const AllocatorConfig config;
  EXPECT_EQ(RoundSize(0, config), 512u);
  EXPECT_EQ(RoundSize(1, config), 512u);
  EXPECT_EQ(RoundSize(511, config), 512u);
  EXPECT_EQ(RoundSize(512, config), 512u);
  EXPECT_EQ(RoundSize(513, config), 1024u);
  EXPECT_EQ(RoundSize(1000, config), 1024u);
  EXPECT_EQ(RoundSize(kMiB, config), kMiB);
  EXPECT_EQ(RoundSize(kMiB + 1, config), kMiB + 512);
  EXPECT_EQ(RoundSize(5 * kMiB + 1, config), 5 * kMiB + 512);
  EXPECT_EQ(RoundSize(20 * kGiB + 1, config), 20 * kGiB + 512);
}

// Pins: round_size applies divisions only when `divisions > 1`; 0 and 1 both
// mean plain 512-byte rounding.
TEST(SizeRoundingTest, DivisionsZeroOrOneArePlainRounding) {
  for (size_t d : {size_t{0}, size_t{1}}) {
    const AllocatorConfig config = WithDivisions(d);
    EXPECT_EQ(RoundSize(5 * kMiB + 1, config), 5 * kMiB + 512) << d;
    EXPECT_EQ(RoundSize(1200, config), 1536u) << d;
  }
}

// Pins: round_size with an integer roundup_power2_divisions (the same value in
// every interval) and roundup_power2_next_division.
TEST(SizeRoundingTest, IntegerDivisionsRoundToPowerOfTwoSteps) {
  const AllocatorConfig config = WithDivisions(4);
  // Not above kMinBlockSize * divisions (2048): plain rounding.
  EXPECT_EQ(RoundSize(1200, config), 1536u);
  EXPECT_EQ(RoundSize(2048, config), 2048u);
  // 1 MiB + 1: between 1 MiB and 2 MiB in steps of 256 KiB -> 1.25 MiB.
  EXPECT_EQ(RoundSize(kMiB + 1, config), kMiB + 256 * kKiB);
  // 5 MiB + 1: steps of 1 MiB between 4 and 8 MiB -> 6 MiB.
  EXPECT_EQ(RoundSize(5 * kMiB + 1, config), 6 * kMiB);
  // On a step already: stays.
  EXPECT_EQ(RoundSize(6 * kMiB, config), 6 * kMiB);
  // A power of two stays as it is.
  EXPECT_EQ(RoundSize(8 * kMiB, config), 8 * kMiB);
  EXPECT_EQ(RoundSize(4 * kGiB, config), 4 * kGiB);
  // Sizes below 1 MiB use the first interval's divisions: 600 KiB lies
  // between 512 KiB and 1 MiB, steps of 128 KiB -> 640 KiB.
  EXPECT_EQ(RoundSize(600 * kKiB, config), 640 * kKiB);
}

// Pins: CUDAAllocatorConfig::roundup_power2_divisions(size): interval index =
// log2(size) - log2(1 MiB), clamped to [0, kRoundUpPowerOfTwoIntervals - 1].
TEST(SizeRoundingTest, DivisionsLookupUsesPowerOfTwoIntervals) {
  AllocatorConfig config;
  for (int i = 0; i < kRoundupPower2Intervals; ++i) {
    config.roundup_power2_divisions[i] = 100 + i;
  }
  EXPECT_EQ(RoundupDivisionsFor(1, config), 100u);
  EXPECT_EQ(RoundupDivisionsFor(600 * kKiB, config), 100u);
  EXPECT_EQ(RoundupDivisionsFor(kMiB - 1, config), 100u);
  EXPECT_EQ(RoundupDivisionsFor(kMiB, config), 100u);
  EXPECT_EQ(RoundupDivisionsFor(2 * kMiB - 1, config), 100u);
  EXPECT_EQ(RoundupDivisionsFor(2 * kMiB, config), 101u);
  EXPECT_EQ(RoundupDivisionsFor(5 * kMiB, config), 102u);
  EXPECT_EQ(RoundupDivisionsFor(kGiB, config), 110u);
  EXPECT_EQ(RoundupDivisionsFor(32 * kGiB - 1, config), 114u);
  EXPECT_EQ(RoundupDivisionsFor(32 * kGiB, config), 115u);
  EXPECT_EQ(RoundupDivisionsFor(64 * kGiB, config), 115u);
  EXPECT_EQ(RoundupDivisionsFor(size_t{1} << 40, config), 115u);
}

// Pins: round_size with a per-interval array ("[1:2,2:0,4:8,...,>:16]"-style
// configs): each size uses its own interval's entry, 0 means plain rounding.
TEST(SizeRoundingTest, PerIntervalDivisions) {
  AllocatorConfig config;
  config.roundup_power2_divisions[0] = 2;   // [1 MiB, 2 MiB) and below
  config.roundup_power2_divisions[1] = 0;   // [2 MiB, 4 MiB)
  config.roundup_power2_divisions[2] = 8;   // [4 MiB, 8 MiB)
  config.roundup_power2_divisions[14] = 0;  // [16 GiB, 32 GiB)
  config.roundup_power2_divisions[15] = 16;  // [32 GiB, ...)

  // 1.5 MiB + 1 with 2 divisions: steps of 512 KiB from 1 MiB -> 2 MiB.
  EXPECT_EQ(RoundSize(kMiB + 512 * kKiB + 1, config), 2 * kMiB);
  // Below 1 MiB uses interval 0: 700 KiB, steps of 256 KiB from 512 KiB.
  EXPECT_EQ(RoundSize(700 * kKiB, config), 768 * kKiB);
  // Interval 1 is 0: plain rounding.
  EXPECT_EQ(RoundSize(3 * kMiB + 1, config), 3 * kMiB + 512);
  // Interval 2, 8 divisions: steps of 512 KiB from 4 MiB.
  EXPECT_EQ(RoundSize(5 * kMiB + 1, config), 5 * kMiB + 512 * kKiB);
  // Interval 14 is 0: plain rounding.
  EXPECT_EQ(RoundSize(20 * kGiB + 1, config), 20 * kGiB + 512);
  // Interval 15, 16 divisions: steps of 2 GiB from 32 GiB.
  EXPECT_EQ(RoundSize(40 * kGiB + 1, config), 42 * kGiB);
  // Above 64 GiB still interval 15: steps of 4 GiB from 64 GiB.
  EXPECT_EQ(RoundSize(100 * kGiB + 1, config), 104 * kGiB);
}

// Pins: roundup_power2_next_division, including its own example (1200 with 4
// divisions -> 1280), "a power of two stays", and a step of 0 (more divisions
// than bytes below the power of two) -> the next power of two.
TEST(SizeRoundingTest, RoundupPower2NextDivision) {
  EXPECT_EQ(RoundupPower2NextDivision(1200, 4), 1280u);
  EXPECT_EQ(RoundupPower2NextDivision(1280, 4), 1280u);
  EXPECT_EQ(RoundupPower2NextDivision(1281, 4), 1536u);
  EXPECT_EQ(RoundupPower2NextDivision(1024, 4), 1024u);
  EXPECT_EQ(RoundupPower2NextDivision(2049, 2), 3072u);
  EXPECT_EQ(RoundupPower2NextDivision(1000, 1024), 1024u);
  EXPECT_EQ(RoundupPower2NextDivision(3000, 8192), 4096u);
  EXPECT_EQ(RoundupPower2NextDivision(3 * kGiB, 2), 3 * kGiB);
  EXPECT_EQ(RoundupPower2NextDivision(3 * kGiB + 1, 2), 4 * kGiB);
}

// Pins: get_pool ("size <= kSmallSize" is the small pool).
TEST(SizeRoundingTest, SmallPoolIsUpToOneMiB) {
  EXPECT_TRUE(IsSmallSize(512));
  EXPECT_TRUE(IsSmallSize(kMiB - 512));
  EXPECT_TRUE(IsSmallSize(kMiB));
  EXPECT_FALSE(IsSmallSize(kMiB + 512));
  EXPECT_FALSE(IsSmallSize(20 * kMiB));
}

// Pins: get_allocation_size: <= 1 MiB -> kSmallBuffer (2 MiB); < 10 MiB ->
// kLargeBuffer (20 MiB); else rounded up to kRoundLarge (2 MiB).
TEST(SizeRoundingTest, SegmentSizes) {
  EXPECT_EQ(SegmentSizeFor(512), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB - 512), 20 * kMiB);
  // large_segment_size_mb (PyTorch 2.11) sets the 1-10 MiB segment.
  EXPECT_EQ(SegmentSizeFor(kMiB + 512, 64 * kMiB), 64 * kMiB);
  EXPECT_EQ(SegmentSizeFor(12 * kMiB, 64 * kMiB), 12 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB + 512), 12 * kMiB);
  EXPECT_EQ(SegmentSizeFor(12 * kMiB), 12 * kMiB);
  EXPECT_EQ(SegmentSizeFor(25 * kMiB), 26 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kGiB + 1), kGiB + 2 * kMiB);
}

}  // namespace
}  // namespace allocd
