// DeviceStats and MemoryStatsDict, pinned to PyTorch's increase_stat /
// decrease_stat / reset_peak_stat / reset_accumulated_stat and
// DeviceCachingAllocator::resetPeakStats / resetAccumulatedStats
// (c10/cuda/CUDACachingAllocator.cpp), and to the dictionary that
// torch.cuda.memory_stats() builds (THCPModule_memoryStats in
// torch/csrc/cuda/Module.cpp, flattened with "." by torch/cuda/memory.py).
#include "allocator/stats.h"

#include <cstdint>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

// Pins: increase_stat (current, peak = max(current, peak), allocated) and
// decrease_stat (current, freed; the peak stays).
TEST(StatTest, IncreaseAndDecreaseTrackPeakAndTotals) {
  Stat stat;
  stat.Increase(10);
  stat.Increase(5);
  stat.Decrease(12);
  stat.Increase(4);
  EXPECT_EQ(stat.current, 7);
  EXPECT_EQ(stat.peak, 15);
  EXPECT_EQ(stat.allocated, 19);
  EXPECT_EQ(stat.freed, 12);
}

// Pins: reset_peak_stat (peak = current) and reset_accumulated_stat
// (allocated = freed = 0), neither touching current.
TEST(StatTest, Resets) {
  Stat stat;
  stat.Increase(10);
  stat.Decrease(7);
  stat.ResetPeak();
  EXPECT_EQ(stat.peak, 3);
  EXPECT_EQ(stat.current, 3);
  EXPECT_EQ(stat.allocated, 10);
  stat.ResetAccumulated();
  EXPECT_EQ(stat.allocated, 0);
  EXPECT_EQ(stat.freed, 0);
  EXPECT_EQ(stat.current, 3);
  EXPECT_EQ(stat.peak, 3);
}

// Pins: get_stat_types_for_pool: every update goes to AGGREGATE ("all") and
// to the block's pool.
TEST(StatArrayTest, UpdatesAllAndOnePool) {
  StatArray array;
  array.Increase(/*small=*/true, 100);
  array.Increase(/*small=*/false, 1000);
  array.Decrease(/*small=*/true, 40);
  EXPECT_EQ(array.all().current, 1060);
  EXPECT_EQ(array.all().peak, 1100);
  EXPECT_EQ(array.small_pool().current, 60);
  EXPECT_EQ(array.small_pool().peak, 100);
  EXPECT_EQ(array.large_pool().current, 1000);
  EXPECT_EQ(array.large_pool().freed, 0);
  EXPECT_EQ(array.small_pool().freed, 40);
}

// Pins: resetPeakStats covers every stat array and oversize_allocations /
// oversize_segments; resetAccumulatedStats also zeroes num_alloc_retries,
// num_ooms, num_sync_all_streams, num_device_alloc and num_device_free.
TEST(DeviceStatsTest, ResetPeaksAndAccumulated) {
  DeviceStats stats;
  for (StatArray* a :
       {&stats.allocation, &stats.segment, &stats.active,
        &stats.inactive_split, &stats.allocated_bytes, &stats.reserved_bytes,
        &stats.active_bytes, &stats.inactive_split_bytes,
        &stats.requested_bytes}) {
    a->Increase(false, 10);
    a->Decrease(false, 4);
  }
  stats.oversize_allocations.Increase(3);
  stats.oversize_allocations.Decrease(2);
  stats.oversize_segments.Increase(5);
  stats.oversize_segments.Decrease(5);
  stats.num_alloc_retries = 1;
  stats.num_ooms = 2;
  stats.num_sync_all_streams = 3;
  stats.num_device_alloc = 4;
  stats.num_device_free = 5;
  stats.max_split_size = 7;

  stats.ResetPeaks();
  for (const StatArray* a :
       {&stats.allocation, &stats.segment, &stats.active,
        &stats.inactive_split, &stats.allocated_bytes, &stats.reserved_bytes,
        &stats.active_bytes, &stats.inactive_split_bytes,
        &stats.requested_bytes}) {
    EXPECT_EQ(a->all().peak, 6);
    EXPECT_EQ(a->large_pool().peak, 6);
    EXPECT_EQ(a->all().allocated, 10);
  }
  EXPECT_EQ(stats.oversize_allocations.peak, 1);
  EXPECT_EQ(stats.oversize_segments.peak, 0);
  EXPECT_EQ(stats.num_ooms, 2);

  stats.ResetAccumulated();
  for (const StatArray* a :
       {&stats.allocation, &stats.segment, &stats.active,
        &stats.inactive_split, &stats.allocated_bytes, &stats.reserved_bytes,
        &stats.active_bytes, &stats.inactive_split_bytes,
        &stats.requested_bytes}) {
    EXPECT_EQ(a->all().allocated, 0);
    EXPECT_EQ(a->all().freed, 0);
    EXPECT_EQ(a->all().current, 6);
    EXPECT_EQ(a->all().peak, 6);
  }
  EXPECT_EQ(stats.oversize_allocations.allocated, 0);
  EXPECT_EQ(stats.oversize_segments.freed, 0);
  EXPECT_EQ(stats.num_alloc_retries, 0);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.num_sync_all_streams, 0);
  EXPECT_EQ(stats.num_device_alloc, 0);
  EXPECT_EQ(stats.num_device_free, 0);
  // Not a counter: resetAccumulatedStats leaves it.
  EXPECT_EQ(stats.max_split_size, 7);
}

// Pins: THCPModule_memoryStats + torch.cuda.memory_stats(): nine stat arrays
// x {all, small_pool, large_pool} x {current, peak, allocated, freed}, two
// plain stats x 4, and six scalars: 122 keys.
TEST(MemoryStatsDictTest, HasTorchKeyNames) {
  DeviceStats stats;
  stats.allocated_bytes.Increase(/*small=*/false, 3 << 20);
  stats.allocated_bytes.Decrease(/*small=*/false, 1 << 20);
  stats.reserved_bytes.Increase(/*small=*/true, 2 << 20);
  stats.oversize_segments.Increase(2);
  stats.num_device_alloc = 9;
  stats.num_device_free = 4;
  stats.num_alloc_retries = 1;
  stats.num_ooms = 1;
  stats.num_sync_all_streams = 2;
  stats.max_split_size = -1;

  const std::map<std::string, int64_t> dict = MemoryStatsDict(stats);
  EXPECT_EQ(dict.size(), 122u);
  EXPECT_EQ(dict.at("allocated_bytes.all.current"), 2 << 20);
  EXPECT_EQ(dict.at("allocated_bytes.all.peak"), 3 << 20);
  EXPECT_EQ(dict.at("allocated_bytes.large_pool.allocated"), 3 << 20);
  EXPECT_EQ(dict.at("allocated_bytes.large_pool.freed"), 1 << 20);
  EXPECT_EQ(dict.at("allocated_bytes.small_pool.current"), 0);
  EXPECT_EQ(dict.at("reserved_bytes.small_pool.current"), 2 << 20);
  EXPECT_EQ(dict.at("reserved_bytes.large_pool.current"), 0);
  EXPECT_EQ(dict.at("oversize_segments.current"), 2);
  EXPECT_EQ(dict.at("oversize_allocations.peak"), 0);
  EXPECT_EQ(dict.at("num_device_alloc"), 9);
  EXPECT_EQ(dict.at("num_device_free"), 4);
  EXPECT_EQ(dict.at("num_alloc_retries"), 1);
  EXPECT_EQ(dict.at("num_ooms"), 1);
  EXPECT_EQ(dict.at("num_sync_all_streams"), 2);
  EXPECT_EQ(dict.at("max_split_size"), -1);

  for (const char* array :
       {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
        "reserved_bytes", "active_bytes", "inactive_split_bytes",
        "requested_bytes"}) {
    for (const char* pool : {"all", "small_pool", "large_pool"}) {
      for (const char* field : {"current", "peak", "allocated", "freed"}) {
        const std::string key =
            std::string(array) + "." + pool + "." + field;
        EXPECT_TRUE(dict.contains(key)) << key;
      }
    }
  }
  for (const char* stat : {"oversize_allocations", "oversize_segments"}) {
    for (const char* field : {"current", "peak", "allocated", "freed"}) {
      EXPECT_TRUE(dict.contains(std::string(stat) + "." + field));
    }
  }
  // Plain stats have no pool level.
  EXPECT_FALSE(dict.contains("oversize_segments.all.current"));
  EXPECT_FALSE(dict.contains("num_ooms.all"));
}

}  // namespace
}  // namespace allocd
