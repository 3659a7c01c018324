// RecordedAddressBackend: a SimBackend whose new segments land where the
// recorded run's CUDA driver put them (the snapshot's segment_alloc events).
//
// PyTorch breaks best-fit ties between equal-size free blocks by address, so
// a replay can match a real run exactly only at that run's addresses. A
// segment request of S bytes takes the next recorded address of a segment of
// S bytes, in recording order; when none is left (or the size is filtered
// out) it gets the simulator's address. Capacity and the memory fraction's
// base stay the simulator's.
#ifndef ALLOCD_TESTS_TRACE_RECORDED_ADDRESS_BACKEND_H_
#define ALLOCD_TESTS_TRACE_RECORDED_ADDRESS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "allocator/device_backend.h"
#include "allocator/sim_backend.h"
#include "allocator/trace/trace.h"

namespace allocd {

class RecordedAddressBackend : public DeviceBackend {
 public:
  // `only_size`: recorded addresses go only to segments of this many bytes
  // (0: every size).
  RecordedAddressBackend(const Trace& trace, size_t capacity, size_t total_memory,
                         size_t only_size = 0)
      : sim_(capacity, total_memory), only_size_(only_size) {
    for (const RecordedSegment& segment : trace.recorded_segments) {
      if (only_size == 0 || segment.size == only_size) {
        addresses_[segment.size].push_back(segment.address);
      }
    }
  }

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override {
    absl::StatusOr<uint64_t> address = sim_.AllocateSegment(bytes);
    if (!address.ok()) return address;
    auto it = addresses_.find(bytes);
    if (it == addresses_.end() || it->second.empty()) {
      if (only_size_ == 0 || bytes == only_size_) ++unmatched_;
      return address;
    }
    const uint64_t recorded = it->second.front();
    it->second.pop_front();
    return recorded;
  }
  void FreeSegment(uint64_t address, size_t bytes) override { sim_.FreeSegment(address, bytes); }
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override {
    return sim_.ReserveAddressRange(bytes);
  }
  void ReleaseAddressRange(uint64_t address, size_t bytes) override {
    sim_.ReleaseAddressRange(address, bytes);
  }
  absl::Status MapPages(uint64_t address, size_t bytes) override {
    return sim_.MapPages(address, bytes);
  }
  void UnmapPages(uint64_t address, size_t bytes) override { sim_.UnmapPages(address, bytes); }
  size_t TotalMemory() const override { return sim_.TotalMemory(); }
  size_t FreeMemory() const override { return sim_.FreeMemory(); }

  // Segment requests of the chosen size that got a simulated address: none
  // when the replay asked for no segment the recorded run did not make.
  size_t unmatched() const { return unmatched_; }

 private:
  SimBackend sim_;
  size_t only_size_;
  std::map<size_t, std::deque<uint64_t>> addresses_;
  size_t unmatched_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_TESTS_TRACE_RECORDED_ADDRESS_BACKEND_H_
