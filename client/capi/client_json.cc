#include "client/capi/client_json.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace allocd {

absl::StatusOr<v1::AutotunePreferences> ParseAutotunePreferences(
    absl::string_view json) {
  v1::AutotunePreferences out;
  if (json.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "autotune preferences must be a JSON object: {\"pinned_keys\": "
        "[...], \"allow_memory_fraction\": bool, \"mode\": \"off|recommend|"
        "apply\", \"marks_steps\": bool}");
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "pinned_keys" && value.is_array()) {
      for (const nlohmann::json& k : value) {
        if (!k.is_string()) {
          return absl::InvalidArgumentError(
              "autotune pinned_keys must be strings, e.g. "
              "[\"expandable_segments\"]");
        }
        out.add_pinned_keys(k.get<std::string>());
      }
    } else if (key == "allow_memory_fraction" && value.is_boolean()) {
      out.set_allow_memory_fraction(value.get<bool>());
    } else if (key == "marks_steps" && value.is_boolean()) {
      out.set_marks_steps(value.get<bool>());
    } else if (key == "mode" && value.is_string() &&
               (value == "" || value == "off" || value == "recommend" ||
                value == "apply")) {
      out.set_mode(value.get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "autotune preference \"", key, "\" = ", value.dump(),
          " is not one of pinned_keys (list of config keys), "
          "allow_memory_fraction (bool), mode (off, recommend, apply), "
          "marks_steps (bool)"));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, int64_t>> ParseStatsJson(
    absl::string_view json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "stats must be a JSON object of names to integers");
  }
  std::map<std::string, int64_t> stats;
  for (const auto& [key, value] : j.items()) {
    if (value.is_number_integer()) stats[key] = value.get<int64_t>();
  }
  return stats;
}

}  // namespace allocd
