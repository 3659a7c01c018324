// The daemon's config file (`allocd serve --config FILE`; in Kubernetes a
// mounted ConfigMap): allocator configs per job and quotas, as JSON:
//
//   {
//     "default": "expandable_segments:True",
//     "jobs": {"llama-lora": "max_split_size_mb:256,garbage_collection_threshold:0.6"},
//     "uid_quotas": {"1000": "20GiB", "1001": "25%"},
//     "tenant_quotas": {"pod:0f6c1b2a-...": "40GiB", "uid:1002": "25%"},
//     "autotune": {
//       "mode": "recommend",
//       "jobs": {"llama-lora": "apply",
//                "bert": {"mode": "apply", "pinned_keys": ["expandable_segments"],
//                         "allow_memory_fraction": true}}
//     }
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
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "server/autotune/autotuner.h"
#include "server/tenant.h"

namespace allocd {

// A job's entry in the "autotune" section: a mode ("apply"), or an object
// with any of mode, pinned_keys, allow_memory_fraction.
struct AutotuneFilePolicy {
  std::optional<AutotuneMode> mode;
  std::vector<std::string> pinned_keys;
  bool allow_memory_fraction = false;

  bool operator==(const AutotuneFilePolicy&) const = default;
};

struct NodeConfigFile {
  std::optional<std::string> default_config;
  std::map<std::string, std::string> job_configs;
  std::map<uid_t, uint64_t> uid_quotas;
  // By TenantId ("uid:1001", "pod:<pod UID>", "node"): what the tenant's
  // sessions on one GPU may hold together.
  std::map<std::string, uint64_t> tenant_quotas;
  // The autotuner's default mode (over `allocd serve --autotune`) and
  // per-job policies.
  std::optional<AutotuneMode> autotune_mode;
  std::map<std::string, AutotuneFilePolicy> autotune_jobs;
};

// `pool_capacity`: what a quota of "N%" is a percentage of (nullopt: such
// a quota is an error). `tenancy`: the daemon's, whose tenants alone
// tenant_quotas may name (ValidateTenant: a quota for a tenant no peer can
// have would bind nobody); nullopt: any non-empty name.
absl::StatusOr<NodeConfigFile> ParseNodeConfigFile(
    absl::string_view text, std::optional<uint64_t> pool_capacity = std::nullopt,
    std::optional<Tenancy> tenancy = std::nullopt);

}  // namespace allocd

#endif  // ALLOCD_SERVER_CONFIG_FILE_H_
