// FormatSize is PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp,
// used in "CUDA out of memory" messages): "<= 1024" bytes, then KiB up to and
// including 1 MiB, MiB up to and including 1 GiB, then GiB, two decimals.
// ParseSize is allocd's own parser for sizes on the command line.
#include "allocator/bytes.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;

// Pins: format_size's "size <= 1024" branch.
TEST(FormatSizeTest, BytesUpTo1024) {
  EXPECT_EQ(FormatSize(0), "0 bytes");
  EXPECT_EQ(FormatSize(1), "1 bytes");
  EXPECT_EQ(FormatSize(512), "512 bytes");
  EXPECT_EQ(FormatSize(1024), "1024 bytes");
}

// Pins: format_size's boundaries are inclusive ("<= 1048576" is still KiB,
// "<= 1073741824" is still MiB), with std::fixed precision 2.
TEST(FormatSizeTest, UnitBoundaries) {
  EXPECT_EQ(FormatSize(1025), "1.00 KiB");
  EXPECT_EQ(FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatSize(kMiB), "1024.00 KiB");
  EXPECT_EQ(FormatSize(kMiB + 1), "1.00 MiB");
  EXPECT_EQ(FormatSize(kMiB + kMiB / 2), "1.50 MiB");
  EXPECT_EQ(FormatSize(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(FormatSize(kGiB), "1024.00 MiB");
  EXPECT_EQ(FormatSize(kGiB + 1), "1.00 GiB");
  EXPECT_EQ(FormatSize(80 * kGiB), "80.00 GiB");
}

// Pins: two decimals, rounded (std::fixed, precision 2).
TEST(FormatSizeTest, RoundsToTwoDecimals) {
  // 107374182 bytes = 102.3999996 MiB.
  EXPECT_EQ(FormatSize(107374182), "102.40 MiB");
  // 7956433715 bytes = 7.4100063 GiB.
  EXPECT_EQ(FormatSize(7956433715), "7.41 GiB");
  // 1029 bytes = 1.0049 KiB; 1030 bytes = 1.0059 KiB.
  EXPECT_EQ(FormatSize(1029), "1.00 KiB");
  EXPECT_EQ(FormatSize(1030), "1.01 KiB");
}

TEST(ParseSizeTest, PlainIntegers) {
  EXPECT_EQ(ParseSize("0").value(), 0u);
  EXPECT_EQ(ParseSize("512").value(), 512u);
  EXPECT_EQ(ParseSize("84465090560").value(), 84465090560u);
  EXPECT_EQ(ParseSize("18446744073709551615").value(),
            uint64_t{18446744073709551615u});
}

TEST(ParseSizeTest, DecimalUnitsArePowersOf1000) {
  EXPECT_EQ(ParseSize("80GB").value(), 80000000000u);
  EXPECT_EQ(ParseSize("512B").value(), 512u);
  EXPECT_EQ(ParseSize("1KB").value(), 1000u);
  EXPECT_EQ(ParseSize("1.5MB").value(), 1500000u);
  EXPECT_EQ(ParseSize("2TB").value(), 2000000000000u);
}

TEST(ParseSizeTest, BinaryUnitsArePowersOf1024) {
  // 79.1 * 2^30 = 84932978278.4 -> 84932978278.
  EXPECT_EQ(ParseSize("79.1GiB").value(), 84932978278u);
  EXPECT_EQ(ParseSize("1KiB").value(), 1024u);
  EXPECT_EQ(ParseSize("512MiB").value(), 512 * kMiB);
  EXPECT_EQ(ParseSize("80GiB").value(), 80 * kGiB);
  EXPECT_EQ(ParseSize("1TiB").value(), 1024 * kGiB);
}

TEST(ParseSizeTest, CaseAndSpacesAreAccepted) {
  EXPECT_EQ(ParseSize("80gb").value(), 80000000000u);
  EXPECT_EQ(ParseSize("80 GB").value(), 80000000000u);
  EXPECT_EQ(ParseSize(" 79.1 gib ").value(), 84932978278u);
  EXPECT_EQ(ParseSize("512mib").value(), 512 * kMiB);
}

TEST(ParseSizeTest, RejectsMalformedSizes) {
  for (const char* text :
       {"", " ", "-1", "-1GB", "12XB", "GB", "abc", "1.2.3GB", "12 X",
        "1e400GB", "nanGB", "infGB"}) {
    absl::StatusOr<uint64_t> parsed = ParseSize(text);
    EXPECT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << *parsed;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
          << text;
    }
  }
}

TEST(ParseSizeTest, RejectsValuesPast64Bits) {
  EXPECT_FALSE(ParseSize("18446744073709551616").ok());
  EXPECT_FALSE(ParseSize("20000000TB").ok());
}

}  // namespace
}  // namespace allocd
