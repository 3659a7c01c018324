// Fuzzes the PYTORCH_CUDA_ALLOC_CONF parser, formatter and checker.
// Properties, on any bytes:
// - nothing crashes (ASan/UBSan watch);
// - whatever parses formats to a string that parses back to the same config
//   and formats to the same string again;
// - a runtime update never changes the backend, and the update string of a
//   config brings any state of that backend to exactly that config;
// - the checker agrees with the parser, and its fix, when it has one, parses.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "allocator/config.h"
#include "allocator/config_check.h"

namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

void CheckRoundTrip(const allocd::AllocatorConfig& config) {
  const std::string text = allocd::FormatAllocatorConfig(config);
  absl::StatusOr<allocd::AllocatorConfig> again =
      allocd::ParseAllocatorConfig(text);
  Require(again.ok() && *again == config);
  Require(allocd::FormatAllocatorConfig(*again) == text);
}

void CheckUpdate(std::string_view conf, const allocd::AllocatorConfig& start) {
  const allocd::AllocatorConfigUpdate update =
      allocd::ApplyAllocatorConfigUpdate(conf, start);
  Require(update.config.backend == start.backend);
  if (start.pinned_reserve_segment_size_mb !=
      update.config.pinned_reserve_segment_size_mb) {
    return;  // 0 cannot be written back (PyTorch wants > 0)
  }
  absl::StatusOr<allocd::AllocatorConfig> back =
      allocd::ParseAllocatorConfigUpdate(
          allocd::FormatAllocatorConfigUpdate(start), update.config);
  Require(back.ok() && *back == start);
}

void CheckChecker(std::string_view conf, bool parses) {
  const allocd::ConfigCheck check = allocd::CheckAllocatorConfig(conf);
  Require(check.accepted == parses);
  if (check.fixed_config) {
    Require(allocd::ParseAllocatorConfig(*check.fixed_config).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view conf(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<allocd::AllocatorConfig> config =
      allocd::ParseAllocatorConfig(conf);
  if (config.ok()) {
    CheckRoundTrip(*config);
    CheckUpdate(conf, *config);
  }
  CheckUpdate(conf, allocd::AllocatorConfig{});
  CheckChecker(conf, config.ok());
  return 0;
}
