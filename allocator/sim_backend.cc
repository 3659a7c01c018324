#include "allocator/sim_backend.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>

#include "absl/strings/str_format.h"

namespace allocd {
namespace {

// Where the driver started handing out addresses in the reference traces
// (0x7fe8...); any high canonical user-space address works.
constexpr uint64_t kTopAddress = uint64_t{0x7fe900000000};
// cudaMalloc aligns segments to 2 MiB pages.
constexpr uint64_t kPageAlignment = uint64_t{2} << 20;
// No range goes below this (the driver keeps low addresses for the host).
constexpr uint64_t kBottomAddress = uint64_t{1} << 32;

}  // namespace

SimBackend::SimBackend(size_t capacity, size_t total_memory)
    : capacity_(capacity),
      total_memory_(total_memory != 0 ? total_memory
                    : capacity == std::numeric_limits<size_t>::max()
                        ? kUnlimitedTotalMemory
                        : capacity),
      lowest_address_(kTopAddress),
      gap_ceiling_(kTopAddress) {}

absl::Status SimBackend::Claim(size_t bytes) {
  if (bytes > capacity_ - used_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "device out of memory: %d bytes requested, %d of %d free", bytes,
        capacity_ - used_, capacity_));
  }
  used_ += bytes;
  return absl::OkStatus();
}

std::optional<uint64_t> SimBackend::TakeGapBelow(uint64_t* ceiling,
                                                 uint64_t floor,
                                                 uint64_t aligned) const {
  uint64_t top = *ceiling;
  while (top >= floor && top - floor >= aligned) {
    const uint64_t start = top - aligned;
    // The highest adopted range that starts below `top`: the range taken
    // must end at or below its start if it overlaps it.
    auto above = adopted_.lower_bound(top);
    if (above == adopted_.begin() || std::prev(above)->second <= start) {
      *ceiling = start;
      return start;
    }
    top = std::prev(above)->first;
  }
  return std::nullopt;
}

absl::StatusOr<uint64_t> SimBackend::TakeAddress(size_t bytes) {
  const uint64_t room = lowest_address_ - kBottomAddress;
  // Rounded up to the alignment without overflowing.
  const uint64_t aligned =
      bytes > kTopAddress ? kTopAddress + 1
                          : (bytes + kPageAlignment - 1) & ~(kPageAlignment - 1);
  if (aligned <= room) {
    lowest_address_ -= aligned;
    return lowest_address_;
  }
  uint64_t ceiling = gap_ceiling_;
  if (std::optional<uint64_t> gap = TakeGapBelow(&ceiling, lowest_address_, aligned)) {
    gap_ceiling_ = ceiling;
    return *gap;
  }
  // Not a lack of memory (an OOM) but a device no GPU has: an error.
  return absl::OutOfRangeError(absl::StrFormat(
      "device address space exhausted: %d bytes requested, %d left below "
      "0x%x and no gap that large between the adopted ranges",
      bytes, room, lowest_address_));
}

absl::Status SimBackend::AdoptRange(uint64_t address, size_t bytes) {
  if (address < kBottomAddress ||
      bytes > std::numeric_limits<uint64_t>::max() - address) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "adopted range 0x%x (%d bytes) is outside the device address space",
        address, bytes));
  }
  if (absl::Status s = Claim(bytes); !s.ok()) return s;
  const uint64_t start = address & ~(kPageAlignment - 1);
  const uint64_t end =
      std::min(kTopAddress, (address + bytes + kPageAlignment - 1) &
                                ~(kPageAlignment - 1));
  lowest_address_ = std::min(lowest_address_, start);
  if (end > start) {
    uint64_t& adopted_end = adopted_[start];
    adopted_end = std::max(adopted_end, end);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimBackend::AllocateSegment(size_t bytes) {
  if (absl::Status s = Claim(bytes); !s.ok()) return s;
  absl::StatusOr<uint64_t> address = TakeAddress(bytes);
  if (!address.ok()) used_ -= bytes;
  return address;
}

void SimBackend::FreeSegment(uint64_t /*address*/, size_t bytes) {
  used_ -= bytes;
}

absl::StatusOr<uint64_t> SimBackend::ReserveAddressRange(size_t bytes) {
  return TakeAddress(bytes);
}

void SimBackend::ReleaseAddressRange(uint64_t /*address*/, size_t /*bytes*/) {}

absl::Status SimBackend::MapPages(uint64_t /*address*/, size_t bytes) {
  return Claim(bytes);
}

void SimBackend::UnmapPages(uint64_t /*address*/, size_t bytes) {
  used_ -= bytes;
}

}  // namespace allocd
