#include "allocator/sim_backend.h"

#include <algorithm>
#include <limits>

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
      lowest_address_(kTopAddress) {}

absl::Status SimBackend::Claim(size_t bytes) {
  if (bytes > capacity_ - used_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "device out of memory: %d bytes requested, %d of %d free", bytes,
        capacity_ - used_, capacity_));
  }
  used_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimBackend::TakeAddressBelow(size_t bytes) {
  const uint64_t room = lowest_address_ - kBottomAddress;
  // Rounded up to the alignment without overflowing.
  const uint64_t aligned =
      bytes > room ? room + 1 : (bytes + kPageAlignment - 1) & ~(kPageAlignment - 1);
  if (aligned > room) {
    // Not a lack of memory (an OOM) but a device no GPU has: an error.
    return absl::OutOfRangeError(absl::StrFormat(
        "device address space exhausted: %d bytes requested, %d left below "
        "0x%x",
        bytes, room, lowest_address_));
  }
  lowest_address_ -= aligned;
  return lowest_address_;
}

absl::Status SimBackend::AdoptRange(uint64_t address, size_t bytes) {
  if (address < kBottomAddress ||
      bytes > std::numeric_limits<uint64_t>::max() - address) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "adopted range 0x%x (%d bytes) is outside the device address space",
        address, bytes));
  }
  if (absl::Status s = Claim(bytes); !s.ok()) return s;
  lowest_address_ = std::min(lowest_address_, address & ~(kPageAlignment - 1));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimBackend::AllocateSegment(size_t bytes) {
  if (absl::Status s = Claim(bytes); !s.ok()) return s;
  absl::StatusOr<uint64_t> address = TakeAddressBelow(bytes);
  if (!address.ok()) used_ -= bytes;
  return address;
}

void SimBackend::FreeSegment(uint64_t /*address*/, size_t bytes) {
  used_ -= bytes;
}

absl::StatusOr<uint64_t> SimBackend::ReserveAddressRange(size_t bytes) {
  return TakeAddressBelow(bytes);
}

void SimBackend::ReleaseAddressRange(uint64_t /*address*/, size_t /*bytes*/) {}

absl::Status SimBackend::MapPages(uint64_t /*address*/, size_t bytes) {
  return Claim(bytes);
}

void SimBackend::UnmapPages(uint64_t /*address*/, size_t bytes) {
  used_ -= bytes;
}

}  // namespace allocd
