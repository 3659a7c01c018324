// The pattern the GPU tests write into daemon chunks and check in another
// process: chunk k of a segment starts with k (8 bytes), the rest of its
// first half is a function of (k, offset) written with cuMemcpyHtoD, its
// second half is kFill written with one cuMemsetD8 over the whole segment.
// A reader that gets the chunks back in any order can tell which is which.
#ifndef ALLOCD_TESTS_GPU_GPU_PATTERN_H_
#define ALLOCD_TESTS_GPU_GPU_PATTERN_H_

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_driver.h"

namespace allocd::gpu_test {

constexpr uint8_t kFill = 0x5A;

inline uint8_t PatternByte(uint64_t chunk, size_t offset) {
  return static_cast<uint8_t>(((offset * 2654435761u) >> 11) ^
                              (chunk * 37 + 11));
}

// memset of the whole segment (one call across every chunk), then the
// first half of each chunk from the host.
inline absl::Status WriteSegment(uint64_t address, size_t bytes,
                                 size_t chunk_bytes) {
  if (absl::Status s = cuda::MemsetD8(address, kFill, bytes); !s.ok()) {
    return s;
  }
  std::vector<uint8_t> half(chunk_bytes / 2);
  for (uint64_t k = 0; k < bytes / chunk_bytes; ++k) {
    for (size_t i = 0; i < half.size(); ++i) half[i] = PatternByte(k, i);
    std::memcpy(half.data(), &k, sizeof k);
    if (absl::Status s =
            cuda::MemcpyHtoD(address + k * chunk_bytes, half.data(), half.size());
        !s.ok()) {
      return s;
    }
  }
  return cuda::Synchronize();
}

// Reads the segment back (one copy across every chunk) and checks each
// chunk; `found` gets the chunk numbers seen. "" when all is well, else what
// differs first.
inline std::string CheckSegment(uint64_t address, size_t bytes,
                                size_t chunk_bytes,
                                std::set<uint64_t>* found) {
  std::vector<uint8_t> host(bytes);
  if (absl::Status s = cuda::MemcpyDtoH(host.data(), address, bytes);
      !s.ok()) {
    return std::string(s.message());
  }
  for (size_t c = 0; c < bytes / chunk_bytes; ++c) {
    const uint8_t* chunk = host.data() + c * chunk_bytes;
    uint64_t k = 0;
    std::memcpy(&k, chunk, sizeof k);
    if (k >= bytes / chunk_bytes || !found->insert(k).second) {
      return absl::StrCat("chunk ", c, " holds chunk number ", k);
    }
    for (size_t i = sizeof k; i < chunk_bytes; ++i) {
      const uint8_t want = i < chunk_bytes / 2 ? PatternByte(k, i) : kFill;
      if (chunk[i] != want) {
        return absl::StrCat("chunk ", c, " (written as ", k, ") byte ", i,
                            ": ", int{chunk[i]}, " instead of ", int{want});
      }
    }
  }
  return "";
}

}  // namespace allocd::gpu_test

#endif  // ALLOCD_TESTS_GPU_GPU_PATTERN_H_
