// FormatSize is PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp,
// used in "CUDA out of memory" messages): "<= 1024" bytes, then KiB up to and
// including 1 MiB, MiB up to and including 1 GiB, then GiB, two decimals.
// ParseSize is allocd's one parser for sizes: flags, allocctl, config files.
#include "allocator/bytes.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

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

// A person's "80" means 80 GB, never 80 bytes: a number without a unit is
// refused with a suggestion, except where bytes are documented.
TEST(ParseSizeTest, ANumberWithoutAUnitIsRefusedWithASuggestion) {
  absl::StatusOr<uint64_t> small = ParseSize("80");
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("did you mean 80GB?"));
  absl::StatusOr<uint64_t> decimal = ParseSize("79.1");
  ASSERT_FALSE(decimal.ok());
  EXPECT_THAT(decimal.status().message(), HasSubstr("did you mean 79.1GB?"));
  // A large one was printed by a program, in bytes.
  absl::StatusOr<uint64_t> large = ParseSize("84465090560");
  ASSERT_FALSE(large.ok());
  EXPECT_THAT(large.status().message(),
              HasSubstr("did you mean 84465090560B?"));
}

TEST(ParseSizeTest, BareNumbersAreBytesWhereDocumented) {
  const SizeContext bytes{.bare_number_is_bytes = true};
  EXPECT_EQ(ParseSize("0", bytes).value(), 0u);
  EXPECT_EQ(ParseSize("512", bytes).value(), 512u);
  EXPECT_EQ(ParseSize("84465090560", bytes).value(), 84465090560u);
  EXPECT_EQ(ParseSize("18446744073709551615", bytes).value(),
            uint64_t{18446744073709551615u});
  // Units still work there.
  EXPECT_EQ(ParseSize("80GB", bytes).value(), 80000000000u);
}

TEST(ParseSizeTest, ExplicitBytes) {
  EXPECT_EQ(ParseSize("80B").value(), 80u);
  EXPECT_EQ(ParseSize("84465090560B").value(), 84465090560u);
  // Exact past 2^53, where a double would round.
  EXPECT_EQ(ParseSize("18446744073709551615B").value(),
            uint64_t{18446744073709551615u});
}

// Kubernetes quantities: G is 10^9, Gi is 2^30.
TEST(ParseSizeTest, KubernetesSuffixes) {
  EXPECT_EQ(ParseSize("80G").value(), 80000000000u);
  EXPECT_EQ(ParseSize("80Gi").value(), 80 * kGiB);
  EXPECT_EQ(ParseSize("512Mi").value(), 512 * kMiB);
  EXPECT_EQ(ParseSize("512M").value(), 512000000u);
  EXPECT_EQ(ParseSize("4Ki").value(), 4 * kKiB);
  EXPECT_EQ(ParseSize("4K").value(), 4000u);
  EXPECT_EQ(ParseSize("1Ti").value(), 1024 * kGiB);
  EXPECT_EQ(ParseSize("2T").value(), 2000000000000u);
  EXPECT_EQ(ParseSize("1.5Gi").value(), 3 * kGiB / 2);
}

TEST(ParseSizeTest, PercentOfAKnownDevice) {
  const SizeContext device{.percent_of = 80 * kGiB};
  EXPECT_EQ(ParseSize("80%", device).value(), 64 * kGiB);
  EXPECT_EQ(ParseSize("100%", device).value(), 80 * kGiB);
  EXPECT_EQ(ParseSize("12.5 %", device).value(), 10 * kGiB);
  // Units keep their meaning beside a device.
  EXPECT_EQ(ParseSize("80GB", device).value(), 80000000000u);
  for (const char* text : {"0%", "101%", "-5%", "%", "x%"}) {
    EXPECT_FALSE(ParseSize(text, device).ok()) << text;
  }
}

TEST(ParseSizeTest, PercentWithoutADeviceSaysWhy) {
  absl::StatusOr<uint64_t> parsed = ParseSize("80%");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("is a percentage"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("no device"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("80GB"));
  const SizeContext sim{.no_percent_reason = "--backend sim has no device"};
  EXPECT_THAT(ParseSize("80%", sim).status().message(),
              HasSubstr("--backend sim has no device"));
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
        "1e400GB", "nanGB", "infGB", "+5GB", "5XiB", "GiB"}) {
    absl::StatusOr<uint64_t> parsed = ParseSize(text);
    EXPECT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << *parsed;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
          << text;
    }
  }
}

TEST(ParseSizeTest, RejectsValuesPast64Bits) {
  EXPECT_FALSE(ParseSize("18446744073709551616B").ok());
  EXPECT_FALSE(
      ParseSize("18446744073709551616", {.bare_number_is_bytes = true}).ok());
  EXPECT_FALSE(ParseSize("20000000TB").ok());
}

}  // namespace
}  // namespace allocd
