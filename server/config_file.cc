#include "server/config_file.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "nlohmann/json.hpp"
#include "server/config_store.h"

namespace allocd {
namespace {

absl::StatusOr<std::string> ValidConfig(const nlohmann::json& value,
                                        absl::string_view where) {
  if (!value.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a config is a string"));
  }
  const std::string text = value.get<std::string>();
  if (absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(text);
      !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": PyTorch 2.11 rejects \"", text, "\": ",
        parsed.status().message()));
  }
  return text;
}

}  // namespace

absl::StatusOr<NodeConfigFile> ParseNodeConfigFile(
    absl::string_view text, std::optional<uint64_t> pool_capacity) {
  const SizeContext quota_sizes{
      .percent_of = pool_capacity,
      .no_percent_reason = "the node pool's capacity is not known here"};
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("config file is not a JSON object");
  }
  NodeConfigFile out;
  for (const auto& [key, value] : doc.items()) {
    if (key == "default") {
      absl::StatusOr<std::string> config = ValidConfig(value, "default");
      if (!config.ok()) return config.status();
      out.default_config = *config;
    } else if (key == "jobs") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError("jobs: an object of job -> config");
      }
      for (const auto& [job, config_value] : value.items()) {
        const std::string where = absl::StrCat("jobs.", job);
        if (absl::Status s = ValidateJobLabel(job); !s.ok() || job.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", s.ok() ? "empty job label" : s.message()));
        }
        absl::StatusOr<std::string> config = ValidConfig(config_value, where);
        if (!config.ok()) return config.status();
        out.job_configs[job] = *config;
      }
    } else if (key == "uid_quotas") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError("uid_quotas: an object of uid -> size");
      }
      for (const auto& [uid_text, size_value] : value.items()) {
        const std::string where = absl::StrCat("uid_quotas.", uid_text);
        uint32_t uid = 0;
        if (!absl::SimpleAtoi(uid_text, &uid)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": not a numeric uid"));
        }
        if (size_value.is_number()) {
          // A number has no unit: say which the person probably meant.
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", ParseSize(size_value.dump()).status().message(),
              "; sizes are strings, e.g. \"20GiB\""));
        }
        if (!size_value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a size string like \"20GiB\""));
        }
        absl::StatusOr<uint64_t> bytes =
            ParseSize(size_value.get<std::string>(), quota_sizes);
        if (!bytes.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": ", bytes.status().message()));
        }
        out.uid_quotas[uid] = *bytes;
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key \"", key, "\" (known: default, jobs, uid_quotas)"));
    }
  }
  return out;
}

}  // namespace allocd
