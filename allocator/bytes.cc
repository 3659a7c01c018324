#include "allocator/bytes.h"

#include <array>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace allocd {

std::string FormatSize(uint64_t bytes) {
  if (bytes <= 1024) return absl::StrFormat("%d bytes", bytes);
  if (bytes <= (uint64_t{1} << 20)) {
    return absl::StrFormat("%.2f KiB", static_cast<double>(bytes) / 1024.0);
  }
  if (bytes <= (uint64_t{1} << 30)) {
    return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  }
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
}

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  static constexpr std::array<std::pair<absl::string_view, double>, 9> kUnits =
      {{{"kib", 1024.0},
        {"mib", 1048576.0},
        {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
        {"kb", 1e3},
        {"mb", 1e6},
        {"gb", 1e9},
        {"tb", 1e12},
        {"b", 1.0}}};
  // Debian's abseil has its own string_view type, distinct from std's.
  const std::string lower = absl::AsciiStrToLower(
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  absl::string_view number = lower;
  double scale = 1.0;
  for (const auto& [suffix, factor] : kUnits) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      scale = factor;
      break;
    }
  }
  number = absl::StripTrailingAsciiWhitespace(number);
  uint64_t integer = 0;
  if (scale == 1.0 && absl::SimpleAtoi(number, &integer)) return integer;
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) ||
      !std::isfinite(value) || value < 0 || number[0] == '-') {
    return absl::InvalidArgumentError(absl::StrFormat(
        "invalid size '%s': expected bytes or a number with a unit such as "
        "80GB, 79.1GiB, 512MiB",
        text));
  }
  const double bytes = std::round(value * scale);
  if (bytes >= 18446744073709551616.0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("size '%s' is too large", text));
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace allocd
