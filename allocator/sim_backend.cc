#include "allocator/sim_backend.h"

#include "absl/strings/str_format.h"

namespace allocd {
namespace {

// Where the driver started handing out addresses in the reference traces
// (0x7fe8...); any high canonical user-space address works.
constexpr uint64_t kTopAddress = uint64_t{0x7fe900000000};
// cudaMalloc aligns segments to 2 MiB pages.
constexpr uint64_t kPageAlignment = uint64_t{2} << 20;

}  // namespace

SimBackend::SimBackend(size_t capacity, size_t total_memory)
    : capacity_(capacity),
      total_memory_(total_memory == 0 ? capacity : total_memory),
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

uint64_t SimBackend::TakeAddressBelow(size_t bytes) {
  const uint64_t aligned = (bytes + kPageAlignment - 1) & ~(kPageAlignment - 1);
  lowest_address_ -= aligned;
  return lowest_address_;
}

absl::StatusOr<uint64_t> SimBackend::AllocateSegment(size_t bytes) {
  if (absl::Status s = Claim(bytes); !s.ok()) return s;
  return TakeAddressBelow(bytes);
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
