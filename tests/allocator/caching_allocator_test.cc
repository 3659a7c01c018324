// CachingAllocator against PyTorch's DeviceCachingAllocator
// (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.9-2.11). Every expectation is
// worked out by hand from PyTorch's source; each test names the function whose
// behaviour it pins. A RecordingBackend (a SimBackend that logs every call)
// controls the device's capacity and shows which cudaMalloc / cudaFree /
// cuMemMap / cuMemUnmap calls PyTorch would make.
#include "allocator/caching_allocator.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/device_backend.h"
#include "allocator/sim_backend.h"
#include "allocator/size_rounding.h"
#include "allocator/stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr size_t kKiB = 1024;
constexpr size_t kGiB = size_t{1} << 30;
// ExpandableSegment reserves numSegments(total + total / 8) pages: for a
// 1 GiB device, 1152 MiB = 576 pages of 2 MiB or 58 pages of 20 MiB.
constexpr size_t kSmallReservation1GiB = 576 * 2 * kMiB;
constexpr size_t kLargeReservation1GiB = 58 * 20 * kMiB;

// ---------------------------------------------------------------------------
// A backend that records every call.

enum class Op { kAllocate, kFree, kReserve, kRelease, kMap, kUnmap };

struct Call {
  Op op;
  uint64_t address;
  size_t bytes;
  bool ok = true;
  bool operator==(const Call&) const = default;
};

void PrintTo(const Call& c, std::ostream* os) {
  static constexpr const char* kNames[] = {"AllocateSegment", "FreeSegment",
                                           "ReserveAddressRange",
                                           "ReleaseAddressRange", "MapPages",
                                           "UnmapPages"};
  *os << kNames[static_cast<int>(c.op)] << "(0x" << std::hex << c.address
      << std::dec << ", " << c.bytes / kMiB << " MiB + " << c.bytes % kMiB
      << ")" << (c.ok ? "" : " failed");
}

class RecordingBackend : public DeviceBackend {
 public:
  explicit RecordingBackend(size_t capacity, size_t total_memory = 0)
      : sim_(capacity, total_memory) {}

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override {
    absl::StatusOr<uint64_t> r =
        fail_with_.ok() ? sim_.AllocateSegment(bytes)
                        : absl::StatusOr<uint64_t>(fail_with_);
    calls_.push_back({Op::kAllocate, r.ok() ? *r : 0, bytes, r.ok()});
    return r;
  }
  void FreeSegment(uint64_t address, size_t bytes) override {
    sim_.FreeSegment(address, bytes);
    calls_.push_back({Op::kFree, address, bytes});
  }
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override {
    absl::StatusOr<uint64_t> r = sim_.ReserveAddressRange(bytes);
    calls_.push_back({Op::kReserve, r.ok() ? *r : 0, bytes, r.ok()});
    return r;
  }
  void ReleaseAddressRange(uint64_t address, size_t bytes) override {
    sim_.ReleaseAddressRange(address, bytes);
    calls_.push_back({Op::kRelease, address, bytes});
  }
  absl::Status MapPages(uint64_t address, size_t bytes) override {
    absl::Status s = fail_with_.ok() ? sim_.MapPages(address, bytes)
                                     : fail_with_;
    calls_.push_back({Op::kMap, address, bytes, s.ok()});
    return s;
  }
  void UnmapPages(uint64_t address, size_t bytes) override {
    sim_.UnmapPages(address, bytes);
    calls_.push_back({Op::kUnmap, address, bytes});
  }
  size_t TotalMemory() const override { return sim_.TotalMemory(); }
  size_t FreeMemory() const override { return sim_.FreeMemory(); }

  // Every later AllocateSegment / MapPages fails with `status` (OK: stop).
  void FailWith(absl::Status status) { fail_with_ = std::move(status); }
  const std::vector<Call>& calls() const { return calls_; }
  std::vector<Call> CallsOf(Op op) const {
    std::vector<Call> out;
    for (const Call& c : calls_) {
      if (c.op == op) out.push_back(c);
    }
    return out;
  }
  void ClearCalls() { calls_.clear(); }
  size_t used() const { return sim_.used(); }

 private:
  SimBackend sim_;
  absl::Status fail_with_;
  std::vector<Call> calls_;
};

Call Allocate(size_t bytes, uint64_t address, bool ok = true) {
  return Call{Op::kAllocate, address, bytes, ok};
}
Call AllocateFailed(size_t bytes) { return Call{Op::kAllocate, 0, bytes, false}; }
Call Free(uint64_t address, size_t bytes) {
  return Call{Op::kFree, address, bytes};
}
Call Map(uint64_t address, size_t bytes, bool ok = true) {
  return Call{Op::kMap, address, bytes, ok};
}
Call Unmap(uint64_t address, size_t bytes) {
  return Call{Op::kUnmap, address, bytes};
}
Call Release(uint64_t address, size_t bytes) {
  return Call{Op::kRelease, address, bytes};
}

// ---------------------------------------------------------------------------
// Helpers.

Allocation MustMalloc(CachingAllocator& allocator, size_t size,
                      StreamId stream = 0) {
  absl::StatusOr<Allocation> a = allocator.Malloc(size, stream);
  EXPECT_TRUE(a.ok()) << "Malloc(" << size << ", stream " << stream
                      << "): " << a.status();
  return a.ok() ? *a : Allocation{};
}

void MustFree(CachingAllocator& allocator, const Allocation& a) {
  absl::Status s = allocator.Free(a);
  EXPECT_TRUE(s.ok()) << s;
}

AllocatorConfig MaxSplit(size_t mib) {
  AllocatorConfig config;
  config.max_split_size = mib * kMiB;
  return config;
}

AllocatorConfig Expandable() {
  AllocatorConfig config;
  config.expandable_segments = true;
  return config;
}

int64_t Current(const StatArray& a, int pool = 0) {
  return a.by_pool[pool].current;
}
constexpr int kAll = 0;
constexpr int kSmall = 1;
constexpr int kLarge = 2;

// What PyTorch's stats mean, checked against a snapshot: reserved = the
// segments (or mapped ranges); allocated / active = the allocated / active
// blocks; inactive_split = free blocks of split (non-expandable) segments;
// segment = cudaMalloc'd segments. Also: the sim's memory is what is reserved.
void ExpectConsistent(const CachingAllocator& allocator,
                      const RecordingBackend& backend) {
  SCOPED_TRACE("ExpectConsistent");
  int64_t reserved[3] = {}, allocated[3] = {}, allocations[3] = {},
          active[3] = {}, active_bytes[3] = {}, inactive[3] = {},
          inactive_bytes[3] = {}, segments[3] = {};
  uint64_t previous_end = 0;
  for (const SegmentInfo& segment : allocator.Snapshot()) {
    EXPECT_GE(segment.address, previous_end) << "unsorted or overlapping";
    previous_end = segment.address + segment.total_size;
    const int pool = segment.is_small ? kSmall : kLarge;
    auto add = [pool](int64_t* v, uint64_t x) {
      v[kAll] += static_cast<int64_t>(x);
      v[pool] += static_cast<int64_t>(x);
    };
    add(reserved, segment.total_size);
    if (!segment.is_expandable) add(segments, 1);
    uint64_t address = segment.address;
    uint64_t total = 0;
    for (const BlockInfo& block : segment.blocks) {
      EXPECT_EQ(block.address, address) << "blocks not contiguous";
      address += block.size;
      total += block.size;
      if (block.state == BlockInfo::State::kAllocated) {
        add(allocated, block.size);
        add(allocations, 1);
      }
      if (block.state != BlockInfo::State::kInactive) {
        add(active, 1);
        add(active_bytes, block.size);
      } else if (!segment.is_expandable && segment.blocks.size() > 1) {
        add(inactive, 1);
        add(inactive_bytes, block.size);
      }
    }
    EXPECT_EQ(total, segment.total_size);
  }
  const DeviceStats& s = allocator.Stats();
  for (int p = 0; p < 3; ++p) {
    SCOPED_TRACE(p == kAll ? "all" : p == kSmall ? "small_pool" : "large_pool");
    EXPECT_EQ(Current(s.reserved_bytes, p), reserved[p]);
    EXPECT_EQ(Current(s.allocated_bytes, p), allocated[p]);
    EXPECT_EQ(Current(s.allocation, p), allocations[p]);
    EXPECT_EQ(Current(s.active, p), active[p]);
    EXPECT_EQ(Current(s.active_bytes, p), active_bytes[p]);
    EXPECT_EQ(Current(s.inactive_split, p), inactive[p]);
    EXPECT_EQ(Current(s.inactive_split_bytes, p), inactive_bytes[p]);
    EXPECT_EQ(Current(s.segment, p), segments[p]);
  }
  EXPECT_EQ(static_cast<int64_t>(backend.used()),
            Current(s.reserved_bytes, kAll));
}

// ===========================================================================
// round_size / get_pool / get_allocation_size, through malloc.

// Pins: malloc -> round_size (below 512 -> 512, else a multiple of 512);
// requested_bytes counts orig_size, allocated_bytes the rounded block.
TEST(CachingAllocatorTest, RequestsAreRoundedTo512) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 1);
  const Allocation b = MustMalloc(allocator, 513);
  EXPECT_EQ(a.size, 512u);
  EXPECT_EQ(b.size, 1024u);
  // Both in the one 2 MiB small segment, b right after a.
  EXPECT_EQ(b.address, a.address + 512);
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(Current(s.allocated_bytes, kSmall), 1536);
  EXPECT_EQ(Current(s.requested_bytes, kSmall), 514);
  EXPECT_EQ(Current(s.allocated_bytes, kLarge), 0);
  EXPECT_EQ(s.num_device_alloc, 1);
  ExpectConsistent(allocator, backend);
}

// Pins: malloc -> round_size with roundup_power2_divisions.
TEST(CachingAllocatorTest, RoundupPower2DivisionsApplyToMalloc) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.roundup_power2_divisions.fill(4);
  CachingAllocator allocator(config, &backend);
  const Allocation a = MustMalloc(allocator, 5 * kMiB + 1);
  EXPECT_EQ(a.size, 6 * kMiB);
  EXPECT_EQ(Current(allocator.Stats().allocated_bytes), int64_t{6 * kMiB});
  EXPECT_EQ(Current(allocator.Stats().requested_bytes),
            int64_t{5 * kMiB + 1});
  // 6 MiB < kMinLargeAlloc: a 20 MiB segment, split.
  EXPECT_THAT(backend.calls(), ElementsAre(Allocate(20 * kMiB, a.address)));
}

// Pins: get_pool (rounded size <= 1 MiB -> small pool) and
// get_allocation_size (segment size), plus should_split for the first block.
TEST(CachingAllocatorTest, PoolAndSegmentSizeFollowTheRoundedSize) {
  struct Case {
    size_t request;
    size_t block;    // the block handed out
    size_t segment;  // what cudaMalloc is asked for
    bool small;
  };
  const Case cases[] = {
      {1, 512, 2 * kMiB, true},
      {kMiB, kMiB, 2 * kMiB, true},
      // Large pool; remainder 19 MiB - 512 > 1 MiB: split.
      {kMiB + 1, kMiB + 512, 20 * kMiB, false},
      // Rounds to 10 MiB - 512 < kMinLargeAlloc: 20 MiB, split.
      {10 * kMiB - 513, 10 * kMiB - 512, 20 * kMiB, false},
      // Rounds to 10 MiB: its own segment.
      {10 * kMiB - 1, 10 * kMiB, 10 * kMiB, false},
      // 11 MiB + 512 -> a 12 MiB segment; remainder 1 MiB - 512 is not
      // > 1 MiB, so the whole 12 MiB is handed out.
      {11 * kMiB + 1, 12 * kMiB, 12 * kMiB, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request);
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(AllocatorConfig{}, &backend);
    const Allocation a = MustMalloc(allocator, c.request);
    EXPECT_EQ(a.size, c.block);
    EXPECT_THAT(backend.calls(), ElementsAre(Allocate(c.segment, a.address)));
    const DeviceStats& s = allocator.Stats();
    const int pool = c.small ? kSmall : kLarge;
    EXPECT_EQ(Current(s.reserved_bytes, pool), static_cast<int64_t>(c.segment));
    EXPECT_EQ(Current(s.segment, pool), 1);
    EXPECT_EQ(Current(s.allocated_bytes, pool), static_cast<int64_t>(c.block));
    EXPECT_EQ(Current(s.requested_bytes, pool),
              static_cast<int64_t>(c.request));
    ExpectConsistent(allocator, backend);
  }
}

// ===========================================================================
// Best fit: get_free_block's pool.blocks.lower_bound over
// BlockComparatorSize (stream, size, address).

// Pins: get_free_block takes the smallest free block >= size.
TEST(CachingAllocatorTest, BestFitTakesTheSmallestBlockThatFits) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a12 = MustMalloc(allocator, 12 * kMiB);
  const Allocation a16 = MustMalloc(allocator, 16 * kMiB);
  const Allocation a14 = MustMalloc(allocator, 14 * kMiB);
  MustFree(allocator, a12);
  MustFree(allocator, a16);
  MustFree(allocator, a14);
  // 13 MiB: the 14 MiB block; remainder 1 MiB is not > 1 MiB, no split.
  const Allocation b = MustMalloc(allocator, 13 * kMiB);
  EXPECT_EQ(b.address, a14.address);
  EXPECT_EQ(b.size, 14 * kMiB);
  // 12 MiB: exactly the 12 MiB block.
  EXPECT_EQ(MustMalloc(allocator, 12 * kMiB).address, a12.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 3);
  ExpectConsistent(allocator, backend);
}

// Pins: BlockComparatorSize breaks ties between equal sizes by address: the
// lower address wins, whatever the order of the frees.
TEST(CachingAllocatorTest, BestFitTiesGoToTheLowerAddress) {
  for (bool free_lower_first : {true, false}) {
    SCOPED_TRACE(free_lower_first);
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(AllocatorConfig{}, &backend);
    const Allocation a = MustMalloc(allocator, 12 * kMiB);
    const Allocation b = MustMalloc(allocator, 12 * kMiB);
    const Allocation& lower = a.address < b.address ? a : b;
    const Allocation& higher = a.address < b.address ? b : a;
    MustFree(allocator, free_lower_first ? lower : higher);
    MustFree(allocator, free_lower_first ? higher : lower);
    EXPECT_EQ(MustMalloc(allocator, 12 * kMiB).address, lower.address);
    EXPECT_EQ(MustMalloc(allocator, 12 * kMiB).address, higher.address);
  }
}

// Pins: get_free_block returns false when lower_bound lands on another
// stream's block: blocks freed on one stream serve only that stream.
TEST(CachingAllocatorTest, BestFitIsPerStream) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation on1 = MustMalloc(allocator, 12 * kMiB, /*stream=*/1);
  MustFree(allocator, on1);
  const Allocation on0 = MustMalloc(allocator, 12 * kMiB, /*stream=*/0);
  EXPECT_NE(on0.address, on1.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 2);
  // A bigger free block on stream 1 does not serve stream 0 either.
  const Allocation big1 = MustMalloc(allocator, 30 * kMiB, /*stream=*/1);
  MustFree(allocator, big1);
  const Allocation next0 = MustMalloc(allocator, 14 * kMiB, /*stream=*/0);
  EXPECT_NE(next0.address, big1.address);
  EXPECT_NE(next0.address, on1.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 4);
  // Stream 1 gets its own blocks back.
  EXPECT_EQ(MustMalloc(allocator, 12 * kMiB, 1).address, on1.address);
  EXPECT_EQ(MustMalloc(allocator, 30 * kMiB, 1).address, big1.address);
  // Small pool too.
  const Allocation s1 = MustMalloc(allocator, 512, 1);
  MustFree(allocator, s1);
  const Allocation s0 = MustMalloc(allocator, 512, 0);
  EXPECT_NE(s0.address, s1.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 6);
  ExpectConsistent(allocator, backend);
}

// ===========================================================================
// Splitting: should_split and alloc_found_block.

// Pins: should_split for the small pool (remainder >= kMinBlockSize), and
// alloc_found_block giving the allocation the low addresses.
TEST(CachingAllocatorTest, SmallPoolSplitsRemaindersOf512AndMore) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, kMiB - 512);
  const uint64_t base = backend.calls().at(0).address;
  EXPECT_EQ(a.address, base);
  // Free: [1 MiB + 512]. 1 MiB leaves exactly 512: split.
  const Allocation b = MustMalloc(allocator, kMiB);
  EXPECT_EQ(b.address, base + kMiB - 512);
  EXPECT_EQ(b.size, kMiB);
  // The last 512 bytes serve a 1-byte request: no remainder, no split.
  const Allocation c = MustMalloc(allocator, 1);
  EXPECT_EQ(c.address, base + 2 * kMiB - 512);
  EXPECT_EQ(c.size, 512u);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 1);
  EXPECT_EQ(Current(allocator.Stats().inactive_split), 0);
  ExpectConsistent(allocator, backend);
}

// Pins: should_split for the large pool: only when size < max_split_size and
// the remainder is > kSmallSize (1 MiB); otherwise the whole block is handed
// out and counts as allocated.
TEST(CachingAllocatorTest, LargePoolSplitsOnlyRemaindersAboveOneMiB) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  // 19 MiB -> a 20 MiB segment; remainder exactly 1 MiB: no split.
  const Allocation a = MustMalloc(allocator, 19 * kMiB);
  EXPECT_EQ(a.size, 20 * kMiB);
  EXPECT_EQ(Current(allocator.Stats().allocated_bytes), int64_t{20 * kMiB});
  EXPECT_EQ(Current(allocator.Stats().requested_bytes), int64_t{19 * kMiB});
  EXPECT_EQ(Current(allocator.Stats().inactive_split), 0);
  // 19 MiB - 512 -> remainder 1 MiB + 512: split.
  const Allocation b = MustMalloc(allocator, 19 * kMiB - 512);
  EXPECT_EQ(b.size, 19 * kMiB - 512);
  EXPECT_EQ(Current(allocator.Stats().inactive_split, kLarge), 1);
  EXPECT_EQ(Current(allocator.Stats().inactive_split_bytes, kLarge),
            int64_t{kMiB + 512});
  // A cached block: [2 MiB][18 MiB free]; 17 MiB leaves 1 MiB: no split.
  const Allocation c = MustMalloc(allocator, 2 * kMiB);
  const Allocation d = MustMalloc(allocator, 17 * kMiB);
  EXPECT_EQ(d.address, c.address + 2 * kMiB);
  EXPECT_EQ(d.size, 18 * kMiB);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 3);
  ExpectConsistent(allocator, backend);
}

// Pins: should_split with expandable_segments: remainder >= kMinBlockSize in
// both pools (the "> 1 MiB" large-pool rule is off).
TEST(CachingAllocatorTest, ExpandableSegmentsSplitRemaindersDownTo512) {
  {
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(Expandable(), &backend);
    // One 20 MiB page; remainder 1 MiB is kept free.
    EXPECT_EQ(MustMalloc(allocator, 19 * kMiB).size, 19 * kMiB);
    ExpectConsistent(allocator, backend);
  }
  {
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(Expandable(), &backend);
    // Remainder exactly 512 bytes: still split.
    EXPECT_EQ(MustMalloc(allocator, 20 * kMiB - 512).size, 20 * kMiB - 512);
    ExpectConsistent(allocator, backend);
  }
}

// Pins: should_split reads CUDAAllocatorConfig::expandable_segments(), not
// the block: once the setting is on, a cached cudaMalloc block also splits
// remainders down to 512 bytes.
TEST(CachingAllocatorTest, ShouldSplitFollowsTheCurrentSetting) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation x = MustMalloc(allocator, 20 * kMiB);
  MustFree(allocator, x);
  allocator.Reconfigure(Expandable());
  const Allocation y = MustMalloc(allocator, 19 * kMiB);
  EXPECT_EQ(y.address, x.address);
  EXPECT_EQ(y.size, 19 * kMiB);
  EXPECT_THAT(backend.CallsOf(Op::kMap), IsEmpty());
  ExpectConsistent(allocator, backend);
}

// Pins: free_block + try_merge_blocks: a freed block merges with free
// neighbours (prev and next), and inactive_split counts what stays split.
TEST(CachingAllocatorTest, FreeMergesWithFreeNeighbours) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 512);
  const Allocation b = MustMalloc(allocator, 512);
  const Allocation c = MustMalloc(allocator, 512);
  const uint64_t base = a.address;
  EXPECT_EQ(b.address, base + 512);
  EXPECT_EQ(c.address, base + 1024);
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(Current(s.inactive_split, kSmall), 1);  // the tail

  MustFree(allocator, b);  // [a][b free][c][tail]
  EXPECT_EQ(Current(s.inactive_split, kSmall), 2);
  EXPECT_EQ(Current(s.inactive_split_bytes, kSmall),
            int64_t{512 + 2 * kMiB - 1536});
  MustFree(allocator, a);  // [a+b free][c][tail]
  EXPECT_EQ(Current(s.inactive_split, kSmall), 2);
  EXPECT_EQ(Current(s.inactive_split_bytes, kSmall),
            int64_t{1024 + 2 * kMiB - 1536});
  ExpectConsistent(allocator, backend);
  MustFree(allocator, c);  // one free 2 MiB block: no longer split
  EXPECT_EQ(Current(s.inactive_split, kSmall), 0);
  EXPECT_EQ(Current(s.inactive_split_bytes, kSmall), 0);

  const std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  ASSERT_EQ(snapshot[0].blocks.size(), 1u);
  EXPECT_EQ(snapshot[0].blocks[0].address, base);
  EXPECT_EQ(snapshot[0].blocks[0].size, 2 * kMiB);
  EXPECT_EQ(snapshot[0].blocks[0].state, BlockInfo::State::kInactive);
  ExpectConsistent(allocator, backend);
}

// Pins: try_merge_blocks follows prev/next links only, so blocks of two
// segments never merge, even when the driver placed them back to back.
TEST(CachingAllocatorTest, FreeDoesNotMergeAcrossSegments) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB);
  const Allocation b = MustMalloc(allocator, 12 * kMiB);
  ASSERT_EQ(b.address + 12 * kMiB, a.address);  // adjacent in memory
  MustFree(allocator, a);
  MustFree(allocator, b);
  const std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  EXPECT_EQ(snapshot[0].blocks.size(), 1u);
  EXPECT_EQ(snapshot[1].blocks.size(), 1u);
  // 24 MiB fits in neither: a new segment.
  const Allocation c = MustMalloc(allocator, 24 * kMiB);
  EXPECT_NE(c.address, b.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 3);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{48 * kMiB});
  ExpectConsistent(allocator, backend);
}

// ===========================================================================
// max_split_size (get_free_block, should_split, the oversize stats).

// Pins: get_free_block "Do not return an oversized block for a large request":
// size < max_split_size never takes a cached block >= max_split_size.
TEST(CachingAllocatorTest, SmallRequestsNeverTakeOversizeBlocks) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(MaxSplit(40), &backend);
  const Allocation a = MustMalloc(allocator, 50 * kMiB);
  MustFree(allocator, a);
  const Allocation b = MustMalloc(allocator, 4 * kMiB);
  EXPECT_NE(b.address, a.address);
  EXPECT_THAT(backend.CallsOf(Op::kAllocate),
              ElementsAre(Allocate(50 * kMiB, a.address),
                          Allocate(20 * kMiB, b.address)));
  // Just below max_split_size: same.
  const Allocation c = MustMalloc(allocator, 40 * kMiB - 512);
  EXPECT_NE(c.address, a.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 3);
  ExpectConsistent(allocator, backend);
}

// Pins: get_free_block "Allow oversized block size to be rounded up but
// within a limit": size >= max_split_size takes a block only if it is
// < size + max_non_split_rounding (default kLargeBuffer, 20 MiB), whole.
TEST(CachingAllocatorTest, LargeRequestsTakeOversizeBlocksWithinRounding) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(MaxSplit(40), &backend);
  const Allocation a = MustMalloc(allocator, 60 * kMiB);
  MustFree(allocator, a);
  // 60 MiB >= 40 MiB + 20 MiB: refused, a new 40 MiB segment.
  const Allocation b = MustMalloc(allocator, 40 * kMiB);
  EXPECT_NE(b.address, a.address);
  EXPECT_EQ(b.size, 40 * kMiB);
  MustFree(allocator, b);
  // 40 MiB + 512: the 60 MiB block is < 60 MiB + 512, and it is the best
  // fit (the 40 MiB block is too small). Handed out whole.
  const Allocation c = MustMalloc(allocator, 40 * kMiB + 512);
  EXPECT_EQ(c.address, a.address);
  EXPECT_EQ(c.size, 60 * kMiB);
  EXPECT_EQ(Current(allocator.Stats().allocated_bytes), int64_t{60 * kMiB});
  EXPECT_EQ(Current(allocator.Stats().requested_bytes),
            int64_t{40 * kMiB + 512});
  EXPECT_EQ(allocator.Stats().num_device_alloc, 2);
  ExpectConsistent(allocator, backend);
}

// Pins: max_non_split_rounding_mb replaces the 20 MiB limit above.
TEST(CachingAllocatorTest, MaxNonSplitRoundingWidensTheLimit) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config = MaxSplit(40);
  config.max_non_split_rounding = 40 * kMiB;
  CachingAllocator allocator(config, &backend);
  const Allocation a = MustMalloc(allocator, 60 * kMiB);
  MustFree(allocator, a);
  const Allocation b = MustMalloc(allocator, 40 * kMiB);  // 60 < 80
  EXPECT_EQ(b.address, a.address);
  EXPECT_EQ(b.size, 60 * kMiB);
  // Only an 80 MiB block cached: 80 >= 40 + 40, refused.
  const Allocation big = MustMalloc(allocator, 80 * kMiB);
  MustFree(allocator, big);
  const Allocation c = MustMalloc(allocator, 40 * kMiB);
  EXPECT_NE(c.address, big.address);
  EXPECT_EQ(c.size, 40 * kMiB);
  // 40 MiB + 512: 80 < 80 MiB + 512, taken whole.
  const Allocation d = MustMalloc(allocator, 40 * kMiB + 512);
  EXPECT_EQ(d.address, big.address);
  EXPECT_EQ(d.size, 80 * kMiB);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 3);
  ExpectConsistent(allocator, backend);
}

// Pins: should_split's "size < max_split_size" condition: a block taken by a
// request >= max_split_size is never split, whatever the remainder; requests
// below it split non-oversize blocks as usual.
TEST(CachingAllocatorTest, RequestsAtOrAboveMaxSplitNeverSplit) {
  {
    // Without max_split_size: 40 MiB from a cached 58 MiB block splits.
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(AllocatorConfig{}, &backend);
    const Allocation a = MustMalloc(allocator, 58 * kMiB);
    MustFree(allocator, a);
    const Allocation b = MustMalloc(allocator, 40 * kMiB);
    EXPECT_EQ(b.address, a.address);
    EXPECT_EQ(b.size, 40 * kMiB);
    EXPECT_EQ(Current(allocator.Stats().inactive_split_bytes),
              int64_t{18 * kMiB});
  }
  {
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(MaxSplit(40), &backend);
    const Allocation a = MustMalloc(allocator, 58 * kMiB);
    MustFree(allocator, a);
    const Allocation b = MustMalloc(allocator, 40 * kMiB);  // 58 < 60
    EXPECT_EQ(b.address, a.address);
    EXPECT_EQ(b.size, 58 * kMiB);
    EXPECT_EQ(Current(allocator.Stats().inactive_split), 0);
    // A 38 MiB (not oversize) cached block still splits for 12 MiB.
    const Allocation c = MustMalloc(allocator, 38 * kMiB);
    MustFree(allocator, c);
    const Allocation d = MustMalloc(allocator, 12 * kMiB);
    EXPECT_EQ(d.address, c.address);
    EXPECT_EQ(d.size, 12 * kMiB);
    EXPECT_EQ(Current(allocator.Stats().inactive_split_bytes),
              int64_t{26 * kMiB});
    ExpectConsistent(allocator, backend);
  }
}

// Pins: oversize_segments (alloc_block / release_block: segments >=
// max_split_size) and oversize_allocations (alloc_found_block / free: blocks
// >= max_split_size), and stats.max_split_size (SIZE_MAX reads as -1).
TEST(CachingAllocatorTest, OversizeStats) {
  {
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(AllocatorConfig{}, &backend);
    MustMalloc(allocator, 100 * kMiB);
    EXPECT_EQ(allocator.Stats().oversize_segments.current, 0);
    EXPECT_EQ(allocator.Stats().oversize_allocations.current, 0);
    EXPECT_EQ(allocator.Stats().max_split_size, -1);
    EXPECT_EQ(MemoryStatsDict(allocator.Stats()).at("max_split_size"), -1);
  }
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(MaxSplit(40), &backend);
  EXPECT_EQ(allocator.Stats().max_split_size, int64_t{40 * kMiB});
  const Allocation a = MustMalloc(allocator, 40 * kMiB);  // == max_split
  const Allocation b = MustMalloc(allocator, 50 * kMiB);
  const Allocation c = MustMalloc(allocator, 38 * kMiB);
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.oversize_segments.current, 2);
  EXPECT_EQ(s.oversize_allocations.current, 2);
  MustFree(allocator, a);
  MustFree(allocator, c);
  EXPECT_EQ(s.oversize_allocations.current, 1);
  EXPECT_EQ(s.oversize_allocations.peak, 2);
  EXPECT_EQ(s.oversize_segments.current, 2);
  allocator.EmptyCache();  // frees a's and c's segments
  EXPECT_EQ(s.oversize_segments.current, 1);
  EXPECT_EQ(s.oversize_segments.peak, 2);
  MustFree(allocator, b);
  EXPECT_EQ(s.oversize_allocations.current, 0);
  const std::map<std::string, int64_t> dict = MemoryStatsDict(s);
  EXPECT_EQ(dict.at("oversize_segments.current"), 1);
  EXPECT_EQ(dict.at("oversize_allocations.peak"), 2);
  EXPECT_EQ(dict.at("oversize_allocations.allocated"), 2);
  EXPECT_EQ(dict.at("oversize_allocations.freed"), 2);
  EXPECT_EQ(dict.at("max_split_size"), int64_t{40 * kMiB});
}

// Pins: DeviceCachingAllocator sets stats.max_split_size once, in its
// constructor; _set_allocator_settings changes later decisions but not that
// stat.
TEST(CachingAllocatorTest, ReconfigureChangesDecisionsNotTheMaxSplitStat) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  allocator.Reconfigure(MaxSplit(40));
  const Allocation a = MustMalloc(allocator, 50 * kMiB);
  MustFree(allocator, a);
  // Now oversize: a 4 MiB request no longer takes the 50 MiB block.
  EXPECT_NE(MustMalloc(allocator, 4 * kMiB).address, a.address);
  EXPECT_EQ(allocator.Stats().oversize_segments.current, 1);
  EXPECT_EQ(allocator.Stats().max_split_size, -1);
}

// ===========================================================================
// The out-of-memory path: malloc's alloc_block ||
// (release_available_cached_blocks && alloc_block) ||
// (release_cached_blocks && alloc_block(isRetry=true)), then the OOM error.

// Pins: release_available_cached_blocks, single-block case: with
// max_split_size set, free the smallest cached block >= max(size,
// max_split_size) - only that one - and retry cudaMalloc without a sync.
TEST(CachingAllocatorTest, ReleaseAvailableFreesOneBigEnoughOversizeBlock) {
  RecordingBackend backend(100 * kMiB);
  CachingAllocator allocator(MaxSplit(40), &backend);
  const Allocation a = MustMalloc(allocator, 50 * kMiB);
  const Allocation b = MustMalloc(allocator, 44 * kMiB);
  MustFree(allocator, a);
  MustFree(allocator, b);
  backend.ClearCalls();
  // 30 MiB < max_split: the cached 44 MiB block is refused; 94 + 30 > 100.
  const Allocation c = MustMalloc(allocator, 30 * kMiB);
  EXPECT_THAT(backend.calls(),
              ElementsAre(AllocateFailed(30 * kMiB), Free(b.address, 44 * kMiB),
                          Allocate(30 * kMiB, c.address)));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{80 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: release_available_cached_blocks, several-blocks case: no single
// block is large enough, so oversize blocks go from the largest down until
// the freed bytes reach the request.
TEST(CachingAllocatorTest, ReleaseAvailableFreesLargestOversizeBlocksFirst) {
  RecordingBackend backend(120 * kMiB);
  CachingAllocator allocator(MaxSplit(20), &backend);
  const Allocation a = MustMalloc(allocator, 22 * kMiB);
  const Allocation b = MustMalloc(allocator, 30 * kMiB);
  const Allocation c = MustMalloc(allocator, 36 * kMiB);
  MustFree(allocator, a);
  MustFree(allocator, b);
  MustFree(allocator, c);
  backend.ClearCalls();
  // 88 + 50 > 120. Freeing 36 then 30 (66 >= 50) is enough; 22 stays.
  const Allocation d = MustMalloc(allocator, 50 * kMiB);
  EXPECT_THAT(backend.calls(),
              ElementsAre(AllocateFailed(50 * kMiB), Free(c.address, 36 * kMiB),
                          Free(b.address, 30 * kMiB),
                          Allocate(50 * kMiB, d.address)));
  EXPECT_EQ(allocator.Stats().num_alloc_retries, 0);
  EXPECT_EQ(allocator.Stats().num_sync_all_streams, 0);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{72 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: release_available_cached_blocks returns false when max_split_size is
// unset, so the same situation goes to release_cached_blocks (a sync, a
// retry counted in num_alloc_retries).
TEST(CachingAllocatorTest, ReleaseAvailableNeedsMaxSplitSize) {
  for (bool with_max_split : {false, true}) {
    SCOPED_TRACE(with_max_split);
    RecordingBackend backend(100 * kMiB);
    CachingAllocator allocator(
        with_max_split ? MaxSplit(40) : AllocatorConfig{}, &backend);
    const Allocation a = MustMalloc(allocator, 50 * kMiB);
    const Allocation b = MustMalloc(allocator, 44 * kMiB);
    MustFree(allocator, a);
    MustFree(allocator, b);
    MustMalloc(allocator, 60 * kMiB);
    const DeviceStats& s = allocator.Stats();
    EXPECT_EQ(s.num_device_free, 2);
    EXPECT_EQ(s.num_alloc_retries, with_max_split ? 0 : 1);
    EXPECT_EQ(s.num_sync_all_streams, with_max_split ? 0 : 1);
    EXPECT_EQ(Current(s.reserved_bytes), int64_t{60 * kMiB});
    ExpectConsistent(allocator, backend);
  }
}

// Pins: release_cached_blocks (synchronize_and_free_events, then
// release_blocks(large_blocks), release_blocks(small_blocks): only blocks
// with no prev/next, i.e. whole segments) and alloc_block(isRetry=true);
// then the OOM: num_ooms, OutOfMemoryError "CUDA out of memory. Tried to
// allocate <alloc_size>. ..." with format_size figures; the failed request
// changes nothing else.
TEST(CachingAllocatorTest, ReleaseCachedBlocksThenOutOfMemory) {
  RecordingBackend backend(64 * kMiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation s_a = MustMalloc(allocator, kMiB);  // small segment 1
  const Allocation s_b = MustMalloc(allocator, kMiB);  // same segment
  const Allocation s_c = MustMalloc(allocator, kMiB);  // small segment 2
  EXPECT_EQ(s_b.address, s_a.address + kMiB);
  const Allocation l2 = MustMalloc(allocator, 2 * kMiB);   // [2][18 free]
  const Allocation l1 = MustMalloc(allocator, 19 * kMiB);  // 20 MiB, unsplit
  MustFree(allocator, s_c);  // segment 2: one free 2 MiB block
  MustFree(allocator, s_a);  // segment 1: [free][s_b]: split, stays
  MustFree(allocator, l1);   // a free 20 MiB segment
  EXPECT_EQ(backend.used(), 44 * kMiB);
  backend.ClearCalls();

  const Allocation big = MustMalloc(allocator, 30 * kMiB);
  // Large pool first, then small; split segments stay.
  EXPECT_THAT(backend.calls(),
              ElementsAre(AllocateFailed(30 * kMiB), Free(l1.address, 20 * kMiB),
                          Free(s_c.address, 2 * kMiB),
                          Allocate(30 * kMiB, big.address)));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.num_ooms, 0);
  ExpectConsistent(allocator, backend);

  // 52 MiB reserved, nothing left to free: 40 MiB cannot be had.
  backend.ClearCalls();
  absl::StatusOr<Allocation> oom = allocator.Malloc(40 * kMiB, 0);
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(oom.status().message()),
              HasSubstr("CUDA out of memory. Tried to allocate 40.00 MiB. "
                        "GPU 0 has a total capacity of 64.00 MiB of which "
                        "12.00 MiB is free. "));
  EXPECT_THAT(std::string(oom.status().message()),
              HasSubstr("Of the allocated memory 33.00 MiB is allocated by "
                        "PyTorch, and 19.00 MiB is reserved by PyTorch but "
                        "unallocated."));
  EXPECT_THAT(backend.calls(), ElementsAre(AllocateFailed(40 * kMiB),
                                           AllocateFailed(40 * kMiB)));
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 2);
  EXPECT_EQ(s.num_sync_all_streams, 2);
  EXPECT_EQ(Current(s.allocation), 3);  // s_b, l2, big
  EXPECT_EQ(Current(s.allocated_bytes), int64_t{33 * kMiB});
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{52 * kMiB});
  ExpectConsistent(allocator, backend);

  // Still usable: free big, and 40 MiB fits after the cache flush.
  MustFree(allocator, big);
  const Allocation again = MustMalloc(allocator, 40 * kMiB);
  EXPECT_EQ(again.size, 40 * kMiB);
  EXPECT_EQ(s.num_ooms, 1);
  MustFree(allocator, l2);
  MustFree(allocator, s_b);
  ExpectConsistent(allocator, backend);
}

// Pins: alloc_block throws (C10_CUDA_CHECK) for a cudaMalloc error other
// than cudaErrorMemoryAllocation: no cache release, no retry, no num_ooms.
TEST(CachingAllocatorTest, NonMemoryBackendErrorsFailWithoutReleasing) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(MaxSplit(40), &backend);
  const Allocation a = MustMalloc(allocator, 50 * kMiB);
  MustFree(allocator, a);
  backend.FailWith(absl::InternalError("cudaErrorLaunchFailure"));
  absl::StatusOr<Allocation> r = allocator.Malloc(30 * kMiB, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(s.num_device_free, 0);
  EXPECT_THAT(backend.CallsOf(Op::kFree), IsEmpty());
  backend.FailWith(absl::OkStatus());
  EXPECT_EQ(MustMalloc(allocator, 45 * kMiB).address, a.address);
  ExpectConsistent(allocator, backend);
}

// ===========================================================================
// set_per_process_memory_fraction and garbage collection.

// Pins: setMemoryFraction (allowed_memory_maximum = fraction x total memory)
// and alloc_block's "total_allocated_memory + size > allowed_memory_maximum"
// check, made before cudaMalloc; the OOM message's "<allowed> allowed; ".
TEST(CachingAllocatorTest, MemoryFractionCapsReservedMemory) {
  // 512 MiB free on a 1 GiB device: the cap follows the total.
  RecordingBackend backend(512 * kMiB, kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  allocator.SetMemoryFraction(0.1);  // 107374182 bytes
  const Allocation a = MustMalloc(allocator, 100 * kMiB);
  backend.ClearCalls();
  // A 4 MiB request needs a 20 MiB segment: 120 MiB > 102.4 MiB.
  absl::StatusOr<Allocation> r = allocator.Malloc(4 * kMiB, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("Tried to allocate 20.00 MiB. GPU 0 has a total "
                        "capacity of 1024.00 MiB of which 412.00 MiB is free. "
                        "102.40 MiB allowed; Of the allocated memory "
                        "100.00 MiB is allocated by PyTorch, and 0 bytes is "
                        "reserved by PyTorch but unallocated."));
  EXPECT_THAT(backend.CallsOf(Op::kAllocate), IsEmpty());
  EXPECT_EQ(allocator.Stats().num_ooms, 1);
  EXPECT_EQ(allocator.Stats().num_alloc_retries, 1);
  // A small segment (2 MiB) still fits under the cap: 102 MiB.
  MustMalloc(allocator, 512);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{102 * kMiB});
  MustFree(allocator, a);
  ExpectConsistent(allocator, backend);
}

// The GC scenario of the next tests: 12, 14 and 16 MiB segments, freed so
// that, when a 40 MiB request comes, the 12 MiB block has age 3 and the
// others age 1 (ages count large-pool get_free_block calls since a block was
// last inserted into the free set).
struct GcScenario {
  Allocation a12, b14, c16, big;
};
GcScenario RunGcScenario(CachingAllocator& allocator) {
  GcScenario r;
  r.a12 = MustMalloc(allocator, 12 * kMiB);  // count 1
  r.b14 = MustMalloc(allocator, 14 * kMiB);  // count 2
  r.c16 = MustMalloc(allocator, 16 * kMiB);  // count 3
  MustFree(allocator, r.a12);                // a: base 3
  MustFree(allocator, r.b14);                // b: base 3
  const Allocation x = MustMalloc(allocator, 14 * kMiB);  // count 4: b
  EXPECT_EQ(x.address, r.b14.address);
  MustFree(allocator, x);                                 // b: base 4
  const Allocation y = MustMalloc(allocator, 14 * kMiB);  // count 5: b
  MustFree(allocator, y);                                 // b: base 5
  MustFree(allocator, r.c16);                             // c: base 5
  // count 6: no fit; GC sees ages a=3, b=1, c=1 (average 5/3).
  r.big = MustMalloc(allocator, 40 * kMiB);
  return r;
}

// Pins: garbage_collect_cached_blocks: with reserved > threshold x allowed,
// free unsplit large blocks whose age >= the average age; one pass is
// enough when it reaches the target (reserved - threshold x allowed).
TEST(CachingAllocatorTest, GarbageCollectionFreesOldUnsplitBlocks) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.3;
  CachingAllocator allocator(config, &backend);
  allocator.SetMemoryFraction(0.1);
  // gc threshold 32212254 bytes; at the 40 MiB request reserved is 42 MiB:
  // target 11827938 bytes, met by freeing the 12 MiB block alone.
  const GcScenario r = RunGcScenario(allocator);
  EXPECT_THAT(backend.CallsOf(Op::kFree),
              ElementsAre(Free(r.a12.address, 12 * kMiB)));
  EXPECT_EQ(allocator.Stats().num_device_free, 1);
  EXPECT_EQ(allocator.Stats().num_sync_all_streams, 0);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{70 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: garbage_collect_cached_blocks repeats with the average age of the
// blocks left until the target is reached.
TEST(CachingAllocatorTest, GarbageCollectionRepeatsUntilTheTarget) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.2;
  CachingAllocator allocator(config, &backend);
  allocator.SetMemoryFraction(0.1);
  // gc threshold 21474836: target 22565356 bytes. Pass 1 frees a (12 MiB);
  // pass 2 (average (1+1)/2 = 1) frees b and c.
  const GcScenario r = RunGcScenario(allocator);
  EXPECT_THAT(backend.CallsOf(Op::kFree),
              ElementsAre(Free(r.a12.address, 12 * kMiB),
                          Free(r.b14.address, 14 * kMiB),
                          Free(r.c16.address, 16 * kMiB)));
  EXPECT_EQ(allocator.Stats().num_device_free, 3);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{40 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: malloc runs GC only when "set_fraction &&
// garbage_collection_threshold() > 0.0".
TEST(CachingAllocatorTest, GarbageCollectionNeedsFractionAndThreshold) {
  {
    RecordingBackend backend(kGiB);
    AllocatorConfig config;
    config.garbage_collection_threshold = 0.3;
    CachingAllocator allocator(config, &backend);  // no fraction
    RunGcScenario(allocator);
    EXPECT_EQ(allocator.Stats().num_device_free, 0);
    EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{82 * kMiB});
  }
  {
    RecordingBackend backend(kGiB);
    CachingAllocator allocator(AllocatorConfig{}, &backend);  // threshold 0
    allocator.SetMemoryFraction(0.1);
    RunGcScenario(allocator);
    EXPECT_EQ(allocator.Stats().num_device_free, 0);
    EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{82 * kMiB});
  }
}

// PyTorch 2.11: a fraction of 1 is no cap, so garbage collection stays off
// (seen on a real 2.11 run: the GC threshold acts only under a cap below 1).
TEST(CachingAllocatorTest, FractionOfOneLeavesGarbageCollectionOff) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.01;
  CachingAllocator allocator(config, &backend);
  allocator.SetMemoryFraction(1.0);
  RunGcScenario(allocator);
  EXPECT_EQ(allocator.Stats().num_device_free, 0);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{82 * kMiB});
}

// per_process_memory_fraction in the config is set_per_process_memory_fraction
// at allocator creation: the same cap, and GC acts under it.
TEST(CachingAllocatorTest, ConfigFractionActsFromTheStart) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.3;
  config.per_process_memory_fraction = 0.1;
  CachingAllocator allocator(config, &backend);
  const GcScenario r = RunGcScenario(allocator);
  EXPECT_THAT(backend.CallsOf(Op::kFree),
              ElementsAre(Free(r.a12.address, 12 * kMiB)));
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{70 * kMiB});
}

// large_segment_size_mb (PyTorch 2.11) replaces the 20 MiB segment of 1-10
// MiB requests and the large-pool page of expandable segments.
TEST(CachingAllocatorTest, LargeSegmentSizeSetsSegmentAndPageSize) {
  for (const bool expandable : {false, true}) {
    RecordingBackend backend(kGiB);
    AllocatorConfig config;
    config.large_segment_size = 64 * kMiB;
    config.expandable_segments = expandable;
    CachingAllocator allocator(config, &backend);
    const Allocation a = MustMalloc(allocator, 5 * kMiB);
    EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{64 * kMiB})
        << "expandable " << expandable;
    MustFree(allocator, a);
  }
}

// Pins: garbage_collect_cached_blocks only considers large_blocks with
// !is_split(): a free tail of a split segment and free small-pool segments
// are never collected.
TEST(CachingAllocatorTest, GarbageCollectionLeavesSplitAndSmallBlocks) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.1;
  CachingAllocator allocator(config, &backend);
  allocator.SetMemoryFraction(0.1);
  MustFree(allocator, MustMalloc(allocator, 512));  // a free 2 MiB segment
  MustMalloc(allocator, 2 * kMiB);   // [2][18 free]
  MustMalloc(allocator, 30 * kMiB);  // GC runs (22 MiB > 10.24 MB), frees 0
  EXPECT_EQ(allocator.Stats().num_device_free, 0);
  EXPECT_THAT(backend.CallsOf(Op::kFree), IsEmpty());
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{52 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: the age counter is per pool. get_free_block increments
// "++pool.get_free_blocks_call_count" of the pool it searches
// (CUDACachingAllocator.cpp, PyTorch 2.11), and gc_count() is
// "pool->get_free_blocks_call_count - gc_count_base": small-pool requests do
// not age large-pool blocks. Then every unsplit block at least as old as the
// average goes in one pass, even past the target. With one counter for both
// pools the 12 MiB block would look ten lookups older than the 14 MiB one
// and go alone: one cudaFree instead of two, and the next 14 MiB request
// would reuse the cached block instead of calling cudaMalloc.
TEST(CachingAllocatorTest, GarbageCollectionAgesBlocksByTheirOwnPoolsLookups) {
  RecordingBackend backend(kGiB);
  AllocatorConfig config;
  config.garbage_collection_threshold = 0.35;
  CachingAllocator allocator(config, &backend);
  allocator.SetMemoryFraction(0.1);  // 107374182 bytes; GC above 37580963
  // A small segment first, so that later small requests all hit (a miss in
  // either pool runs GC over the large pool).
  MustFree(allocator, MustMalloc(allocator, 512));
  const Allocation a12 = MustMalloc(allocator, 12 * kMiB);  // large count 1
  const Allocation b14 = MustMalloc(allocator, 14 * kMiB);  // large count 2
  MustMalloc(allocator, 16 * kMiB);                         // large count 3
  MustFree(allocator, a12);                                 // a: base 3
  for (int i = 0; i < 10; ++i) {
    MustFree(allocator, MustMalloc(allocator, 512));  // small-pool hits only
  }
  MustFree(allocator, b14);  // b: base 3
  backend.ClearCalls();
  // Large count 4: no fit. Reserved 44 MiB > 37580963: target 8556381
  // bytes. Ages a = b = 1, average 1: both go, though a alone would do.
  MustMalloc(allocator, 40 * kMiB);
  EXPECT_THAT(backend.CallsOf(Op::kFree),
              ElementsAre(Free(a12.address, 12 * kMiB), Free(b14.address, 14 * kMiB)));
  backend.ClearCalls();
  MustMalloc(allocator, 14 * kMiB);  // b is gone: a new segment
  EXPECT_EQ(backend.CallsOf(Op::kAllocate).size(), 1u);
  EXPECT_EQ(allocator.Stats().num_device_free, 2);
  ExpectConsistent(allocator, backend);
}

// ===========================================================================
// Frees that wait on other streams (record_stream): free() with stream_uses
// -> insert_events; the block returns in process_events / free_block, or in
// synchronize_and_free_events on a cache flush.

// Pins: free(): allocation and allocated_bytes drop at once; active,
// active_bytes and requested_bytes drop in free_block; the block cannot be
// reused before.
TEST(CachingAllocatorTest, DeferredFreeReusesTheBlockOnlyAfterCompletion) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB);
  ASSERT_TRUE(allocator.FreeDeferred(a).ok());
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(Current(s.allocation), 0);
  EXPECT_EQ(Current(s.allocated_bytes), 0);
  EXPECT_EQ(Current(s.active), 1);
  EXPECT_EQ(Current(s.active_bytes), int64_t{12 * kMiB});
  EXPECT_EQ(Current(s.requested_bytes), int64_t{12 * kMiB});
  const std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_EQ(snapshot[0].blocks[0].state, BlockInfo::State::kFreePending);
  ExpectConsistent(allocator, backend);

  const Allocation b = MustMalloc(allocator, 12 * kMiB);
  EXPECT_NE(b.address, a.address);
  EXPECT_EQ(s.num_device_alloc, 2);

  allocator.CompleteFree(a);
  EXPECT_EQ(Current(s.active), 1);
  EXPECT_EQ(Current(s.active_bytes), int64_t{12 * kMiB});
  EXPECT_EQ(Current(s.requested_bytes), int64_t{12 * kMiB});
  EXPECT_EQ(MustMalloc(allocator, 12 * kMiB).address, a.address);
  EXPECT_EQ(s.num_device_alloc, 2);
  ExpectConsistent(allocator, backend);
}

// Pins: emptyCache -> release_cached_blocks -> synchronize_and_free_events:
// pending frees complete (and their now-free segments are released);
// completing such a free later does nothing.
TEST(CachingAllocatorTest, EmptyCacheCompletesPendingFrees) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB);
  const Allocation b = MustMalloc(allocator, 12 * kMiB);
  ASSERT_TRUE(allocator.FreeDeferred(a).ok());
  allocator.EmptyCache();
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_THAT(backend.CallsOf(Op::kFree),
              ElementsAre(Free(a.address, 12 * kMiB)));
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{12 * kMiB});
  EXPECT_EQ(Current(s.active), 1);
  ExpectConsistent(allocator, backend);

  const std::map<std::string, int64_t> before = MemoryStatsDict(s);
  allocator.CompleteFree(a);
  EXPECT_EQ(MemoryStatsDict(s), before);
  EXPECT_EQ(allocator.Free(a).code(), absl::StatusCode::kInvalidArgument);
  MustFree(allocator, b);
  ExpectConsistent(allocator, backend);
}

// Not PyTorch's (allocd's answer to a reclaim of N bytes): release the
// smallest free whole segment that covers N alone, else free whole segments
// from the largest down until N is covered, as release_available_cached_blocks
// picks oversize blocks; the rest stays cached, and nothing synchronizes.
TEST(CachingAllocatorTest, ReleaseCachedGivesBackWhatIsAskedAndKeepsTheRest) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB);
  const Allocation b = MustMalloc(allocator, 20 * kMiB);
  const Allocation c = MustMalloc(allocator, 30 * kMiB);
  const Allocation d = MustMalloc(allocator, 40 * kMiB);
  const Allocation small = MustMalloc(allocator, kKiB);
  const Allocation live = MustMalloc(allocator, 8 * kMiB);  // split: stays
  for (const Allocation& x : {a, b, c, d, small}) MustFree(allocator, x);
  backend.ClearCalls();

  EXPECT_EQ(allocator.ReleaseCached(0), 0u);
  EXPECT_EQ(allocator.ReleaseCached(25 * kMiB), 30 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Free(c.address, 30 * kMiB)));
  backend.ClearCalls();
  // No single one covers 50 MiB: 40 then 20 (60 >= 50); 12 stays.
  EXPECT_EQ(allocator.ReleaseCached(50 * kMiB), 60 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Free(d.address, 40 * kMiB),
                                           Free(b.address, 20 * kMiB)));
  backend.ClearCalls();
  // The small pool's segments count as any other.
  EXPECT_EQ(allocator.ReleaseCached(kMiB), 2 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Free(small.address, 2 * kMiB)));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{(12 + 20) * kMiB});
  EXPECT_EQ(s.num_sync_all_streams, 0);
  ExpectConsistent(allocator, backend);

  // More than is cached: everything EmptyCache gives back, the live
  // allocation's segment kept.
  backend.ClearCalls();
  EXPECT_EQ(allocator.ReleaseCached(kGiB), 12 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Free(a.address, 12 * kMiB)));
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{20 * kMiB});
  MustFree(allocator, live);
  ExpectConsistent(allocator, backend);
}

// ReleaseCached on expandable segments: a free block's whole pages count as
// a segment of their size; one block's pages go, the other's stay mapped.
TEST(CachingAllocatorTest, ReleaseCachedUnmapsTheFewestExpandableBlocks) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation a = MustMalloc(allocator, 40 * kMiB);
  const Allocation b = MustMalloc(allocator, 20 * kMiB);
  const Allocation c = MustMalloc(allocator, 60 * kMiB);
  const Allocation d = MustMalloc(allocator, 20 * kMiB);
  MustFree(allocator, a);
  MustFree(allocator, c);
  backend.ClearCalls();
  EXPECT_EQ(allocator.ReleaseCached(50 * kMiB), 60 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Unmap(c.address, 60 * kMiB)));
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes),
            int64_t{(40 + 20 + 20) * kMiB});
  ExpectConsistent(allocator, backend);
  MustFree(allocator, b);
  MustFree(allocator, d);
}

// Pins: the retry path's release_cached_blocks also synchronizes: a pending
// free completes, its segment is released, and cudaMalloc is retried (a new
// segment, no second best-fit search).
TEST(CachingAllocatorTest, RetryPathCompletesPendingFrees) {
  RecordingBackend backend(30 * kMiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB);
  ASSERT_TRUE(allocator.FreeDeferred(a).ok());
  const Allocation b = MustMalloc(allocator, 12 * kMiB);
  backend.ClearCalls();
  const Allocation c = MustMalloc(allocator, 12 * kMiB);  // 36 > 30 first
  EXPECT_THAT(backend.calls(),
              ElementsAre(AllocateFailed(12 * kMiB), Free(a.address, 12 * kMiB),
                          Allocate(12 * kMiB, c.address)));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_ooms, 0);
  allocator.CompleteFree(a);  // no-op
  EXPECT_EQ(Current(s.active), 2);
  MustFree(allocator, b);
  MustFree(allocator, c);
  ExpectConsistent(allocator, backend);
}

// Pins: try_merge_blocks skips blocks with outstanding events: a pending
// block is not merged into a neighbour freed meanwhile, only at completion.
TEST(CachingAllocatorTest, PendingBlocksDoNotMerge) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation x = MustMalloc(allocator, 512);
  const Allocation y = MustMalloc(allocator, 512);
  ASSERT_TRUE(allocator.FreeDeferred(x).ok());
  MustFree(allocator, y);  // merges with the tail, not with x
  std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  ASSERT_EQ(snapshot[0].blocks.size(), 2u);
  EXPECT_EQ(snapshot[0].blocks[0].state, BlockInfo::State::kFreePending);
  EXPECT_EQ(snapshot[0].blocks[0].size, 512u);
  EXPECT_EQ(snapshot[0].blocks[1].state, BlockInfo::State::kInactive);
  EXPECT_EQ(snapshot[0].blocks[1].size, 2 * kMiB - 512);
  EXPECT_EQ(Current(allocator.Stats().inactive_split, kSmall), 1);
  ExpectConsistent(allocator, backend);
  allocator.CompleteFree(x);
  snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot[0].blocks.size(), 1u);
  EXPECT_EQ(snapshot[0].blocks[0].size, 2 * kMiB);
  EXPECT_EQ(Current(allocator.Stats().inactive_split, kSmall), 0);
  ExpectConsistent(allocator, backend);
}

// Pins: NativeCachingAllocator::free's "invalid device pointer" for a pointer
// that is not allocated (a double free), for both kinds of free.
TEST(CachingAllocatorTest, DoubleFreeIsInvalidArgument) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  EXPECT_EQ(allocator.Free(Allocation{}).code(),
            absl::StatusCode::kInvalidArgument);
  const Allocation a = MustMalloc(allocator, 512);
  MustFree(allocator, a);
  EXPECT_EQ(allocator.Free(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.FreeDeferred(a).code(),
            absl::StatusCode::kInvalidArgument);
  const Allocation b = MustMalloc(allocator, 512);
  ASSERT_TRUE(allocator.FreeDeferred(b).ok());
  EXPECT_EQ(allocator.Free(b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.FreeDeferred(b).code(),
            absl::StatusCode::kInvalidArgument);
  allocator.CompleteFree(b);
  EXPECT_EQ(allocator.Free(b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Current(allocator.Stats().allocation), 0);
  EXPECT_EQ(Current(allocator.Stats().active), 0);
  ExpectConsistent(allocator, backend);
}

// ===========================================================================
// Expandable segments (ExpandableSegment, find_expandable_block, map_block,
// try_allocate_expandable_block, unmap_block, release_expandable_segment).

// Pins: ExpandableSegment's address reservation (numSegments(total +
// total / 8) pages), 2 MiB pages for the small pool and 20 MiB for the large
// pool; map_block's stats (reserved_bytes, num_device_alloc, no "segment");
// free_block leaving expandable blocks out of inactive_split.
TEST(CachingAllocatorTest, ExpandableSegmentsMapPagesPerPool) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation s = MustMalloc(allocator, 1000);
  ASSERT_EQ(backend.calls().size(), 2u);
  const uint64_t small_base = backend.calls()[0].address;
  EXPECT_EQ(backend.calls()[0],
            (Call{Op::kReserve, small_base, kSmallReservation1GiB}));
  EXPECT_EQ(backend.calls()[1], Map(small_base, 2 * kMiB));
  EXPECT_EQ(s.address, small_base);
  EXPECT_EQ(s.size, 1024u);

  const Allocation l = MustMalloc(allocator, kMiB + 1);
  ASSERT_EQ(backend.calls().size(), 4u);
  const uint64_t large_base = backend.calls()[2].address;
  EXPECT_EQ(backend.calls()[2],
            (Call{Op::kReserve, large_base, kLargeReservation1GiB}));
  EXPECT_EQ(backend.calls()[3], Map(large_base, 20 * kMiB));
  EXPECT_EQ(l.address, large_base);
  EXPECT_EQ(l.size, kMiB + 512);

  const DeviceStats& st = allocator.Stats();
  EXPECT_EQ(Current(st.reserved_bytes, kSmall), int64_t{2 * kMiB});
  EXPECT_EQ(Current(st.reserved_bytes, kLarge), int64_t{20 * kMiB});
  EXPECT_EQ(st.num_device_alloc, 2);
  EXPECT_EQ(Current(st.segment), 0);
  EXPECT_EQ(Current(st.inactive_split), 0);
  EXPECT_EQ(Current(st.inactive_split_bytes), 0);
  ExpectConsistent(allocator, backend);
}

// Pins: try_allocate_expandable_block: a free block followed by unmapped
// space grows by mapping only the missing pages, at the lowest address; then
// unmap_block on emptyCache unmaps only whole free pages, and
// release_blocks -> release_expandable_segment drops a fully unmapped
// segment.
TEST(CachingAllocatorTest, ExpandableSegmentsGrowAndShrink) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation a = MustMalloc(allocator, kMiB + 1);  // [a][19 MiB - 512]
  const uint64_t base = a.address;
  const Allocation b = MustMalloc(allocator, 30 * kMiB);
  EXPECT_EQ(b.address, base + kMiB + 512);
  EXPECT_EQ(b.size, 30 * kMiB);
  EXPECT_THAT(backend.CallsOf(Op::kMap),
              ElementsAre(Map(base, 20 * kMiB), Map(base + 20 * kMiB, 20 * kMiB)));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{40 * kMiB});
  EXPECT_EQ(s.num_device_alloc, 2);
  ExpectConsistent(allocator, backend);

  // Free b: [a][39 MiB - 512 free]. Only page 1 is wholly free.
  MustFree(allocator, b);
  allocator.EmptyCache();
  EXPECT_THAT(backend.CallsOf(Op::kUnmap),
              ElementsAre(Unmap(base + 20 * kMiB, 20 * kMiB)));
  EXPECT_THAT(backend.CallsOf(Op::kRelease), IsEmpty());
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{20 * kMiB});
  EXPECT_EQ(s.num_device_free, 1);
  ExpectConsistent(allocator, backend);

  MustFree(allocator, a);
  allocator.EmptyCache();
  EXPECT_THAT(backend.CallsOf(Op::kUnmap),
              ElementsAre(Unmap(base + 20 * kMiB, 20 * kMiB),
                          Unmap(base, 20 * kMiB)));
  EXPECT_THAT(backend.CallsOf(Op::kRelease),
              ElementsAre(Release(base, kLargeReservation1GiB)));
  EXPECT_EQ(Current(s.reserved_bytes), 0);
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_THAT(allocator.Snapshot(), IsEmpty());
  ExpectConsistent(allocator, backend);
}

// Pins: find_expandable_block returns "the smallest possible address in any
// segment where there is enough free address space": a hole left by an
// earlier unmap is filled before the end grows, when the request fits it.
// snapshot() reports one segment per contiguous mapped range.
TEST(CachingAllocatorTest, ExpandableSegmentsFillTheLowestGapFirst) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation x = MustMalloc(allocator, 20 * kMiB);
  const uint64_t base = x.address;
  const Allocation y = MustMalloc(allocator, 20 * kMiB);
  const Allocation z = MustMalloc(allocator, 20 * kMiB);
  EXPECT_EQ(y.address, base + 20 * kMiB);
  EXPECT_EQ(z.address, base + 40 * kMiB);
  MustFree(allocator, y);
  allocator.EmptyCache();  // unmaps page 1: a hole between x and z
  std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  EXPECT_EQ(snapshot[0].address, base);
  EXPECT_EQ(snapshot[0].total_size, 20 * kMiB);
  EXPECT_EQ(snapshot[1].address, base + 40 * kMiB);
  EXPECT_TRUE(snapshot[0].is_expandable);
  ExpectConsistent(allocator, backend);

  // 30 MiB does not fit the 20 MiB hole: the end grows.
  backend.ClearCalls();
  const Allocation v = MustMalloc(allocator, 30 * kMiB);
  EXPECT_EQ(v.address, base + 60 * kMiB);
  // 20 MiB fits the hole (v's 10 MiB tail does not): the hole is mapped.
  const Allocation w = MustMalloc(allocator, 20 * kMiB);
  EXPECT_EQ(w.address, base + 20 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Map(base + 60 * kMiB, 40 * kMiB),
                                           Map(base + 20 * kMiB, 20 * kMiB)));
  snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_EQ(snapshot[0].total_size, 100 * kMiB);
  ASSERT_EQ(snapshot[0].blocks.size(), 5u);
  EXPECT_EQ(Current(allocator.Stats().reserved_bytes), int64_t{100 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: get_free_block with expandable segments: a block that can grow into
// unmapped space counts as its grown size ("expandable_size"), so a larger
// block that cannot grow is preferred to it.
TEST(CachingAllocatorTest, ExpandableBestFitCountsGrowableBlocksAsGrown) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation x = MustMalloc(allocator, 12 * kMiB);  // [x][8 free]
  const Allocation y = MustMalloc(allocator, 6 * kMiB);   // [x][y][2 free]
  EXPECT_EQ(y.address, x.address + 12 * kMiB);
  MustFree(allocator, x);  // [12 free][y][2 free, growable]
  // 1.5 MiB: the 2 MiB tail is the smallest by size, but it can grow; the
  // 12 MiB block cannot and wins.
  const Allocation z = MustMalloc(allocator, kMiB + 512 * kKiB);
  EXPECT_EQ(z.address, x.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 1);
  ExpectConsistent(allocator, backend);
}

// Pins: one expandable segment per stream (find_expandable_block searches the
// pool's unmapped blocks of the request's stream only).
TEST(CachingAllocatorTest, ExpandableSegmentsArePerStream) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation a = MustMalloc(allocator, 20 * kMiB, 0);
  const Allocation b = MustMalloc(allocator, 20 * kMiB, 1);
  EXPECT_EQ(backend.CallsOf(Op::kReserve).size(), 2u);
  MustFree(allocator, a);
  MustFree(allocator, b);
  EXPECT_EQ(MustMalloc(allocator, 20 * kMiB, 1).address, b.address);
  EXPECT_EQ(MustMalloc(allocator, 20 * kMiB, 0).address, a.address);
  EXPECT_EQ(allocator.Stats().num_device_alloc, 2);
  EXPECT_EQ(backend.CallsOf(Op::kReserve).size(), 2u);
  ExpectConsistent(allocator, backend);
}

// Pins: when mapping fails (map_block returns false -> alloc_block fails),
// release_cached_blocks unmaps free pages of every stream's segments and
// releases emptied segments, and the retry maps.
TEST(CachingAllocatorTest, ExpandableOutOfMemoryUnmapsFreePagesAndRetries) {
  RecordingBackend backend(60 * kMiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation x = MustMalloc(allocator, 20 * kMiB, 0);
  const Allocation y = MustMalloc(allocator, 20 * kMiB, 1);
  MustFree(allocator, y);
  backend.ClearCalls();
  const Allocation z = MustMalloc(allocator, 40 * kMiB, 0);
  EXPECT_EQ(z.address, x.address + 20 * kMiB);
  ASSERT_EQ(backend.calls().size(), 4u);
  EXPECT_EQ(backend.calls()[0], Map(z.address, 40 * kMiB, /*ok=*/false));
  EXPECT_EQ(backend.calls()[1], Unmap(y.address, 20 * kMiB));
  EXPECT_EQ(backend.calls()[2].op, Op::kRelease);
  EXPECT_EQ(backend.calls()[2].address, y.address);
  EXPECT_EQ(backend.calls()[3], Map(z.address, 40 * kMiB));
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_device_alloc, 3);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{60 * kMiB});
  ExpectConsistent(allocator, backend);
}

// Pins: ExpandableSegment::map throws (C10_CUDA_DRIVER_CHECK) when cuMemCreate
// fails with anything but CUDA_ERROR_OUT_OF_MEMORY: the error reaches the
// caller; nothing is unmapped, retried or counted as an OOM.
TEST(CachingAllocatorTest, ExpandableNonMemoryMapErrorsFailWithoutReleasing) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  MustMalloc(allocator, 20 * kMiB, 0);
  const Allocation y = MustMalloc(allocator, 20 * kMiB, 1);
  MustFree(allocator, y);
  backend.FailWith(absl::InternalError("CUDA_ERROR_ILLEGAL_STATE"));
  absl::StatusOr<Allocation> r = allocator.Malloc(20 * kMiB, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  const DeviceStats& s = allocator.Stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_THAT(backend.CallsOf(Op::kUnmap), IsEmpty());
  backend.FailWith(absl::OkStatus());
  MustMalloc(allocator, 20 * kMiB, 0);
  ExpectConsistent(allocator, backend);
}

// Pins: get_free_block skips expandable blocks once expandable_segments is
// turned off, and alloc_block then uses cudaMalloc ("When disabled, the
// allocator will not put new allocations in an expandable block").
TEST(CachingAllocatorTest, ReconfigureExpandableOffStopsUsingExpandable) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(Expandable(), &backend);
  const Allocation x = MustMalloc(allocator, 20 * kMiB);
  MustFree(allocator, x);
  allocator.Reconfigure(AllocatorConfig{});
  backend.ClearCalls();
  const Allocation y = MustMalloc(allocator, 4 * kMiB);
  EXPECT_THAT(backend.calls(), ElementsAre(Allocate(20 * kMiB, y.address)));
  EXPECT_EQ(y.size, 4 * kMiB);
  const std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 2u);
  EXPECT_NE(snapshot[0].is_expandable, snapshot[1].is_expandable);
  EXPECT_EQ(Current(allocator.Stats().segment), 1);
  ExpectConsistent(allocator, backend);
  // Turned back on, the expandable block serves requests again.
  allocator.Reconfigure(Expandable());
  EXPECT_EQ(MustMalloc(allocator, 20 * kMiB).address, x.address);
}

// ===========================================================================
// Stats through a scripted sequence.

// Pins: the stat updates of alloc_block, alloc_found_block, free, free_block
// and release_block (allocated / reserved / active / requested /
// inactive_split / segment / allocation, current and peak), resetPeakStats,
// and the memory_stats() names.
TEST(CachingAllocatorTest, StatsThroughAScriptedSequence) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const DeviceStats& s = allocator.Stats();

  // 1. 1000 bytes: a 2 MiB small segment, [1024][2 MiB - 1024 free].
  const Allocation a = MustMalloc(allocator, 1000);
  EXPECT_EQ(Current(s.allocated_bytes, kSmall), 1024);
  EXPECT_EQ(Current(s.requested_bytes, kSmall), 1000);
  EXPECT_EQ(Current(s.reserved_bytes, kSmall), int64_t{2 * kMiB});
  EXPECT_EQ(Current(s.inactive_split, kSmall), 1);
  EXPECT_EQ(Current(s.inactive_split_bytes, kSmall), int64_t{2 * kMiB - 1024});

  // 2. 3 MiB: a 20 MiB large segment, [3][17 free].
  const Allocation b = MustMalloc(allocator, 3 * kMiB);
  EXPECT_EQ(Current(s.allocated_bytes), int64_t{1024 + 3 * kMiB});
  EXPECT_EQ(Current(s.reserved_bytes), int64_t{22 * kMiB});
  EXPECT_EQ(Current(s.inactive_split), 2);
  EXPECT_EQ(Current(s.inactive_split_bytes, kLarge), int64_t{17 * kMiB});

  // 3. 17 MiB takes the 17 MiB block whole: no longer inactive.
  const Allocation c = MustMalloc(allocator, 17 * kMiB);
  EXPECT_EQ(c.address, b.address + 3 * kMiB);
  EXPECT_EQ(Current(s.allocated_bytes), int64_t{1024 + 20 * kMiB});
  EXPECT_EQ(Current(s.inactive_split, kLarge), 0);
  EXPECT_EQ(Current(s.inactive_split_bytes, kLarge), 0);
  EXPECT_EQ(Current(s.active), 3);
  EXPECT_EQ(Current(s.allocation), 3);

  // 4. Free c: an inactive block of a split segment again.
  MustFree(allocator, c);
  EXPECT_EQ(Current(s.inactive_split, kLarge), 1);
  EXPECT_EQ(Current(s.inactive_split_bytes, kLarge), int64_t{17 * kMiB});
  // 5. Free b: merges with c into one unsplit 20 MiB block.
  MustFree(allocator, b);
  EXPECT_EQ(Current(s.inactive_split, kLarge), 0);
  EXPECT_EQ(Current(s.inactive_split_bytes, kLarge), 0);
  EXPECT_EQ(Current(s.allocated_bytes), 1024);
  EXPECT_EQ(s.allocated_bytes.all().peak, int64_t{1024 + 20 * kMiB});
  EXPECT_EQ(s.active_bytes.large_pool().peak, int64_t{20 * kMiB});
  EXPECT_EQ(s.requested_bytes.all().peak, int64_t{1000 + 20 * kMiB});
  ExpectConsistent(allocator, backend);

  // 6. resetPeakStats: peaks drop to the current values.
  allocator.ResetPeakStats();
  EXPECT_EQ(s.allocated_bytes.all().peak, 1024);
  EXPECT_EQ(s.reserved_bytes.all().peak, int64_t{22 * kMiB});
  EXPECT_EQ(s.inactive_split.small_pool().peak, 1);

  // 7. Free a; 8. empty_cache returns both segments.
  MustFree(allocator, a);
  allocator.EmptyCache();
  EXPECT_EQ(Current(s.reserved_bytes), 0);
  EXPECT_EQ(Current(s.segment), 0);

  const std::map<std::string, int64_t> dict = MemoryStatsDict(s);
  EXPECT_EQ(dict.at("allocated_bytes.all.current"), 0);
  EXPECT_EQ(dict.at("allocated_bytes.all.peak"), 1024);
  EXPECT_EQ(dict.at("allocated_bytes.large_pool.peak"), 0);
  EXPECT_EQ(dict.at("allocated_bytes.all.allocated"),
            int64_t{1024 + 20 * kMiB});
  EXPECT_EQ(dict.at("allocated_bytes.all.freed"), int64_t{1024 + 20 * kMiB});
  EXPECT_EQ(dict.at("reserved_bytes.large_pool.current"), 0);
  EXPECT_EQ(dict.at("reserved_bytes.large_pool.peak"), int64_t{20 * kMiB});
  EXPECT_EQ(dict.at("reserved_bytes.all.peak"), int64_t{22 * kMiB});
  EXPECT_EQ(dict.at("requested_bytes.all.allocated"),
            int64_t{1000 + 20 * kMiB});
  EXPECT_EQ(dict.at("segment.all.peak"), 2);
  EXPECT_EQ(dict.at("segment.all.freed"), 2);
  EXPECT_EQ(dict.at("allocation.all.allocated"), 3);
  EXPECT_EQ(dict.at("allocation.all.freed"), 3);
  EXPECT_EQ(dict.at("active.small_pool.peak"), 1);
  EXPECT_EQ(dict.at("inactive_split.all.current"), 0);
  EXPECT_EQ(dict.at("num_device_alloc"), 2);
  EXPECT_EQ(dict.at("num_device_free"), 2);
  EXPECT_EQ(dict.at("num_sync_all_streams"), 1);
  EXPECT_EQ(dict.at("num_alloc_retries"), 0);
  EXPECT_EQ(dict.at("num_ooms"), 0);
  EXPECT_EQ(dict.at("max_split_size"), -1);

  // resetAccumulatedStats: totals and counters go, currents stay.
  allocator.ResetAccumulatedStats();
  EXPECT_EQ(s.allocated_bytes.all().allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(s.reserved_bytes.all().peak, int64_t{22 * kMiB});
}

// ===========================================================================
// snapshot()

// Pins: snapshot(): one entry per segment (head block: no mapped prev),
// sorted by address, with its blocks in address order, their sizes,
// requested sizes and states, the stream and the pool.
TEST(CachingAllocatorTest, SnapshotListsSegmentsByAddress) {
  RecordingBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  const Allocation a = MustMalloc(allocator, 12 * kMiB, /*stream=*/3);
  const Allocation s1 = MustMalloc(allocator, 512);
  const Allocation s2 = MustMalloc(allocator, 600);
  const Allocation b = MustMalloc(allocator, 2 * kMiB);
  ASSERT_TRUE(allocator.FreeDeferred(s2).ok());
  // The sim hands out descending addresses: b < s1 < a.
  ASSERT_LT(b.address, s1.address);
  ASSERT_LT(s1.address, a.address);

  const std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  ASSERT_EQ(snapshot.size(), 3u);
  using State = BlockInfo::State;

  const SegmentInfo& large = snapshot[0];
  EXPECT_EQ(large.address, b.address);
  EXPECT_EQ(large.total_size, 20 * kMiB);
  EXPECT_FALSE(large.is_small);
  EXPECT_FALSE(large.is_expandable);
  EXPECT_EQ(large.stream, 0);
  ASSERT_EQ(large.blocks.size(), 2u);
  EXPECT_EQ(large.blocks[0].address, b.address);
  EXPECT_EQ(large.blocks[0].size, 2 * kMiB);
  EXPECT_EQ(large.blocks[0].requested_size, 2 * kMiB);
  EXPECT_EQ(large.blocks[0].state, State::kAllocated);
  EXPECT_EQ(large.blocks[1].address, b.address + 2 * kMiB);
  EXPECT_EQ(large.blocks[1].size, 18 * kMiB);
  EXPECT_EQ(large.blocks[1].state, State::kInactive);

  const SegmentInfo& small = snapshot[1];
  EXPECT_EQ(small.address, s1.address);
  EXPECT_EQ(small.total_size, 2 * kMiB);
  EXPECT_TRUE(small.is_small);
  ASSERT_EQ(small.blocks.size(), 3u);
  EXPECT_EQ(small.blocks[0].size, 512u);
  EXPECT_EQ(small.blocks[0].requested_size, 512u);
  EXPECT_EQ(small.blocks[0].state, State::kAllocated);
  EXPECT_EQ(small.blocks[1].address, s1.address + 512);
  EXPECT_EQ(small.blocks[1].size, 1024u);
  EXPECT_EQ(small.blocks[1].requested_size, 600u);
  EXPECT_EQ(small.blocks[1].state, State::kFreePending);
  EXPECT_EQ(small.blocks[2].address, s1.address + 1536);
  EXPECT_EQ(small.blocks[2].size, 2 * kMiB - 1536);
  EXPECT_EQ(small.blocks[2].state, State::kInactive);

  const SegmentInfo& whole = snapshot[2];
  EXPECT_EQ(whole.address, a.address);
  EXPECT_EQ(whole.total_size, 12 * kMiB);
  EXPECT_EQ(whole.stream, 3);
  ASSERT_EQ(whole.blocks.size(), 1u);
  EXPECT_EQ(whole.blocks[0].state, State::kAllocated);
  EXPECT_EQ(whole.blocks[0].requested_size, 12 * kMiB);
  ExpectConsistent(allocator, backend);
}

// Pins: the allocator's segments go back to the device when it is destroyed
// (the process exit in PyTorch's case).
TEST(CachingAllocatorTest, DestructionReturnsEverything) {
  RecordingBackend backend(kGiB);
  {
    CachingAllocator allocator(AllocatorConfig{}, &backend);
    MustMalloc(allocator, 12 * kMiB);
    MustMalloc(allocator, 512);
    allocator.Reconfigure(Expandable());
    MustMalloc(allocator, 30 * kMiB);
    EXPECT_EQ(backend.used(), 12 * kMiB + 2 * kMiB + 40 * kMiB);
  }
  EXPECT_EQ(backend.used(), 0u);
  EXPECT_EQ(backend.CallsOf(Op::kRelease).size(), 1u);
}

// ---------------------------------------------------------------------------
// Adopt: the state a partial snapshot's first event found.

// Adopted segments behave as the allocator's own: the gaps are cached free
// blocks that best fit reuses, the blocks free and merge, stats count it
// all, and no device call was made for it.
TEST(CachingAllocatorAdoptTest, AdoptedSegmentsAreTheAllocatorsOwn) {
  SimBackend backend(1 * kGiB);
  const uint64_t base = uint64_t{0x7f0000000000};
  ASSERT_TRUE(backend.AdoptRange(base, 20 * kMiB).ok());
  ASSERT_TRUE(backend.AdoptRange(base + 20 * kMiB, kSmallBuffer).ok());
  CachingAllocator allocator({}, &backend);
  absl::StatusOr<std::vector<Allocation>> adopted = allocator.Adopt({
      {base, 20 * kMiB, 0, false,
       {{base + 4 * kMiB, 6 * kMiB, 6 * kMiB - 100, false},
        {base + 10 * kMiB, 4 * kMiB, 4 * kMiB, true}}},
      {base + 20 * kMiB, kSmallBuffer, 0, true, {{base + 20 * kMiB, 1024, 1000, false}}},
  });
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_EQ(adopted->size(), 3u);
  const DeviceStats& stats = allocator.Stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<int64_t>(22 * kMiB));
  EXPECT_EQ(stats.allocated_bytes.all().current, static_cast<int64_t>(6 * kMiB + 1024));
  EXPECT_EQ(stats.active_bytes.all().current, static_cast<int64_t>(10 * kMiB + 1024));
  EXPECT_EQ(stats.segment.all().current, 2);
  EXPECT_EQ(stats.inactive_split.all().current, 3);  // two large gaps, one small
  EXPECT_EQ(stats.num_device_alloc, 0);

  // 3 MiB fits the 4 MiB gap at the segment's start (best fit, not the
  // 6 MiB one at its end).
  absl::StatusOr<Allocation> a = allocator.Malloc(3 * kMiB, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->address, base);
  EXPECT_EQ(stats.num_device_alloc, 0);
  // The pending block returns at CompleteFree and merges with its neighbours.
  allocator.CompleteFree((*adopted)[1]);
  ASSERT_TRUE(allocator.Free((*adopted)[0]).ok());
  ASSERT_TRUE(allocator.Free(*a).ok());
  EXPECT_EQ(stats.allocated_bytes.all().current, 1024);
  EXPECT_EQ(stats.inactive_split.all().current, 1);  // the small segment's rest
  std::vector<SegmentInfo> segments = allocator.Snapshot();
  ASSERT_EQ(segments.size(), 2u);
  ASSERT_EQ(segments[0].blocks.size(), 1u);
  EXPECT_EQ(segments[0].blocks[0].size, 20 * kMiB);
  // And the empty segment goes back to the device on empty_cache.
  allocator.EmptyCache();
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(backend.used(), kSmallBuffer);
}

TEST(CachingAllocatorAdoptTest, InconsistentStatesAreRefused) {
  SimBackend backend(1 * kGiB);
  CachingAllocator allocator({}, &backend);
  const uint64_t base = uint64_t{0x7f0000000000};
  EXPECT_THAT(allocator.Adopt({{base, 20 * kMiB, 0, false, {{base + 19 * kMiB, 2 * kMiB, 1, false}}}})
                  .status()
                  .message(),
              HasSubstr("leaves the segment"));
  EXPECT_THAT(allocator.Adopt({{base, 4 * kMiB, 0, true, {}}}).status().message(),
              HasSubstr("2 MiB"));
  EXPECT_THAT(allocator.Adopt({{base, 20 * kMiB, 0, false, {}},
                               {base + 10 * kMiB, 20 * kMiB, 0, false, {}}})
                  .status()
                  .message(),
              HasSubstr("overlaps"));
  EXPECT_EQ(allocator.Stats().reserved_bytes.all().current, 0);
  ASSERT_TRUE(allocator.Malloc(1000, 0).ok());
  EXPECT_EQ(allocator.Adopt({}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace allocd
