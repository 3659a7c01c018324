// AllocatorConfig: PYTORCH_CUDA_ALLOC_CONF as PyTorch 2.11 understands it.
//
// ParseAllocatorConfig accepts exactly the strings PyTorch 2.11 accepts
// (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp) and
// rejects the rest with an InvalidArgument status whose message contains
// PyTorch's own wording. FormatAllocatorConfig gives the canonical string:
// PyTorch accepts it and it parses back to an equal config.
#ifndef ALLOCD_ALLOCATOR_CONFIG_H_
#define ALLOCD_ALLOCATOR_CONFIG_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace allocd {

inline constexpr size_t kMiB = size_t{1} << 20;

// One roundup_power2_divisions entry per power-of-two interval starting at
// 1 MiB: interval i covers sizes in [2^(20+i), 2^(21+i)), the last one also
// everything above.
inline constexpr int kRoundupPower2Intervals = 16;

enum class AllocatorBackend { kNative, kCudaMallocAsync };

struct AllocatorConfig {
  // Blocks of this size or more are never split ("oversize"); SIZE_MAX
  // means unset, PyTorch's default.
  size_t max_split_size = std::numeric_limits<size_t>::max();
  // A request >= max_split_size may take a cached block at most this much
  // larger than itself.
  size_t max_non_split_rounding = 20 * kMiB;
  // 0 = off. Acts only under a per-process memory fraction.
  double garbage_collection_threshold = 0.0;
  // Divisions per interval; 0 or 1 = plain 512-byte rounding.
  std::array<size_t, kRoundupPower2Intervals> roundup_power2_divisions{};
  bool expandable_segments = false;
  AllocatorBackend backend = AllocatorBackend::kNative;

  // Keys that PyTorch accepts but that do not change device memory. They are
  // kept so that Format(Parse(s)) loses nothing a user wrote.
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  size_t pinned_num_register_threads = 1;
  bool pinned_use_background_threads = false;
  bool graph_capture_record_stream_reuse = false;

  bool operator==(const AllocatorConfig&) const = default;
};

// Parses a PYTORCH_CUDA_ALLOC_CONF string. An empty string is the default
// config.
absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(std::string_view conf);

// Canonical string for `config`: keys in a fixed order, only keys that differ
// from the defaults; "" for the default config.
std::string FormatAllocatorConfig(const AllocatorConfig& config);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_CONFIG_H_
