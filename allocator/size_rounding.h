// PyTorch's size classes: how a request becomes a block size and, when no
// cached block fits, a segment size (CUDACachingAllocator.cpp round_size,
// roundup_power2_next_division, get_allocation_size).
#ifndef ALLOCD_ALLOCATOR_SIZE_ROUNDING_H_
#define ALLOCD_ALLOCATOR_SIZE_ROUNDING_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "allocator/config.h"

namespace allocd {

inline constexpr size_t kMinBlockSize = 512;         // every size rounds to it
inline constexpr size_t kSmallSize = 1 << 20;        // largest small request
inline constexpr size_t kSmallBuffer = 2 << 20;      // small-pool segment
inline constexpr size_t kMinLargeAlloc = 10 << 20;   // below: one large segment
inline constexpr size_t kLargeBuffer = 20 << 20;     // its default size
inline constexpr size_t kRoundLarge = 2 << 20;       // larger segments round to

// The roundup_power2_divisions entry that applies to `size`: intervals start
// at 1 MiB (everything smaller uses the first) and the last one covers
// everything from 32 GiB up.
inline size_t RoundupDivisionsFor(size_t size, const AllocatorConfig& config) {
  const int log_size = std::bit_width(static_cast<uint64_t>(size)) - 1;
  int index = log_size - 20;
  if (index < 0) index = 0;
  if (index >= kRoundupPower2Intervals) index = kRoundupPower2Intervals - 1;
  return config.roundup_power2_divisions[index];
}

// Rounds `size` up to the next of `divisions` equal steps between the powers
// of two around it; a power of two stays; a step below 1 byte means the next
// power of two. `divisions` is a power of two >= 2.
inline size_t RoundupPower2NextDivision(size_t size, size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const size_t power2_floor = std::bit_floor(size);
  const size_t step = power2_floor >> (std::bit_width(divisions) - 1);
  if (step == 0) return power2_floor << 1;
  const size_t floor = size & ~(step - 1);
  return floor == size ? size : floor + step;
}

// The block size PyTorch hands out for a request of `size` bytes.
inline size_t RoundSize(size_t size, const AllocatorConfig& config) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const size_t divisions = RoundupDivisionsFor(size, config);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return RoundupPower2NextDivision(size, divisions);
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

// Rounded sizes up to 1 MiB live in the small pool.
inline bool IsSmallSize(size_t rounded_size) {
  return rounded_size <= kSmallSize;
}

// The segment PyTorch cudaMallocs when no cached block fits `rounded_size`.
// `large_segment_size` is AllocatorConfig::large_segment_size
// (large_segment_size_mb, kLargeBuffer before PyTorch 2.11).
inline size_t SegmentSizeFor(size_t rounded_size,
                             size_t large_segment_size = kLargeBuffer) {
  if (rounded_size <= kSmallSize) return kSmallBuffer;
  if (rounded_size < kMinLargeAlloc) return large_segment_size;
  return kRoundLarge * ((rounded_size + kRoundLarge - 1) / kRoundLarge);
}

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_SIZE_ROUNDING_H_
