// SimBackend: a DeviceBackend with a capacity and no GPU. It stands in for
// what CUDACachingAllocator.cpp asks of CUDA: cudaMalloc / cudaFree
// (alloc_block / release_block), cuMemAddressReserve / cuMemAddressFree and
// cuMemCreate+cuMemMap / cuMemUnmap+cuMemRelease (ExpandableSegment), and
// cudaMemGetInfo (setMemoryFraction, the OOM message).
#include "allocator/sim_backend.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr uint64_t k2MiB = 2 * kMiB;

// cudaMemGetInfo: total defaults to the capacity; free = capacity - used.
TEST(SimBackendTest, TotalAndFreeMemory) {
  SimBackend backend(100 * kMiB);
  EXPECT_EQ(backend.capacity(), 100 * kMiB);
  EXPECT_EQ(backend.TotalMemory(), 100 * kMiB);
  EXPECT_EQ(backend.FreeMemory(), 100 * kMiB);
  EXPECT_EQ(backend.used(), 0u);

  SimBackend with_total(100 * kMiB, 80 * size_t{1} << 30);
  EXPECT_EQ(with_total.TotalMemory(), 80 * size_t{1} << 30);
  EXPECT_EQ(with_total.FreeMemory(), 100 * kMiB);
}

// cudaMalloc succeeds while the device has the memory free, and fails with
// cudaErrorMemoryAllocation (ResourceExhausted) without taking anything
// otherwise; cudaFree gives it back.
TEST(SimBackendTest, AllocateUpToCapacity) {
  SimBackend backend(24 * kMiB);
  absl::StatusOr<uint64_t> a = backend.AllocateSegment(20 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(backend.used(), 20 * kMiB);
  EXPECT_EQ(backend.FreeMemory(), 4 * kMiB);

  absl::StatusOr<uint64_t> too_big = backend.AllocateSegment(6 * kMiB);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.used(), 20 * kMiB);

  absl::StatusOr<uint64_t> fits = backend.AllocateSegment(4 * kMiB);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(backend.FreeMemory(), 0u);
  EXPECT_FALSE(backend.AllocateSegment(k2MiB).ok());

  backend.FreeSegment(*a, 20 * kMiB);
  EXPECT_EQ(backend.used(), 4 * kMiB);
  EXPECT_TRUE(backend.AllocateSegment(20 * kMiB).ok());
}

// The driver's habit the sim copies: each new segment lands below every
// earlier one, 2 MiB aligned, without overlapping them.
TEST(SimBackendTest, NewSegmentsLandBelowEarlierOnes) {
  SimBackend backend(size_t{1} << 30);
  const uint64_t a = backend.AllocateSegment(k2MiB).value();
  const uint64_t b = backend.AllocateSegment(20 * kMiB).value();
  const uint64_t c = backend.AllocateSegment(k2MiB).value();
  EXPECT_EQ(a % k2MiB, 0u);
  EXPECT_EQ(b % k2MiB, 0u);
  EXPECT_EQ(c % k2MiB, 0u);
  EXPECT_EQ(b, a - 20 * kMiB);
  EXPECT_EQ(c, b - k2MiB);
  // A freed address is not handed out again.
  backend.FreeSegment(c, k2MiB);
  const uint64_t d = backend.AllocateSegment(k2MiB).value();
  EXPECT_LT(d, c);
  EXPECT_GT(a, uint64_t{1} << 40);  // a plausible device address
}

// A failed allocation takes no address space either.
TEST(SimBackendTest, FailedAllocationTakesNoAddress) {
  SimBackend backend(4 * kMiB);
  const uint64_t a = backend.AllocateSegment(k2MiB).value();
  EXPECT_FALSE(backend.AllocateSegment(20 * kMiB).ok());
  EXPECT_EQ(backend.AllocateSegment(k2MiB).value(), a - k2MiB);
}

// cuMemAddressReserve takes address space but no memory; cuMemCreate+cuMemMap
// take memory; cuMemUnmap+cuMemRelease give it back; cuMemAddressFree frees
// no memory.
TEST(SimBackendTest, ReservedRangesCostNothingUntilMapped) {
  SimBackend backend(60 * kMiB);
  const uint64_t base = backend.ReserveAddressRange(size_t{1} << 30).value();
  EXPECT_EQ(base % k2MiB, 0u);
  EXPECT_EQ(backend.used(), 0u);

  EXPECT_TRUE(backend.MapPages(base, 40 * kMiB).ok());
  EXPECT_EQ(backend.used(), 40 * kMiB);
  // All or nothing: 40 MiB more does not fit, and nothing is mapped.
  absl::Status s = backend.MapPages(base + 40 * kMiB, 40 * kMiB);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.used(), 40 * kMiB);

  backend.UnmapPages(base, 20 * kMiB);
  EXPECT_EQ(backend.used(), 20 * kMiB);
  EXPECT_EQ(backend.FreeMemory(), 40 * kMiB);
  backend.UnmapPages(base + 20 * kMiB, 20 * kMiB);
  backend.ReleaseAddressRange(base, size_t{1} << 30);
  EXPECT_EQ(backend.used(), 0u);
}

// Reservations and segments share one descending address space: a segment
// after a reservation lands below the whole reserved range.
TEST(SimBackendTest, SegmentsAndReservationsDoNotOverlap) {
  SimBackend backend(size_t{1} << 30);
  const uint64_t seg = backend.AllocateSegment(k2MiB).value();
  const uint64_t range = backend.ReserveAddressRange(100 * kMiB).value();
  const uint64_t seg2 = backend.AllocateSegment(k2MiB).value();
  EXPECT_LE(range + 100 * kMiB, seg);
  EXPECT_LE(seg2 + k2MiB, range);
}

// Memory and mappings share one capacity.
TEST(SimBackendTest, SegmentsAndMappingsShareTheCapacity) {
  SimBackend backend(40 * kMiB);
  const uint64_t base = backend.ReserveAddressRange(100 * kMiB).value();
  ASSERT_TRUE(backend.MapPages(base, 20 * kMiB).ok());
  ASSERT_TRUE(backend.AllocateSegment(20 * kMiB).ok());
  EXPECT_EQ(backend.used(), 40 * kMiB);
  EXPECT_FALSE(backend.AllocateSegment(k2MiB).ok());
  EXPECT_FALSE(backend.MapPages(base + 20 * kMiB, k2MiB).ok());
}

// An unlimited device has a finite total, so that expandable segments'
// reservations (9/8 of it each) fit in the address space; a range that
// does not fit is an error, not a wrapped address.
TEST(SimBackendTest, AddressesNeverWrap) {
  SimBackend unlimited(std::numeric_limits<size_t>::max());
  EXPECT_EQ(unlimited.TotalMemory(), SimBackend::kUnlimitedTotalMemory);
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<uint64_t> base =
        unlimited.ReserveAddressRange(unlimited.TotalMemory() / 8 * 9);
    ASSERT_TRUE(base.ok()) << base.status();
    EXPECT_LT(*base, uint64_t{1} << 53);
  }
  absl::StatusOr<uint64_t> huge =
      unlimited.ReserveAddressRange(std::numeric_limits<size_t>::max() / 2);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kOutOfRange);
  // Nothing was taken by the failure.
  EXPECT_TRUE(unlimited.AllocateSegment(k2MiB).ok());
}

// Ranges a partial trace's first event found: their memory counts, and new
// ranges land below them.
TEST(SimBackendTest, AdoptedRangesCountAndNewOnesLandBelow) {
  SimBackend backend(100 * kMiB);
  const uint64_t adopted = uint64_t{0x7f0000000000};
  ASSERT_TRUE(backend.AdoptRange(adopted, 40 * kMiB).ok());
  EXPECT_EQ(backend.used(), 40 * kMiB);
  const uint64_t next = backend.AllocateSegment(20 * kMiB).value();
  EXPECT_LE(next + 20 * kMiB, adopted);
  EXPECT_EQ(backend.AdoptRange(adopted - (1ull << 30), 60 * kMiB).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.AdoptRange(0x1000, k2MiB).code(),
            absl::StatusCode::kInvalidArgument);
}

// Ranges a process mapped low in the address space itself (allocd's
// interposer reserves its own): once the little room below them is spent,
// new ranges go in the gaps above and between them, never on one.
TEST(SimBackendTest, BelowLowAdoptedRangesNewOnesFillTheGapsAbove) {
  SimBackend backend(SimBackend::kUnlimitedTotalMemory);
  const uint64_t low = uint64_t{0x104000000};  // 64 MiB above the floor
  ASSERT_TRUE(backend.AdoptRange(low, 20 * kMiB).ok());
  ASSERT_TRUE(backend.AdoptRange(low + 100 * kMiB, 30 * kMiB).ok());
  std::vector<std::pair<uint64_t, uint64_t>> taken = {
      {low, low + 20 * kMiB}, {low + 100 * kMiB, low + 130 * kMiB}};
  // 40 MiB fits below; 200 MiB does not, nor a 2 GiB reservation.
  for (uint64_t bytes : {40 * kMiB, 200 * kMiB, 60 * kMiB, 2048 * kMiB}) {
    absl::StatusOr<uint64_t> at = bytes == 2048 * kMiB
                                      ? backend.ReserveAddressRange(bytes)
                                      : backend.AllocateSegment(bytes);
    ASSERT_TRUE(at.ok()) << bytes << ": " << at.status();
    for (const auto& [start, end] : taken) {
      EXPECT_TRUE(*at + bytes <= start || *at >= end)
          << bytes << " bytes at 0x" << std::hex << *at << " overlap 0x" << start;
    }
    taken.emplace_back(*at, *at + bytes);
  }
  EXPECT_LT(taken[2].first, low);  // the one that fitted below went there
  EXPECT_GT(taken[3].first, low);  // the others above
}

}  // namespace
}  // namespace allocd
