// CheckAllocatorConfig: what PyTorch 2.11 makes of a PYTORCH_CUDA_ALLOC_CONF,
// in words: accepted or not (with PyTorch's error), what each key does,
// what to watch out for, and for near misses a fix that PyTorch accepts.
// `allocd check-config` prints it.
#ifndef ALLOCD_ALLOCATOR_CONFIG_CHECK_H_
#define ALLOCD_ALLOCATOR_CONFIG_CHECK_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "allocator/config.h"

namespace allocd {

// One key of an accepted config.
struct ConfigKeyExplanation {
  std::string key;          // PyTorch's name, e.g. "max_split_size_mb"
  std::string value;        // the value PyTorch ends up with, canonical
  std::string explanation;  // what it does, in plain words
};

struct ConfigCheck {
  bool accepted = false;
  // Why it was rejected: PyTorch's error, or, where that is an internal
  // assert of PyTorch's tokenizer (a '=' for ':', keys separated by
  // spaces, a key without a value), the syntax in words.
  std::string error;
  // PyTorch's own error (ParseAllocatorConfig's message) when rejected.
  std::string pytorch_error;
  // The parsed config when accepted.
  std::optional<AllocatorConfig> config;
  // One line per key that the string sets (or names at its default), in
  // canonical order; empty when rejected.
  std::vector<ConfigKeyExplanation> keys;
  // Things that are legal but probably not what was meant.
  std::vector<std::string> warnings;
  // For a rejected string: each change we made to get fixed_config, e.g.
  // "roundup_power2 -> roundup_power2_divisions (...)".
  std::vector<std::string> suggestions;
  // A corrected string that PyTorch accepts (canonical form), when the
  // suggestions lead to one.
  std::optional<std::string> fixed_config;
};

// Never fails: a rejected string is a result, not an error.
ConfigCheck CheckAllocatorConfig(std::string_view conf);

// Why PyTorch 2.11 rejects `conf`, for a user: `rejected` (what
// ParseAllocatorConfig said of it), except where that is an internal
// assert of PyTorch's tokenizer ("... INTERNAL ASSERT FAILED ... please
// report a bug to PyTorch"), which says nothing to a user: then the syntax
// in words, naming the item at fault. ConfigCheck::error is this.
std::string ConfigRejection(std::string_view conf, const absl::Status& rejected);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_CONFIG_CHECK_H_
