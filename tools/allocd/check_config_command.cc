#include "tools/allocd/check_config_command.h"

#include <ostream>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/config_check.h"
#include "nlohmann/json.hpp"

namespace allocd {
namespace {

nlohmann::json ToJson(const ConfigCheck& check) {
  nlohmann::json keys = nlohmann::json::array();
  for (const ConfigKeyExplanation& key : check.keys) {
    keys.push_back({{"key", key.key},
                    {"value", key.value},
                    {"explanation", key.explanation}});
  }
  nlohmann::json j = {
      {"accepted", check.accepted},
      {"error",
       check.accepted ? nlohmann::json(nullptr) : nlohmann::json(check.error)},
      {"pytorch_error", check.accepted ? nlohmann::json(nullptr)
                                       : nlohmann::json(check.pytorch_error)},
      {"keys", keys},
      {"warnings", check.warnings},
      {"suggestions", check.suggestions},
      {"fixed_config", check.fixed_config ? nlohmann::json(*check.fixed_config)
                                          : nlohmann::json(nullptr)},
      {"canonical", check.config
                        ? nlohmann::json(FormatAllocatorConfig(*check.config))
                        : nlohmann::json(nullptr)},
  };
  return j;
}

void PrintList(const char* title, const std::vector<std::string>& lines,
               std::ostream& out) {
  if (lines.empty()) return;
  out << title << ":\n";
  for (const std::string& line : lines) out << "  - " << line << "\n";
}

void PrintAccepted(const ConfigCheck& check, std::ostream& out) {
  out << "accepted by PyTorch 2.11\n";
  for (const ConfigKeyExplanation& key : check.keys) {
    out << "  " << key.key << ":" << key.value << " — " << key.explanation
        << "\n";
  }
  if (check.keys.empty()) out << "  (PyTorch's defaults)\n";
  PrintList("warnings", check.warnings, out);
  out << "canonical: " << FormatAllocatorConfig(*check.config) << "\n";
}

void PrintRejected(const ConfigCheck& check, std::ostream& out) {
  out << "rejected by PyTorch 2.11: " << check.error << "\n";
  PrintList("suggestions", check.suggestions, out);
  if (check.fixed_config) {
    out << "fixed config (PyTorch accepts it): " << *check.fixed_config << "\n";
  }
}

}  // namespace

int RunCheckConfig(std::string_view conf, bool json, std::ostream& out) {
  const ConfigCheck check = CheckAllocatorConfig(conf);
  if (json) {
    out << ToJson(check).dump(2) << "\n";
  } else if (check.accepted) {
    PrintAccepted(check, out);
  } else {
    PrintRejected(check, out);
  }
  return check.accepted ? 0 : 1;
}

}  // namespace allocd
