#include "server/autotune/autotune_types.h"

#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace allocd {

absl::StatusOr<AutotuneMode> ParseAutotuneMode(absl::string_view name) {
  for (const NamedValue<AutotuneMode>& row : kAutotuneModes) {
    if (name == row.name) return row.value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown autotune mode \"", name, "\": use off, recommend or apply"));
}

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string ConfigName(const std::string& config) {
  return config.empty() ? "(defaults)" : config;
}

std::ostream& operator<<(std::ostream& out, AutotuneTrigger trigger) {
  return out << AutotuneTriggerName(trigger);
}
std::ostream& operator<<(std::ostream& out, AutotuneResult result) {
  return out << AutotuneResultName(result);
}
std::ostream& operator<<(std::ostream& out, AutotuneJobState state) {
  return out << AutotuneJobStateName(state);
}

}  // namespace allocd
