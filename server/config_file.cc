#include "server/config_file.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "allocator/config_check.h"
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
        ConfigRejection(text, parsed.status())));
  }
  return text;
}

absl::StatusOr<AutotuneMode> ValidMode(const nlohmann::json& value,
                                       absl::string_view where) {
  absl::StatusOr<AutotuneMode> mode =
      value.is_string() ? ParseAutotuneMode(value.get<std::string>())
                        : absl::InvalidArgumentError("not a string");
  if (!mode.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a mode is \"off\", \"recommend\" or \"apply\"; got ",
        value.dump()));
  }
  return mode;
}

absl::StatusOr<AutotuneFilePolicy> ValidJobPolicy(const nlohmann::json& value,
                                                  absl::string_view where) {
  AutotuneFilePolicy policy;
  if (value.is_string()) {
    absl::StatusOr<AutotuneMode> mode = ValidMode(value, where);
    if (!mode.ok()) return mode.status();
    policy.mode = *mode;
    return policy;
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a mode, or {\"mode\": ..., \"pinned_keys\": [...], "
               "\"allow_memory_fraction\": bool}"));
  }
  for (const auto& [key, v] : value.items()) {
    const std::string at = absl::StrCat(where, ".", key);
    if (key == "mode") {
      absl::StatusOr<AutotuneMode> mode = ValidMode(v, at);
      if (!mode.ok()) return mode.status();
      policy.mode = *mode;
    } else if (key == "pinned_keys" && v.is_array()) {
      for (const nlohmann::json& k : v) {
        if (!k.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ": config keys are strings"));
        }
        policy.pinned_keys.push_back(k.get<std::string>());
      }
    } else if (key == "allow_memory_fraction" && v.is_boolean()) {
      policy.allow_memory_fraction = v.get<bool>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": unknown or mistyped (known: mode, pinned_keys [strings], "
              "allow_memory_fraction [bool])"));
    }
  }
  return policy;
}

absl::Status ParseAutotuneSection(const nlohmann::json& value,
                                  NodeConfigFile& out) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        "autotune: an object {\"mode\": ..., \"jobs\": {...}}");
  }
  for (const auto& [key, v] : value.items()) {
    if (key == "mode") {
      absl::StatusOr<AutotuneMode> mode = ValidMode(v, "autotune.mode");
      if (!mode.ok()) return mode.status();
      out.autotune_mode = *mode;
    } else if (key == "jobs" && v.is_object()) {
      for (const auto& [job, entry] : v.items()) {
        const std::string where = absl::StrCat("autotune.jobs.", job);
        if (absl::Status s = ValidateJobLabel(job); !s.ok() || job.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", s.ok() ? "empty job label" : s.message()));
        }
        absl::StatusOr<AutotuneFilePolicy> policy = ValidJobPolicy(entry, where);
        if (!policy.ok()) return policy.status();
        out.autotune_jobs[job] = *std::move(policy);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "autotune.", key, ": unknown or mistyped (known: mode, jobs {})"));
    }
  }
  return absl::OkStatus();
}

// A quota's size at `where` (a size string; "N%" of `quota_sizes`).
absl::StatusOr<uint64_t> QuotaSize(const nlohmann::json& value,
                                   absl::string_view where,
                                   const SizeContext& quota_sizes) {
  if (value.is_number()) {
    // A number has no unit: say which the person probably meant.
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", ParseSize(value.dump()).status().message(),
        "; sizes are strings, e.g. \"20GiB\""));
  }
  if (!value.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a size string like \"20GiB\""));
  }
  absl::StatusOr<uint64_t> bytes =
      ParseSize(value.get<std::string>(), quota_sizes);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", bytes.status().message()));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<NodeConfigFile> ParseNodeConfigFile(
    absl::string_view text, std::optional<uint64_t> pool_capacity,
    std::optional<Tenancy> tenancy) {
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
        if (absl::Status s = ValidateConfigKey(job); !s.ok() || job.empty()) {
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
        absl::StatusOr<uint64_t> bytes =
            QuotaSize(size_value, where, quota_sizes);
        if (!bytes.ok()) return bytes.status();
        out.uid_quotas[uid] = *bytes;
      }
    } else if (key == "tenant_quotas") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            "tenant_quotas: an object of tenant -> size");
      }
      for (const auto& [tenant, size_value] : value.items()) {
        const std::string where = absl::StrCat("tenant_quotas.", tenant);
        if (tenant.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": empty tenant; name one as allocctl sessions shows "
                     "it, e.g. \"uid:1001\" or \"pod:<pod UID>\""));
        }
        if (tenancy.has_value()) {
          if (absl::Status valid = ValidateTenant(*tenancy, tenant);
              !valid.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ": ", valid.message()));
          }
        }
        absl::StatusOr<uint64_t> bytes =
            QuotaSize(size_value, where, quota_sizes);
        if (!bytes.ok()) return bytes.status();
        out.tenant_quotas[tenant] = *bytes;
      }
    } else if (key == "autotune") {
      if (absl::Status s = ParseAutotuneSection(value, out); !s.ok()) return s;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key \"", key,
          "\" (known: default, jobs, uid_quotas, tenant_quotas, autotune)"));
    }
  }
  return out;
}

}  // namespace allocd
