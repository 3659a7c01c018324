#include "allocator/config_check.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "allocator/absl_string_view.h"
#include "allocator/config.h"

namespace allocd {
namespace {

// ---------------------------------------------------------------------------
// The keys PyTorch 2.11 knows, in FormatAllocatorConfig's order.

enum class Kind {
  kMegabytes,  // a whole number of MiB with a floor
  kThreshold,  // (0, 1)
  kFraction,   // [0, 1]
  kRoundup,
  kBool,
  kBackend,
  kThreads,   // power of two <= 128
  kPositive,  // > 0
};

struct KeyInfo {
  absl::string_view name;
  Kind kind;
  // Pinned host memory, locking and graph capture leave device memory alone.
  bool device_memory;
};

constexpr KeyInfo kKeys[] = {
    {"backend", Kind::kBackend, true},
    {"large_segment_size_mb", Kind::kMegabytes, true},
    {"max_split_size_mb", Kind::kMegabytes, true},
    {"max_non_split_rounding_mb", Kind::kMegabytes, true},
    {"roundup_power2_divisions", Kind::kRoundup, true},
    {"garbage_collection_threshold", Kind::kThreshold, true},
    {"expandable_segments", Kind::kBool, true},
    {"per_process_memory_fraction", Kind::kFraction, true},
    {"release_lock_on_cudamalloc", Kind::kBool, false},
    {"pinned_use_cuda_host_register", Kind::kBool, false},
    {"pinned_num_register_threads", Kind::kThreads, false},
    {"pinned_reserve_segment_size_mb", Kind::kPositive, false},
    {"pinned_use_background_threads", Kind::kBool, false},
    {"graph_capture_record_stream_reuse", Kind::kBool, false},
};

// ROCm spellings that CUDA builds accept too.
absl::string_view CanonicalKey(absl::string_view key) {
  if (key == "release_lock_on_hipmalloc") return "release_lock_on_cudamalloc";
  if (key == "pinned_use_hip_host_register") {
    return "pinned_use_cuda_host_register";
  }
  return key;
}

const KeyInfo* FindKey(absl::string_view key) {
  key = CanonicalKey(key);
  for (const KeyInfo& info : kKeys) {
    if (info.name == key) return &info;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// A plain reading of the string, "key:value" items at top-level commas, for
// explanations and fixes. PyTorch's own reading is ParseAllocatorConfig's.

struct Item {
  std::string key;
  std::string value;
  bool has_colon = false;
};

// With `spaces_separate`, whitespace after a complete "key:value" ends the
// item as a ',' would: what a person who wrote "a:1 b:2" meant (PyTorch
// drops the spaces and reads "a:1b:2").
std::vector<Item> SplitItems(absl::string_view conf,
                             bool spaces_separate = false) {
  std::vector<Item> items;
  std::string current;
  int depth = 0;
  auto flush = [&]() {
    if (current.empty()) return;
    Item item;
    const size_t colon = current.find(':');
    item.key = current.substr(0, colon);
    if (colon != std::string::npos) {
      item.value = current.substr(colon + 1);
      item.has_colon = true;
    }
    items.push_back(std::move(item));
    current.clear();
  };
  for (const char ch : conf) {
    if (absl::ascii_isspace(static_cast<unsigned char>(ch))) {
      const size_t colon = current.find(':');
      if (spaces_separate && depth == 0 && colon != std::string::npos &&
          colon + 1 < current.size()) {
        flush();
      }
      continue;
    }
    if (ch == '[') ++depth;
    if (ch == ']') depth = std::max(0, depth - 1);
    if (ch == ',' && depth == 0) {
      flush();
    } else {
      current += ch;
    }
  }
  flush();
  return items;
}

std::string JoinItems(const std::vector<Item>& items) {
  std::vector<std::string> parts;
  for (const Item& item : items) {
    parts.push_back(item.has_colon ? absl::StrCat(item.key, ":", item.value)
                                   : item.key);
  }
  return absl::StrJoin(parts, ",");
}

// Canonical value of every key that the canonical strings write.
std::map<std::string, std::string> CanonicalValues(
    const AllocatorConfig& config) {
  std::map<std::string, std::string> values;
  for (const std::string& text :
       {FormatAllocatorConfig(config), FormatAllocatorConfigUpdate(config)}) {
    for (const Item& item : SplitItems(text)) values[item.key] = item.value;
  }
  return values;
}

// ---------------------------------------------------------------------------
// Explanations.

std::string Mib(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, " GiB");
  }
  return absl::StrCat(bytes / kMiB, " MiB");
}

std::string DivisionsInWords(size_t divisions) {
  if (divisions <= 1) return "plain 512-byte rounding";
  return absl::StrCat("rounded up to the next 1/", divisions,
                      " step between powers of two");
}

// "[64 MiB, 128 MiB)"; the first interval also takes everything smaller,
// the last everything larger.
std::string IntervalRange(int first, int last) {
  const std::string low = Mib(kMiB << first);
  const std::string high = Mib(kMiB << (last + 1));
  if (first == 0 && last == kRoundupPower2Intervals - 1) return "all sizes";
  if (first == 0) return absl::StrCat("below ", high);
  if (last == kRoundupPower2Intervals - 1) return absl::StrCat(low, " and up");
  return absl::StrCat("[", low, ", ", high, ")");
}

std::string ExplainRoundup(const AllocatorConfig& c) {
  const auto& d = c.roundup_power2_divisions;
  std::vector<std::string> runs;
  for (int first = 0; first < kRoundupPower2Intervals;) {
    int last = first;
    while (last + 1 < kRoundupPower2Intervals && d[last + 1] == d[first]) {
      ++last;
    }
    runs.push_back(absl::StrCat(IntervalRange(first, last), ": ",
                                DivisionsInWords(d[first])));
    first = last + 1;
  }
  return absl::StrCat(
      "request sizes are rounded so that freed blocks fit "
      "later requests of similar size; ",
      absl::StrJoin(runs, "; "));
}

std::string ExplainKey(absl::string_view key, const AllocatorConfig& c) {
  if (key == "backend") {
    return c.backend == AllocatorBackend::kCudaMallocAsync
               ? "the CUDA driver's stream-ordered pool (cudaMallocAsync) "
                 "replaces PyTorch's caching allocator; the native allocator's "
                 "keys have no effect"
               : "PyTorch's own caching allocator (the default)";
  }
  if (key == "large_segment_size_mb") {
    return absl::StrCat(
        "requests between 1 MiB and 10 MiB are served from ",
        Mib(c.large_segment_size),
        " segments (20 MiB by default); also the least, and the default, "
        "max_split_size_mb and max_non_split_rounding_mb");
  }
  if (key == "max_split_size_mb") {
    if (c.max_split_size == AllocatorConfig{}.max_split_size) {
      return "unset: any cached block may be split (the default)";
    }
    return absl::StrCat(
        "blocks of ", Mib(c.max_split_size),
        " or more are never split and requests below ", Mib(c.max_split_size),
        " never take them, so big cached blocks stay whole for big requests "
        "(less fragmentation, more cudaMalloc calls)");
  }
  if (key == "max_non_split_rounding_mb") {
    return absl::StrCat(
        "a request of max_split_size or more may take a "
        "cached unsplittable block at most ",
        Mib(c.max_non_split_rounding), " larger than itself");
  }
  if (key == "roundup_power2_divisions") return ExplainRoundup(c);
  if (key == "garbage_collection_threshold") {
    if (c.garbage_collection_threshold == 0) return "off (the default)";
    return absl::StrCat(
        "when reserved memory passes ", c.garbage_collection_threshold * 100,
        "% of the per-process memory limit, cached blocks that no request "
        "used recently are freed, oldest first, before calling cudaMalloc");
  }
  if (key == "expandable_segments") {
    return c.expandable_segments
               ? "one segment per stream that grows by mapping pages (2 MiB "
                 "small pool, large_segment_size large pool) instead of a "
                 "new cudaMalloc segment per miss: little fragmentation"
               : "off: every cache miss is a new cudaMalloc segment (the "
                 "default)";
  }
  if (key == "per_process_memory_fraction") {
    return absl::StrCat(
        "reserved device memory is capped at ",
        c.per_process_memory_fraction * 100,
        "% of the device, set when each device's allocator is created (as "
        "torch.cuda.set_per_process_memory_fraction); 100% is no cap");
  }
  if (key == "release_lock_on_cudamalloc") {
    return "the allocator's lock is released around cudaMalloc/cudaFree, so "
           "other threads can allocate meanwhile; no effect on memory";
  }
  if (key == "pinned_use_cuda_host_register") {
    return "pinned host memory is malloc'ed and registered with "
           "cudaHostRegister instead of cudaHostAlloc";
  }
  if (key == "pinned_num_register_threads") {
    return absl::StrCat(c.pinned_num_register_threads,
                        " thread(s) register pinned host memory (with "
                        "pinned_use_cuda_host_register)");
  }
  if (key == "pinned_reserve_segment_size_mb") {
    return absl::StrCat("a ", c.pinned_reserve_segment_size_mb,
                        " MiB pinned host segment is reserved up front and "
                        "serves small pinned requests");
  }
  if (key == "pinned_use_background_threads") {
    return "a background thread processes the pinned host allocator's "
           "events";
  }
  return "blocks freed during CUDA graph capture that were used on other "
         "streams (record_stream) may be reused inside the capture";
}

std::vector<ConfigKeyExplanation> ExplainKeys(const AllocatorConfig& config,
                                              const std::vector<Item>& items) {
  const std::map<std::string, std::string> values = CanonicalValues(config);
  std::vector<std::string> set_keys;
  for (const Item& item : SplitItems(FormatAllocatorConfig(config))) {
    set_keys.push_back(item.key);
  }
  std::vector<ConfigKeyExplanation> keys;
  for (const KeyInfo& info : kKeys) {
    const std::string name(info.name);
    const bool set =
        std::find(set_keys.begin(), set_keys.end(), name) != set_keys.end();
    const bool named = std::any_of(
        items.begin(), items.end(),
        [&](const Item& item) { return CanonicalKey(item.key) == info.name; });
    if (!set && !named) continue;
    auto value = values.find(name);
    keys.push_back({name, value != values.end() ? value->second : "default",
                    ExplainKey(info.name, config)});
  }
  return keys;
}

// ---------------------------------------------------------------------------
// Warnings for an accepted config.

void WarnNoDeviceEffect(const std::vector<ConfigKeyExplanation>& keys,
                        std::vector<std::string>& warnings) {
  for (const ConfigKeyExplanation& key : keys) {
    const KeyInfo* info = FindKey(key.key);
    if (info != nullptr && !info->device_memory) {
      warnings.push_back(absl::StrCat(
          key.key,
          " has no effect on device memory (it concerns pinned host "
          "memory, locking or graph capture); replay and tuning "
          "ignore it"));
    }
  }
}

void WarnNativeOnly(const AllocatorConfig& c,
                    std::vector<std::string>& warnings) {
  if (c.backend != AllocatorBackend::kCudaMallocAsync) return;
  const AllocatorConfig d;
  std::vector<std::string> ignored;
  if (c.max_split_size != d.max_split_size)
    ignored.push_back("max_split_size_mb");
  if (c.max_non_split_rounding != c.large_segment_size) {
    ignored.push_back("max_non_split_rounding_mb");
  }
  if (c.roundup_power2_divisions != d.roundup_power2_divisions) {
    ignored.push_back("roundup_power2_divisions");
  }
  if (c.garbage_collection_threshold != 0) {
    ignored.push_back("garbage_collection_threshold");
  }
  if (c.expandable_segments) ignored.push_back("expandable_segments");
  if (c.large_segment_size != d.large_segment_size) {
    ignored.push_back("large_segment_size_mb");
  }
  if (ignored.empty()) return;
  warnings.push_back(absl::StrCat("backend:cudaMallocAsync ignores ",
                                  absl::StrJoin(ignored, ", "),
                                  ": only the native allocator uses them"));
}

void WarnThresholdWithoutFraction(const AllocatorConfig& c,
                                  std::vector<std::string>& warnings) {
  if (c.garbage_collection_threshold == 0 ||
      c.per_process_memory_fraction < 1.0) {
    return;
  }
  warnings.push_back(
      "garbage_collection_threshold acts only under a per-process memory "
      "fraction: without torch.cuda.set_per_process_memory_fraction(F) or "
      "per_process_memory_fraction:F (F < 1) it never runs");
}

void WarnExpandableIpc(const AllocatorConfig& c,
                       std::vector<std::string>& warnings) {
  if (!c.expandable_segments) return;
  warnings.push_back(
      "expandable_segments:True and CUDA IPC: a tensor in an expandable "
      "segment reaches another process (torch.multiprocessing, DataLoader "
      "workers returning CUDA tensors) only through pidfd_open/pidfd_getfd "
      "(Linux 5.6+, same user); where that fails PyTorch raises. Use "
      "torch.cuda.memory._set_allocator_settings('expandable_segments:False') "
      "in processes that send CUDA tensors");
}

void WarnFraction(const AllocatorConfig& c,
                  std::vector<std::string>& warnings) {
  if (c.per_process_memory_fraction == 0) {
    warnings.push_back(
        "per_process_memory_fraction:0 allows no device memory: every "
        "allocation fails with an out-of-memory error");
  }
}

// Intervals nobody named between named ones: PyTorch leaves them at 0.
void WarnRoundupGaps(const AllocatorConfig& c,
                     std::vector<std::string>& warnings) {
  const auto& d = c.roundup_power2_divisions;
  if (std::all_of(d.begin(), d.end(), [](size_t v) { return v == 0; })) return;
  std::vector<std::string> gaps;
  for (int i = 0; i < kRoundupPower2Intervals; ++i) {
    if (d[i] == 0) gaps.push_back(IntervalRange(i, i));
  }
  if (gaps.empty()) return;
  warnings.push_back(absl::StrCat(
      "roundup_power2_divisions leaves ", absl::StrJoin(gaps, ", "),
      " without power-of-two rounding: a list fills only the intervals below "
      "its first entry and after '>', the ones between stay 0"));
}

void WarnClampedSplitSize(const AllocatorConfig& c,
                          std::vector<std::string>& warnings) {
  const size_t clamped = AllocatorConfig{}.max_split_size / kMiB * kMiB;
  if (c.max_split_size == clamped) {
    warnings.push_back(
        "max_split_size_mb is so large that PyTorch clamps it; it never "
        "limits splitting, so leave it out");
  }
}

void WarnRepeatedKeys(const std::vector<Item>& items,
                      std::vector<std::string>& warnings) {
  std::map<std::string, int> counts;
  for (const Item& item : items) ++counts[std::string(CanonicalKey(item.key))];
  for (const auto& [key, count] : counts) {
    if (count < 2 || FindKey(key) == nullptr) continue;
    warnings.push_back(absl::StrCat(
        key, " is given ", count, " times: ",
        key == "roundup_power2_divisions"
            ? "each later list overwrites only the intervals it names"
            : "the last one wins"));
  }
}

// PyTorch reads numbers with std::stoull/std::stod and ignores what follows.
void WarnTrailingText(const std::vector<Item>& items,
                      std::vector<std::string>& warnings) {
  for (const Item& item : items) {
    const KeyInfo* info = FindKey(item.key);
    if (info == nullptr || item.value.empty() || item.value[0] == '[') continue;
    if (info->kind == Kind::kBool || info->kind == Kind::kBackend) continue;
    char* end = nullptr;
    std::strtod(item.value.c_str(), &end);
    if (end != item.value.c_str() && *end != '\0') {
      warnings.push_back(absl::StrCat(
          item.key, ":", item.value,
          ": PyTorch reads only the leading "
          "number and ignores '",
          end, "'",
          info->kind == Kind::kMegabytes ? " (sizes are in MiB)" : ""));
    }
  }
}

// Accepted only thanks to PyTorch not checking ':' and ','.
void WarnLenientSyntax(const AllocatorConfig& c, const std::vector<Item>& items,
                       std::vector<std::string>& warnings) {
  const bool well_formed =
      std::all_of(items.begin(), items.end(), [](const Item& item) {
        return item.has_colon && FindKey(item.key) != nullptr &&
               !item.value.empty() &&
               (item.value[0] == '[' ||
                item.value.find_first_of(":[]") == std::string::npos);
      });
  if (well_formed) return;
  warnings.push_back(absl::StrCat(
      "PyTorch accepted this only because its tokenizer does not check the "
      "':' and ',' separators; write it as \"",
      FormatAllocatorConfig(c), "\""));
}

std::vector<std::string> Warnings(
    const AllocatorConfig& config, const std::vector<Item>& items,
    const std::vector<ConfigKeyExplanation>& keys) {
  std::vector<std::string> warnings;
  WarnLenientSyntax(config, items, warnings);
  WarnRepeatedKeys(items, warnings);
  WarnTrailingText(items, warnings);
  WarnNativeOnly(config, warnings);
  WarnThresholdWithoutFraction(config, warnings);
  WarnRoundupGaps(config, warnings);
  WarnClampedSplitSize(config, warnings);
  WarnFraction(config, warnings);
  WarnExpandableIpc(config, warnings);
  WarnNoDeviceEffect(keys, warnings);
  return warnings;
}

// ---------------------------------------------------------------------------
// Fixes for a rejected config: item by item, then drop what still fails.

// Names people write for PyTorch's keys.
const std::map<std::string, std::string>& KeyAliases() {
  static const auto* aliases = new std::map<std::string, std::string>{
      {"roundup_power2", "roundup_power2_divisions"},
      {"roundup_power_divisions", "roundup_power2_divisions"},
      {"allocator", "backend"},
      {"garbage_collect_threshold", "garbage_collection_threshold"},
      {"gc_threshold", "garbage_collection_threshold"},
      {"max_split_size", "max_split_size_mb"},
      {"max_non_split_rounding", "max_non_split_rounding_mb"},
      {"large_segment_size", "large_segment_size_mb"},
      {"pinned_reserve_segment_size", "pinned_reserve_segment_size_mb"},
      {"expandable_segment", "expandable_segments"},
      {"pinned_use_host_register", "pinned_use_cuda_host_register"},
      {"memory_fraction", "per_process_memory_fraction"},
  };
  return *aliases;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// PyTorch's key closest to `key`, if it is close enough to be a typo.
std::optional<std::string> KeyFor(const std::string& key) {
  const std::string lower = absl::AsciiStrToLower(key);
  if (FindKey(lower) != nullptr) return lower;
  if (auto alias = KeyAliases().find(lower); alias != KeyAliases().end()) {
    return alias->second;
  }
  const KeyInfo* best = nullptr;
  size_t best_distance = 0;
  for (const KeyInfo& info : kKeys) {
    const size_t distance = EditDistance(lower, info.name);
    if (best == nullptr || distance < best_distance) {
      best = &info;
      best_distance = distance;
    }
  }
  if (best_distance <= std::max<size_t>(2, lower.size() / 5)) {
    return std::string(best->name);
  }
  return std::nullopt;
}

std::optional<std::string> FixBool(const std::string& value) {
  const std::string lower = absl::AsciiStrToLower(value);
  for (const char* yes : {"true", "1", "yes", "on", "y"}) {
    if (lower == yes) return "True";
  }
  for (const char* no : {"false", "0", "no", "off", "n"}) {
    if (lower == no) return "False";
  }
  return std::nullopt;
}

std::optional<std::string> FixBackend(const std::string& value) {
  const std::string lower = absl::AsciiStrToLower(value);
  if (absl::StrContains(lower, "async")) return "cudaMallocAsync";
  if (lower == "native" || lower == "default") return "native";
  return std::nullopt;
}

// "1GB" -> 1024, "512MiB" -> 512; at least `min_mb`.
std::optional<std::string> FixMegabytes(const std::string& value,
                                        size_t min_mb) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || !(number > 0)) return std::nullopt;
  const std::string unit = absl::AsciiStrToLower(end);
  double mb = number;
  if (unit == "g" || unit == "gb" || unit == "gib") mb = number * 1024;
  if (unit == "k" || unit == "kb" || unit == "kib") mb = number / 1024;
  // PyTorch clamps sizes to what fits in bytes; so do we, before the cast.
  mb = std::min(mb,
                static_cast<double>(AllocatorConfig{}.max_split_size / kMiB));
  const size_t whole = std::max<size_t>(static_cast<size_t>(mb), min_mb);
  return absl::StrCat(whole);
}

// A percentage where a fraction was meant: 80 -> 0.8. Only whole numbers
// from 2 to 100 read as one: 1.5 is no percentage anybody writes, and 0.015
// would be a wrong guess.
std::optional<std::string> FixFraction(const std::string& value,
                                       bool open_interval) {
  double number = 0;
  if (!absl::SimpleAtod(value, &number)) return std::nullopt;
  if (number >= 2 && number <= 100 && number == std::floor(number)) {
    number /= 100;
  }
  const bool ok =
      open_interval ? number > 0 && number < 1 : number >= 0 && number <= 1;
  if (!ok) return std::nullopt;
  return absl::StrCat(number);
}

size_t NearestPowerOfTwo(size_t value) {
  const size_t floor = std::bit_floor(value);
  return value - floor <= floor * 2 - value ? floor : floor * 2;
}

std::optional<std::string> FixPowerOfTwo(const std::string& value, size_t max) {
  uint64_t number = 0;
  if (!absl::SimpleAtoi(value, &number) || number == 0) return std::nullopt;
  return absl::StrCat(std::min<size_t>(NearestPowerOfTwo(number), max));
}

// Each list entry with its boundary and divisions made powers of two.
std::optional<std::string> FixRoundupList(const std::string& value) {
  std::vector<std::string> entries;
  const size_t end = value.back() == ']' ? value.size() - 1 : value.size();
  for (const Item& entry : SplitItems(value.substr(1, end - 1))) {
    if (!entry.has_colon) return std::nullopt;
    std::string boundary = entry.key;
    if (boundary != ">") {
      std::optional<std::string> fixed = FixPowerOfTwo(boundary, 1 << 15);
      if (!fixed) return std::nullopt;
      boundary = *fixed;
    }
    std::string divisions = entry.value == "0" ? "0" : "";
    if (divisions.empty()) {
      std::optional<std::string> fixed = FixPowerOfTwo(entry.value, 1 << 20);
      if (!fixed) return std::nullopt;
      divisions = *fixed;
    }
    entries.push_back(absl::StrCat(boundary, ":", divisions));
  }
  return absl::StrCat("[", absl::StrJoin(entries, ","), "]");
}

std::optional<std::string> FixValue(const KeyInfo& info,
                                    const std::string& value) {
  switch (info.kind) {
    case Kind::kBool:
      return FixBool(value);
    case Kind::kBackend:
      return FixBackend(value);
    case Kind::kMegabytes:
      return FixMegabytes(value,
                          info.name == "large_segment_size_mb" ? 11 : 20);
    case Kind::kThreshold:
      return FixFraction(value, /*open_interval=*/true);
    case Kind::kFraction:
      return FixFraction(value, /*open_interval=*/false);
    case Kind::kRoundup:
      return value.empty() || value[0] != '[' ? FixPowerOfTwo(value, 1 << 20)
                                              : FixRoundupList(value);
    case Kind::kThreads:
      return FixPowerOfTwo(value, 128);
    case Kind::kPositive:
      return FixMegabytes(value, 1);
  }
  return std::nullopt;
}

// Whether PyTorch accepts this one item on its own.
bool ItemParses(const Item& item) {
  return ParseAllocatorConfig(JoinItems({item})).ok();
}

std::string_view ValueHint(Kind kind) {
  switch (kind) {
    case Kind::kBool:
      return "True or False, capitalised";
    case Kind::kBackend:
      return "native or cudaMallocAsync";
    case Kind::kMegabytes:
      return "a whole number of MiB, at least 20 (or large_segment_size_mb)";
    case Kind::kThreshold:
      return "a number strictly between 0 and 1, such as 0.8";
    case Kind::kFraction:
      return "a number from 0 to 1, such as 0.9";
    case Kind::kRoundup:
      return "a power of two such as 4, or a list like [256:1,>:4] of "
             "power-of-two boundaries in MiB and divisions";
    case Kind::kThreads:
      return "a power of two up to 128";
    case Kind::kPositive:
      return "a whole number of MiB above 0";
  }
  return "";
}

// The item made acceptable, or nullopt to drop it; says what it changed.
std::optional<Item> FixItem(Item item, std::vector<std::string>& suggestions) {
  if (ItemParses(item)) return item;
  const std::string written = JoinItems({item});
  if (const size_t equals = item.key.find('=');
      !item.has_colon && equals != std::string::npos) {
    item = {item.key.substr(0, equals), item.key.substr(equals + 1), true};
    suggestions.push_back(absl::StrCat(
        written, " -> ", JoinItems({item}),
        " (PYTORCH_CUDA_ALLOC_CONF writes key:value; '=' is allocd tune "
        "--space's syntax)"));
    return FixItem(item, suggestions);
  }
  const std::optional<std::string> key = KeyFor(item.key);
  if (!key) {
    suggestions.push_back(absl::StrCat(
        "remove '", written, "': PyTorch 2.11 has no key '", item.key, "'"));
    return std::nullopt;
  }
  std::vector<std::string> reasons;
  if (*key != item.key) {
    reasons.push_back(absl::StrCat("the key is ", *key));
  }
  Item fixed = {*key, item.value, true};
  if (!ItemParses(fixed)) {
    const KeyInfo& info = *FindKey(*key);
    const std::string hint(ValueHint(info.kind));
    std::optional<std::string> value = FixValue(info, item.value);
    if (value) fixed.value = *value;
    if (!value || !ItemParses(fixed)) {
      reasons.push_back(
          absl::StrCat("'", item.value, "' is not a value: it takes ", hint));
      suggestions.push_back(absl::StrCat("remove '", written,
                                         "': ", absl::StrJoin(reasons, "; ")));
      return std::nullopt;
    }
    reasons.push_back(absl::StrCat("it takes ", hint));
  }
  suggestions.push_back(absl::StrCat(written, " -> ", JoinItems({fixed}), " (",
                                     absl::StrJoin(reasons, "; "), ")"));
  return fixed;
}

// Items that fail together although each parses alone (a too small
// max_split_size_mb for the large_segment_size_mb beside it, a second
// backend): drop them one by one, last first.
void DropUntilAccepted(std::vector<Item>& items,
                       std::vector<std::string>& suggestions) {
  while (!items.empty() && !ParseAllocatorConfig(JoinItems(items)).ok()) {
    suggestions.push_back(
        absl::StrCat("remove '", JoinItems({items.back()}),
                     "': PyTorch rejects it together with the rest"));
    items.pop_back();
  }
}

void SuggestFix(absl::string_view conf, ConfigCheck& check) {
  std::vector<Item> fixed;
  const std::vector<Item> spaced = SplitItems(conf, /*spaces_separate=*/true);
  if (spaced.size() > SplitItems(conf).size()) {
    check.suggestions.push_back(absl::StrCat(
        "separate the keys with ',': ", JoinItems(spaced),
        " (PyTorch drops spaces, so it read ", JoinItems(SplitItems(conf)),
        ")"));
  }
  for (const Item& item : spaced) {
    if (std::optional<Item> f = FixItem(item, check.suggestions)) {
      fixed.push_back(*std::move(f));
    }
  }
  DropUntilAccepted(fixed, check.suggestions);
  if (fixed.empty()) return;
  check.fixed_config =
      FormatAllocatorConfig(*ParseAllocatorConfig(JoinItems(fixed)));
}

// In words, for a string whose tokens PyTorch ran out of (its message is an
// internal assert about its tokenizer, which says nothing to a user).
std::string SyntaxError(absl::string_view conf) {
  const std::string what =
      "PYTORCH_CUDA_ALLOC_CONF is key:value pairs separated by commas, e.g. "
      "max_split_size_mb:128,expandable_segments:True";
  if (SplitItems(conf, /*spaces_separate=*/true).size() >
      SplitItems(conf).size()) {
    return absl::StrCat(what, "; spaces do not separate keys (PyTorch drops "
                              "them and read \"",
                        JoinItems(SplitItems(conf)), "\")");
  }
  for (const Item& item : SplitItems(conf)) {
    if (!item.has_colon && absl::StrContains(item.key, "=")) {
      return absl::StrCat(what, "; '", item.key,
                          "' has '=' where ':' belongs");
    }
    if (!item.has_colon || item.value.empty()) {
      return absl::StrCat(what, "; '", JoinItems({item}), "' has no value");
    }
  }
  return absl::StrCat(what, "; PyTorch could not read this one");
}

}  // namespace

std::string ConfigRejection(std::string_view conf,
                            const absl::Status& rejected) {
  return absl::StrContains(rejected.message(), "INTERNAL ASSERT")
             ? SyntaxError(ToAbsl(conf))
             : std::string(rejected.message());
}

ConfigCheck CheckAllocatorConfig(std::string_view conf) {
  ConfigCheck check;
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(conf);
  if (!config.ok()) {
    check.pytorch_error = std::string(config.status().message());
    check.error = ConfigRejection(conf, config.status());
    SuggestFix(ToAbsl(conf), check);
    return check;
  }
  const std::vector<Item> items = SplitItems(ToAbsl(conf));
  check.accepted = true;
  check.config = *config;
  check.keys = ExplainKeys(*config, items);
  check.warnings = Warnings(*config, items, check.keys);
  return check;
}

}  // namespace allocd
