#include "tuner/search_space.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "allocator/absl_string_view.h"

namespace allocd {
namespace {

RoundupDivisions Uniform(size_t divisions) {
  RoundupDivisions d;
  d.fill(divisions);
  return d;
}

// The 16 intervals of a list-form setting, as PyTorch parses it.
RoundupDivisions ListForm(const char* list) {
  return ParseAllocatorConfig(absl::StrCat("roundup_power2_divisions:", list))
      ->roundup_power2_divisions;
}

// Splits on commas that are not inside brackets.
std::vector<std::string> SplitDimensions(absl::string_view spec) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : spec) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

absl::Status SpecError(absl::string_view dimension, absl::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat("--space ", dimension, ": ", detail));
}

// Numbers for a dimension: "a|b|c" or "lo..hi" (powers of two between, and
// the ends).
absl::StatusOr<std::vector<double>> ParseNumbers(absl::string_view key,
                                                 absl::string_view values) {
  std::vector<double> out;
  if (std::vector<absl::string_view> range = absl::StrSplit(values, "..");
      range.size() == 2) {
    double lo = 0;
    double hi = 0;
    if (!absl::SimpleAtod(range[0], &lo) || !absl::SimpleAtod(range[1], &hi) ||
        lo <= 0 || hi < lo) {
      return SpecError(key, absl::StrCat("bad range '", values, "'"));
    }
    out.push_back(lo);
    for (double p = std::exp2(std::ceil(std::log2(lo))); p < hi; p *= 2) {
      if (p > lo) out.push_back(p);
    }
    if (hi > lo) out.push_back(hi);
    return out;
  }
  for (absl::string_view v : absl::StrSplit(values, '|')) {
    double x = 0;
    if (!absl::SimpleAtod(v, &x)) {
      return SpecError(key, absl::StrCat("'", v, "' is not a number"));
    }
    out.push_back(x);
  }
  return out;
}

// Checks a value with PyTorch's own parser, so that the space never holds a
// config PyTorch would reject.
absl::Status CheckWithPyTorchRules(absl::string_view key,
                                   absl::string_view value) {
  absl::StatusOr<AllocatorConfig> parsed =
      ParseAllocatorConfig(absl::StrCat(key, ":", value));
  if (!parsed.ok()) return SpecError(key, parsed.status().message());
  return absl::OkStatus();
}

absl::Status ApplyDimension(SearchSpace& space, absl::string_view key,
                            absl::string_view values) {
  if (key == "roundup_power2_divisions" || key == "expandable_segments") {
    if (key == "roundup_power2_divisions") space.roundup_power2_divisions.clear();
    if (key == "expandable_segments") space.expandable_segments.clear();
    int depth = 0;
    std::string current;
    std::vector<std::string> items;
    for (char c : values) {
      if (c == '[') ++depth;
      if (c == ']') --depth;
      if (c == '|' && depth == 0) {
        items.push_back(current);
        current.clear();
      } else {
        current += c;
      }
    }
    items.push_back(current);
    for (const std::string& item : items) {
      if (key == "roundup_power2_divisions" && item == "unset") {
        space.roundup_power2_divisions.push_back(Uniform(0));
        continue;
      }
      if (absl::Status s = CheckWithPyTorchRules(key, item); !s.ok()) return s;
      const AllocatorConfig c =
          *ParseAllocatorConfig(absl::StrCat(key, ":", item));
      if (key == "expandable_segments") {
        space.expandable_segments.push_back(c.expandable_segments);
      } else {
        space.roundup_power2_divisions.push_back(c.roundup_power2_divisions);
      }
    }
    return absl::OkStatus();
  }
  if (key == "max_split_size_mb") {
    space.max_split_size_mb.clear();
    std::string numbers;
    for (absl::string_view v : absl::StrSplit(values, '|')) {
      if (v == "unset") {
        space.max_split_size_mb.push_back(std::nullopt);
      } else {
        absl::StrAppend(&numbers, numbers.empty() ? "" : "|", v);
      }
    }
    if (numbers.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<double>> parsed = ParseNumbers(key, numbers);
    if (!parsed.ok()) return parsed.status();
    for (double mb : *parsed) {
      const auto value = static_cast<size_t>(mb);
      if (absl::Status s = CheckWithPyTorchRules(key, std::to_string(value)); !s.ok()) {
        return s;
      }
      space.max_split_size_mb.push_back(value);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> parsed = ParseNumbers(key, values);
  if (!parsed.ok()) return parsed.status();
  if (key == "max_non_split_rounding_mb") {
    space.max_non_split_rounding_mb.clear();
    for (double mb : *parsed) {
      const auto value = static_cast<size_t>(mb);
      if (absl::Status s = CheckWithPyTorchRules(key, std::to_string(value)); !s.ok()) {
        return s;
      }
      space.max_non_split_rounding_mb.push_back(value);
    }
    return absl::OkStatus();
  }
  if (key == "garbage_collection_threshold" || key == "gc_headroom") {
    std::vector<double> thresholds;
    std::vector<double> headrooms;
    for (const GcSetting& g : space.garbage_collection) {
      if (g.threshold == 0) continue;
      if (std::find(thresholds.begin(), thresholds.end(), g.threshold) == thresholds.end()) {
        thresholds.push_back(g.threshold);
      }
      if (std::find(headrooms.begin(), headrooms.end(), g.headroom) == headrooms.end()) {
        headrooms.push_back(g.headroom);
      }
    }
    if (key == "garbage_collection_threshold") {
      thresholds.clear();
      for (double t : *parsed) {
        if (absl::Status s = CheckWithPyTorchRules(key, absl::StrFormat("%g", t)); !s.ok()) {
          return s;
        }
        thresholds.push_back(t);
      }
    } else {
      headrooms.clear();
      for (double h : *parsed) {
        if (h <= 0) return SpecError(key, "headroom must be > 0");
        headrooms.push_back(h);
      }
    }
    space.garbage_collection = {GcSetting{}};
    for (double t : thresholds) {
      for (double h : headrooms) space.garbage_collection.push_back({t, h});
    }
    return absl::OkStatus();
  }
  return SpecError(key,
                   "unknown dimension; use max_split_size_mb, "
                   "max_non_split_rounding_mb, roundup_power2_divisions, "
                   "expandable_segments, garbage_collection_threshold or "
                   "gc_headroom");
}

}  // namespace

SearchSpace DefaultSearchSpace() {
  SearchSpace space;
  space.max_split_size_mb = {std::nullopt, 20,  32,  48,   64,   96,  128,
                             192,          256, 384, 512, 1024, 2048, 4096};
  space.max_non_split_rounding_mb = {20, 64, 256, 1024};
  space.roundup_power2_divisions = {
      Uniform(0),  Uniform(2),  Uniform(4), Uniform(8), Uniform(16),
      ListForm("[256:1,512:2,1024:4,>:8]"), ListForm("[64:8,>:4]"),
      ListForm("[1:4,64:8,>:16]")};
  space.expandable_segments = {false, true};
  space.garbage_collection = {GcSetting{}};
  for (double threshold : {0.5, 0.6, 0.7, 0.8, 0.9}) {
    for (double headroom : {0.25, 0.5, 1.0}) {
      space.garbage_collection.push_back({threshold, headroom});
    }
  }
  return space;
}

size_t SearchSpace::GridSize() const {
  return max_split_size_mb.size() * max_non_split_rounding_mb.size() *
         roundup_power2_divisions.size() * expandable_segments.size() *
         garbage_collection.size();
}

absl::StatusOr<SearchSpace> ApplySpaceSpec(SearchSpace space,
                                           std::string_view spec) {
  for (const std::string& part :
       SplitDimensions(ToAbsl(spec))) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--space: '", part, "' is not KEY=VALUES (e.g. max_split_size_mb=64..1024)"));
    }
    if (absl::Status s = ApplyDimension(space, absl::StripAsciiWhitespace(kv[0]),
                                        absl::StripAsciiWhitespace(kv[1]));
        !s.ok()) {
      return s;
    }
  }
  for (int d = 0; d < kSpaceDimensions; ++d) {
    if (DimensionSize(space, d) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--space leaves ", DimensionName(d), " with no values"));
    }
  }
  return space;
}

size_t& PointIndex(SpacePoint& point, int dimension) {
  switch (dimension) {
    case 0: return point.max_split;
    case 1: return point.rounding;
    case 2: return point.roundup;
    case 3: return point.expandable;
    default: return point.gc;
  }
}

size_t DimensionSize(const SearchSpace& space, int dimension) {
  switch (dimension) {
    case 0: return space.max_split_size_mb.size();
    case 1: return space.max_non_split_rounding_mb.size();
    case 2: return space.roundup_power2_divisions.size();
    case 3: return space.expandable_segments.size();
    default: return space.garbage_collection.size();
  }
}

const char* DimensionName(int dimension) {
  static constexpr const char* kNames[kSpaceDimensions] = {
      "max_split_size_mb", "max_non_split_rounding_mb",
      "roundup_power2_divisions", "expandable_segments",
      "garbage_collection_threshold"};
  return kNames[dimension];
}

Candidate MakeCandidate(const SearchSpace& space, const SpacePoint& point,
                        int64_t peak_allocated, uint64_t total_memory) {
  Candidate c{space.base, std::nullopt};
  c.config.max_split_size = std::numeric_limits<size_t>::max();
  c.config.max_non_split_rounding = c.config.large_segment_size;
  if (const std::optional<size_t> mb = space.max_split_size_mb[point.max_split]) {
    c.config.max_split_size = *mb * kMiB;
    // Rounding only matters for blocks at or above max_split_size.
    c.config.max_non_split_rounding =
        space.max_non_split_rounding_mb[point.rounding] * kMiB;
  }
  c.config.roundup_power2_divisions = space.roundup_power2_divisions[point.roundup];
  c.config.expandable_segments = space.expandable_segments[point.expandable];
  const GcSetting& gc = space.garbage_collection[point.gc];
  if (gc.threshold > 0 && total_memory > 0) {
    c.config.garbage_collection_threshold = gc.threshold;
    // Rounded up to a value a person can paste: three decimals.
    const double exact = (1.0 + gc.headroom) * static_cast<double>(peak_allocated) /
                         static_cast<double>(total_memory);
    c.memory_fraction = std::min(1.0, std::ceil(exact * 1000.0) / 1000.0);
  }
  return c;
}

std::string RoundupLabel(const RoundupDivisions& divisions) {
  AllocatorConfig c;
  c.roundup_power2_divisions = divisions;
  std::string s = FormatAllocatorConfig(c);
  absl::string_view view = s;
  if (!absl::ConsumePrefix(&view, "roundup_power2_divisions:")) return "unset";
  return std::string(view);
}

}  // namespace allocd
