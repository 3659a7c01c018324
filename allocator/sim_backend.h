// SimBackend: a DeviceBackend with a memory capacity and no GPU.
//
// Allocation fails when the memory in use would pass `capacity`, as
// cudaMalloc fails when the device's free memory runs out. Addresses follow
// the CUDA driver's habit seen on H100s: each new segment lands below every
// earlier one. PyTorch breaks best-fit ties between equal-size free blocks by
// address, so this order decides which block a replay reuses.
//
// Every address stays below 2^47 (and so below 2^53, where PyTorch's
// JavaScript memory viewer loses precision): a range that would not fit in
// the address space left is OutOfRange (a device no GPU has, not an OOM).
#ifndef ALLOCD_ALLOCATOR_SIM_BACKEND_H_
#define ALLOCD_ALLOCATOR_SIM_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

#include "allocator/device_backend.h"

namespace allocd {

class SimBackend : public DeviceBackend {
 public:
  // `capacity`: the device memory the process may use (cudaMemGetInfo's free
  // at start); SIZE_MAX: unlimited. `total_memory`: the device's total;
  // defaults to `capacity`, or to kUnlimitedTotalMemory for an unlimited
  // device (the total sizes expandable segments' reservations, 9/8 of it
  // each, which must fit in the address space).
  explicit SimBackend(size_t capacity, size_t total_memory = 0);

  static constexpr size_t kUnlimitedTotalMemory = size_t{1} << 40;  // 1 TiB

  // Takes over a segment or mapped range the process held before the
  // allocator's first call (CachingAllocator::Adopt): its memory counts as
  // used, and new ranges land below it -- or, once the room below the
  // lowest one is spent (ranges a process mapped itself low in the address
  // space, as allocd's interposer does), in the gaps above it, never on an
  // adopted range. ResourceExhausted when the capacity left is smaller;
  // InvalidArgument for a range outside the address space.
  absl::Status AdoptRange(uint64_t address, size_t bytes);

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override;
  void FreeSegment(uint64_t address, size_t bytes) override;
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override;
  void ReleaseAddressRange(uint64_t address, size_t bytes) override;
  absl::Status MapPages(uint64_t address, size_t bytes) override;
  void UnmapPages(uint64_t address, size_t bytes) override;
  size_t TotalMemory() const override { return total_memory_; }
  size_t FreeMemory() const override { return capacity_ - used_; }

  size_t capacity() const { return capacity_; }
  // Physical memory in use now (segments plus mapped pages).
  size_t used() const { return used_; }

 private:
  absl::Status Claim(size_t bytes);
  absl::StatusOr<uint64_t> TakeAddress(size_t bytes);
  // The highest `aligned` bytes free between `floor` and `*ceiling` that
  // overlap no adopted range; lowers `*ceiling` to it. nullopt: none.
  std::optional<uint64_t> TakeGapBelow(uint64_t* ceiling, uint64_t floor,
                                       uint64_t aligned) const;

  size_t capacity_;
  size_t total_memory_;
  size_t used_ = 0;
  // New ranges are placed below this address (below every adopted range)...
  uint64_t lowest_address_;
  // ...and, once no room is left there, in the gaps between the adopted
  // ranges, from the top down to lowest_address_.
  uint64_t gap_ceiling_;
  // Adopted ranges, page-aligned: start -> end.
  std::map<uint64_t, uint64_t> adopted_;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_SIM_BACKEND_H_
