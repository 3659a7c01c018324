// The daemon's config file (`allocd serve --config FILE`; in Kubernetes a
// mounted ConfigMap): allocator configs per job and quotas, as JSON:
//
//   {
//     "default": "expandable_segments:True",
//     "jobs": {"llama-lora": "max_split_size_mb:256,garbage_collection_threshold:0.6"},
//     "uid_quotas": {"1000": "20GiB", "1001": "25%"}
//   }
//
// Every entry is validated (configs as PyTorch 2.11 would, sizes as
// allocd's SIZE: a unit is required, "N%" is of the node pool's capacity);
// an error names the entry.
#ifndef ALLOCD_SERVER_CONFIG_FILE_H_
#define ALLOCD_SERVER_CONFIG_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace allocd {

struct NodeConfigFile {
  std::optional<std::string> default_config;
  std::map<std::string, std::string> job_configs;
  std::map<uid_t, uint64_t> uid_quotas;
};

// `pool_capacity`: what a quota of "N%" is a percentage of (nullopt: such
// a quota is an error).
absl::StatusOr<NodeConfigFile> ParseNodeConfigFile(
    absl::string_view text, std::optional<uint64_t> pool_capacity = std::nullopt);

}  // namespace allocd

#endif  // ALLOCD_SERVER_CONFIG_FILE_H_
