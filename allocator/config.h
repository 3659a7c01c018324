// AllocatorConfig: PYTORCH_CUDA_ALLOC_CONF as PyTorch 2.11 understands it.
//
// ParseAllocatorConfig accepts exactly the strings PyTorch 2.11 accepts
// (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp,
// the backend scan in c10/cuda/CUDACachingAllocator.cpp) and rejects the rest
// with an InvalidArgument status whose message is PyTorch's own. The
// behaviour was checked against a real PyTorch 2.11.0+cu130 on an H100:
// tests/allocator/pytorch_oracle_cases.inc holds what it did.
// FormatAllocatorConfig gives the canonical string: PyTorch accepts it and it
// parses back to an equal config.
#ifndef ALLOCD_ALLOCATOR_CONFIG_H_
#define ALLOCD_ALLOCATOR_CONFIG_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace allocd {

inline constexpr size_t kMiB = size_t{1} << 20;

// One roundup_power2_divisions entry per power-of-two interval starting at
// 1 MiB: interval i covers sizes in [2^(20+i), 2^(21+i)), the first one also
// everything below 2 MiB, the last one also everything above.
inline constexpr int kRoundupPower2Intervals = 16;

enum class AllocatorBackend { kNative, kCudaMallocAsync };

struct AllocatorConfig {
  // Blocks of this size or more are never split ("oversize"); SIZE_MAX
  // means unset, PyTorch's default. A whole number of MiB otherwise, at
  // least large_segment_size.
  size_t max_split_size = std::numeric_limits<size_t>::max();
  // A request >= max_split_size may take a cached block at most this much
  // larger than itself. Defaults to large_segment_size.
  size_t max_non_split_rounding = 20 * kMiB;
  // 0 = off. Acts only under a per-process memory fraction.
  double garbage_collection_threshold = 0.0;
  // Divisions per interval; 0 or 1 = plain 512-byte rounding. Each entry is
  // 0 or a power of two.
  std::array<size_t, kRoundupPower2Intervals> roundup_power2_divisions{};
  bool expandable_segments = false;
  // Fixed when the process loads libc10_cuda; a runtime update cannot change
  // it.
  AllocatorBackend backend = AllocatorBackend::kNative;
  // large_segment_size_mb (new in 2.11): the segment size for requests
  // between 1 MiB and 10 MiB (kLargeBuffer before 2.11) and the page size of
  // expandable large-pool segments (seen on 2.11: with 64, a 5 MiB tensor
  // reserves 64 MiB, with or without expandable_segments); also the least
  // max_split_size_mb and max_non_split_rounding_mb. More than 10 MiB.
  size_t large_segment_size = 20 * kMiB;
  // per_process_memory_fraction: caps reserved memory at this fraction of
  // the device, as torch.cuda.set_per_process_memory_fraction does; 1 = no
  // cap. PyTorch applies it only when a device's allocator is created.
  double per_process_memory_fraction = 1.0;

  // Keys that PyTorch accepts but that do not change device memory. They are
  // kept so that Format(Parse(s)) loses nothing a user wrote.
  bool release_lock_on_cudamalloc = false;
  bool pinned_use_cuda_host_register = false;
  size_t pinned_num_register_threads = 1;
  bool pinned_use_background_threads = false;
  bool graph_capture_record_stream_reuse = false;
  // 0 = no reserved pinned segment.
  size_t pinned_reserve_segment_size_mb = 0;

  bool operator==(const AllocatorConfig&) const = default;
};

// Parses a PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) string the way a
// process that starts with it does. An empty string is the default config.
//
// A process parses the string three times: a scan for `backend` when
// libc10_cuda loads, then the CUDA-specific keys and then the generic ones
// (both when CUDA initialises; the generic pass first, at load time, under
// backend:cudaMallocAsync). The error is the first one PyTorch meets in that
// order. One difference: under backend:cudaMallocAsync PyTorch defers the
// CUDA-specific pass until something reads that config (pinned memory, a
// runtime update), so a bad CUDA-specific key fails there rather than at
// start; we reject it at once.
absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(std::string_view conf);

// What a live process holds after
// torch.cuda.memory._set_allocator_settings(conf), starting from `current`.
//
// The rule (AcceleratorAllocatorConfig::parseArgs, then
// CUDAAllocatorConfig::parseArgs):
// - max_split_size, roundup_power2_divisions and
//   garbage_collection_threshold go back to their defaults on every update,
//   then take what `conf` names;
// - max_non_split_rounding goes back to large_segment_size (the current one,
//   or the one `conf` names) on every update;
// - every other field keeps its current value unless `conf` names it:
//   expandable_segments, large_segment_size, per_process_memory_fraction and
//   the pinned/lock/graph keys persist across updates;
// - `backend` may be named only with the current backend's name.
// A runtime update of per_process_memory_fraction changes the stored value
// but not the cap of allocators that already exist.
//
// Unknown keys are reported as "... in Accelerator allocator config." here
// (the generic pass runs first at runtime), and as "... in CUDA allocator
// config." by ParseAllocatorConfig.
absl::StatusOr<AllocatorConfig> ParseAllocatorConfigUpdate(
    std::string_view conf, const AllocatorConfig& current);

// A runtime update in full: PyTorch does not roll back a failed update, so
// when `status` is not OK, `config` holds what the process has afterwards:
// the resets above plus every key before the one that failed (and none of
// the CUDA-specific keys when the generic pass failed).
struct AllocatorConfigUpdate {
  absl::Status status;
  AllocatorConfig config;
};
AllocatorConfigUpdate ApplyAllocatorConfigUpdate(
    std::string_view conf, const AllocatorConfig& current);

// Canonical string for `config`: keys in a fixed order, only keys that differ
// from the defaults; "" for the default config. For every config c that
// ParseAllocatorConfig returns, ParseAllocatorConfig(Format(c)) == c.
// roundup_power2_divisions is written as one number when all intervals are
// equal, else as the shortest bracket list we find that reproduces all 16.
std::string FormatAllocatorConfig(const AllocatorConfig& config);

// FormatAllocatorConfig of what `conf` parses to, so that two configs that
// act alike compare equal ("max_split_size_mb:64" and
// " max_split_size_mb:64,expandable_segments:False"); nullopt where PyTorch
// 2.11 rejects `conf`.
std::optional<std::string> CanonicalAllocatorConfig(std::string_view conf);

// A string that, pushed with _set_allocator_settings to a process with the
// same backend, leaves it with exactly `config` whatever it held before: the
// canonical string plus every persistent key (see ParseAllocatorConfigUpdate)
// written out even at its default, since leaving one out keeps the old value.
// It names no backend.
std::string FormatAllocatorConfigUpdate(const AllocatorConfig& config);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_CONFIG_H_
