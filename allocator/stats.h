// Allocator statistics with the meaning and names of
// torch.cuda.memory_stats().
#ifndef ALLOCD_ALLOCATOR_STATS_H_
#define ALLOCD_ALLOCATOR_STATS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace allocd {

// One counter: its value now, its high-water mark, and the running totals of
// increases and decreases (PyTorch's "allocated" and "freed").
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Increase(int64_t amount) {
    current += amount;
    peak = std::max(peak, current);
    allocated += amount;
  }
  void Decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void ResetPeak() { peak = current; }
  void ResetAccumulated() { allocated = freed = 0; }
};

// PyTorch's StatType: every pool-level stat is kept for both pools together
// and for each pool.
enum class StatPool : int { kAll = 0, kSmall = 1, kLarge = 2 };
inline constexpr int kNumStatPools = 3;

// The stat for all pools and for one pool, updated together.
struct StatArray {
  std::array<Stat, kNumStatPools> by_pool;

  const Stat& all() const { return by_pool[0]; }
  const Stat& small_pool() const { return by_pool[1]; }
  const Stat& large_pool() const { return by_pool[2]; }

  void Increase(bool small, int64_t amount) {
    by_pool[0].Increase(amount);
    by_pool[small ? 1 : 2].Increase(amount);
  }
  void Decrease(bool small, int64_t amount) {
    by_pool[0].Decrease(amount);
    by_pool[small ? 1 : 2].Decrease(amount);
  }
};

struct DeviceStats {
  StatArray allocation;            // blocks handed to the program
  StatArray segment;               // segments from the device
  StatArray active;                // blocks allocated or awaiting stream uses
  StatArray inactive_split;        // free blocks inside split segments
  StatArray allocated_bytes;       // bytes of allocated blocks (rounded)
  StatArray reserved_bytes;        // bytes of segments / mapped pages
  StatArray active_bytes;          // bytes of active blocks
  StatArray inactive_split_bytes;  // bytes of inactive_split blocks
  StatArray requested_bytes;       // bytes the program asked for
  int64_t num_alloc_retries = 0;   // mallocs that needed a full cache flush
  int64_t num_ooms = 0;            // mallocs that failed
  Stat oversize_allocations;       // allocated blocks >= max_split_size
  Stat oversize_segments;          // segments >= max_split_size
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;    // cudaMalloc calls and page mappings
  int64_t num_device_free = 0;     // cudaFree calls and page unmappings
  int64_t max_split_size = 0;      // PyTorch reports SIZE_MAX as -1

  void ResetPeaks();
  void ResetAccumulated();
};

// The stats as torch.cuda.memory_stats() returns them:
// "allocated_bytes.all.peak", "num_device_alloc", ...
std::map<std::string, int64_t> MemoryStatsDict(const DeviceStats& stats);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_STATS_H_
