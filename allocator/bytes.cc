#include "allocator/bytes.h"

#include <array>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "allocator/absl_string_view.h"

namespace allocd {
namespace {

constexpr char kUnitsHint[] =
    "write a number with a unit: 80GB, 79.1GiB, 80G or 80Gi (as Kubernetes "
    "does), 512MiB, or 84465090560B for bytes";

absl::Status Malformed(std::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrFormat("'%s' is not a size: %s", text, kUnitsHint));
}

// "did you mean 80GB?": people who write a small number mean gigabytes,
// a program that printed a large one meant bytes.
absl::Status NoUnit(std::string_view text, absl::string_view number,
                    double value) {
  const std::string guess = value >= 1e6 ? absl::StrCat(number, "B")
                                         : absl::StrCat(number, "GB");
  return absl::InvalidArgumentError(absl::StrFormat(
      "'%s' has no unit: did you mean %s? (%s)", text, guess, kUnitsHint));
}

}  // namespace

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

absl::StatusOr<uint64_t> ParseSize(std::string_view text,
                                   const SizeContext& context) {
  // Longer suffixes first: "gib" before "gi", "gb" and "b".
  static constexpr std::array<std::pair<absl::string_view, double>, 17>
      kUnits = {{{"kib", 1024.0},
                 {"mib", 1048576.0},
                 {"gib", 1073741824.0},
                 {"tib", 1099511627776.0},
                 {"ki", 1024.0},
                 {"mi", 1048576.0},
                 {"gi", 1073741824.0},
                 {"ti", 1099511627776.0},
                 {"kb", 1e3},
                 {"mb", 1e6},
                 {"gb", 1e9},
                 {"tb", 1e12},
                 {"k", 1e3},
                 {"m", 1e6},
                 {"g", 1e9},
                 {"t", 1e12},
                 {"b", 1.0}}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(ToAbsl(text)));
  absl::string_view number = lower;
  std::optional<double> scale;
  const bool percent = absl::ConsumeSuffix(&number, "%");
  if (!percent) {
    for (const auto& [suffix, factor] : kUnits) {
      if (absl::ConsumeSuffix(&number, suffix)) {
        scale = factor;
        break;
      }
    }
  }
  number = absl::StripTrailingAsciiWhitespace(number);
  double value = 0;
  if (number.empty() || number[0] == '-' || number[0] == '+' ||
      !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return Malformed(text);
  }
  if (percent) {
    if (!context.percent_of) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' is a percentage, but %s: give a size such as 80GB or 79.1GiB",
          text, context.no_percent_reason));
    }
    if (!(value > 0 && value <= 100)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s': a percentage is more than 0%% and at most 100%%", text));
    }
    return static_cast<uint64_t>(
        std::round(value / 100.0 * static_cast<double>(*context.percent_of)));
  }
  if (!scale) {
    if (!context.bare_number_is_bytes) return NoUnit(text, number, value);
    scale = 1.0;
  }
  // Whole byte counts stay exact past 2^53, where a double would round.
  uint64_t integer = 0;
  if (*scale == 1.0 && absl::SimpleAtoi(number, &integer)) return integer;
  const double bytes = std::round(value * *scale);
  if (bytes >= 18446744073709551616.0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is too large: sizes go up to 2^64 bytes", text));
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace allocd
