#include "allocator/config.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "allocator/absl_string_view.h"

namespace allocd {
namespace {

// PyTorch's internal-assert messages, verbatim: the Python exception's text
// in 2.11.0 (the line numbers are that release's).
constexpr absl::string_view kCheckIndexFailed =
    "i < config_.size() INTERNAL ASSERT FAILED at "
    "\"/pytorch/c10/core/AllocatorConfig.h\":124, please report a bug to "
    "PyTorch. Index out of bounds in ConfigTokenizer";
constexpr absl::string_view kSubscriptFailed =
    "i < config_.size() INTERNAL ASSERT FAILED at "
    "\"/pytorch/c10/core/AllocatorConfig.h\":55, please report a bug to "
    "PyTorch. Index out of bounds in ConfigTokenizer";
constexpr absl::string_view kSkipKeyNoBracket =
    "i < config_.size() INTERNAL ASSERT FAILED at "
    "\"/pytorch/c10/core/AllocatorConfig.h\":115, please report a bug to "
    "PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end "
    "of config";
constexpr absl::string_view kRoundupNoBracket =
    "i < tokenizer.size() INTERNAL ASSERT FAILED at "
    "\"/pytorch/c10/core/AllocatorConfig.cpp\":185, please report a bug to "
    "PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end "
    "of config";
constexpr absl::string_view kBackendMismatch =
    "tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at "
    "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44, please report a bug to "
    "PyTorch. Allocator backend parsed at runtime != allocator backend parsed "
    "at load time, ";

// parseLargeSegmentSize: large_segment_size_mb must exceed kMinLargeAlloc.
constexpr size_t kMinLargeSegmentSizeMb = 10;
constexpr size_t kMaxSizeMb = std::numeric_limits<size_t>::max() / kMiB;
// CUDAAllocatorConfig::pinned_max_register_threads().
constexpr size_t kMaxRegisterThreads = 128;

// Keys either pass knows: AcceleratorAllocatorConfig::getKeys() once the
// CUDA hook has registered its own. The other pass skips them.
constexpr absl::string_view kKnownKeys[] = {
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
    "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads",
    "per_process_memory_fraction",
};

bool IsKnownKey(absl::string_view key) {
  return std::find(std::begin(kKnownKeys), std::end(kKnownKeys), key) !=
         std::end(kKnownKeys);
}

absl::string_view BackendName(AllocatorBackend backend) {
  return backend == AllocatorBackend::kCudaMallocAsync ? "cudaMallocAsync"
                                                       : "native";
}

absl::Status Error(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// llvm::isPowerOf2_64: 0 is not a power of two.
bool IsPowerOfTwo(uint64_t value) { return std::has_single_bit(value); }

// c10::CachingAllocator::ConfigTokenizer with its checks turned into
// statuses. Every ',', ':', '[' and ']' is a token of its own; whitespace
// (C-locale isspace) is dropped everywhere, also inside words.
class Tokenizer {
 public:
  explicit Tokenizer(absl::string_view conf) {
    std::string word;
    for (const char ch : conf) {
      if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
        if (!word.empty()) tokens_.push_back(std::exchange(word, {}));
        tokens_.emplace_back(1, ch);
      } else if (!IsSpace(ch)) {
        word += ch;
      }
    }
    if (!word.empty()) tokens_.push_back(std::move(word));
  }

  size_t size() const { return tokens_.size(); }

  // Token `i`, which the caller knows exists.
  const std::string& operator[](size_t i) const { return tokens_[i]; }

  // operator[] with its bounds assert.
  absl::StatusOr<absl::string_view> At(size_t i) const {
    if (i >= size()) return Error(kSubscriptFailed);
    return tokens_[i];
  }

  // checkToken(i, ...): PyTorch ignores the comparison and only checks that
  // token `i` exists, so any token stands in for ':' or ','.
  absl::Status Expect(size_t i) const {
    return i < size() ? absl::OkStatus() : Error(kCheckIndexFailed);
  }

  // toSizeT: std::stoull, so leading '+'/'-' and trailing junk are accepted
  // ("-5" wraps around, "64MB" is 64).
  absl::StatusOr<size_t> ToSizeT(size_t i) const {
    if (absl::Status s = Expect(i); !s.ok()) return s;
    const char* text = tokens_[i].c_str();
    char* end = nullptr;
    errno = 0;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text) return ConversionError("stoull", i, "is not a number");
    if (errno == ERANGE) return ConversionError("stoull", i, "is out of range");
    return static_cast<size_t>(value);
  }

  // toDouble: std::stod, which also takes "nan", "inf", hex floats and
  // trailing junk, and fails on values that underflow to subnormals.
  absl::StatusOr<double> ToDouble(size_t i) const {
    if (absl::Status s = Expect(i); !s.ok()) return s;
    const char* text = tokens_[i].c_str();
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(text, &end);
    if (end == text) return ConversionError("stod", i, "is not a number");
    if (errno == ERANGE) return ConversionError("stod", i, "is out of range");
    return value;
  }

  absl::StatusOr<bool> ToBool(size_t i) const {
    if (absl::Status s = Expect(i); !s.ok()) return s;
    if (tokens_[i] == "True") return true;
    if (tokens_[i] == "False") return false;
    return Error(absl::StrCat("Expected 'True' or 'False' at index ", i,
                              " in ConfigTokenizer but got '", tokens_[i],
                              "'"));
  }

  // skipKey: from key `i` to its value, or to the ']' closing a list value.
  absl::StatusOr<size_t> SkipKey(size_t i) const {
    if (absl::Status s = Expect(++i); !s.ok()) return s;
    if (absl::Status s = Expect(++i); !s.ok()) return s;
    if (tokens_[i] != "[") return i;
    while (++i < size() && tokens_[i] != "]") {
    }
    if (i >= size()) return Error(kSkipKeyNoBracket);
    return i;
  }

 private:
  static bool IsSpace(char ch) {
    return ch == ' ' || (ch >= '\t' && ch <= '\r');
  }

  // Python shows only what() of std::invalid_argument / std::out_of_range
  // ("stoull", "stod"); the rest says which token it was.
  absl::Status ConversionError(absl::string_view function, size_t i,
                               absl::string_view problem) const {
    return Error(absl::StrCat(function, ": '", tokens_[i], "' at index ", i,
                              " ", problem));
  }

  std::vector<std::string> tokens_;
};

// Each parse step returns the index of the last token it consumed.
using Step = absl::StatusOr<size_t>;

// A "<key>:<number of MiB>" value with a lower bound, clamped above so that
// it fits in bytes.
Step ParseMegabytes(const Tokenizer& tokens, size_t i, size_t min_mb,
                    absl::string_view too_small, size_t& bytes) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<size_t> mb = tokens.ToSizeT(++i);
  if (!mb.ok()) return mb.status();
  if (*mb < min_mb) return Error(absl::StrCat(too_small, min_mb));
  bytes = std::min(*mb, kMaxSizeMb) * kMiB;
  return i;
}

Step ParseBool(const Tokenizer& tokens, size_t i, bool& value) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<bool> parsed = tokens.ToBool(++i);
  if (!parsed.ok()) return parsed.status();
  value = *parsed;
  return i;
}

// The interval a boundary of `boundary_mb` MiB names: log2, clamped.
size_t IntervalOf(size_t boundary_mb) {
  return std::min<size_t>(std::bit_width(boundary_mb) - 1,
                          kRoundupPower2Intervals - 1);
}

// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions, list form. The
// first named boundary also fills every interval below it; '>' fills every
// interval after the last named one (after interval 0 when none is named
// yet); intervals nobody names keep what they had.
Step ParseRoundupList(const Tokenizer& tokens, size_t i,
                      std::array<size_t, kRoundupPower2Intervals>& divisions) {
  bool first_value = true;
  size_t last_index = 0;
  while (++i < tokens.size() && tokens[i] != "]") {
    const size_t boundary_index = i;
    if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
    absl::StatusOr<size_t> value = tokens.ToSizeT(++i);
    if (!value.ok()) return value.status();
    if (*value != 0 && !IsPowerOfTwo(*value)) {
      return Error(
          "For roundups, the divisions has to be power of 2 or 0 to disable "
          "roundup ");
    }
    if (tokens[boundary_index] == ">") {
      std::fill(divisions.begin() + last_index + 1, divisions.end(), *value);
    } else {
      absl::StatusOr<size_t> boundary = tokens.ToSizeT(boundary_index);
      if (!boundary.ok()) return boundary.status();
      if (!IsPowerOfTwo(*boundary)) {
        return Error("For roundups, the intervals have to be power of 2 ");
      }
      const size_t index = IntervalOf(*boundary);
      if (first_value) {
        std::fill(divisions.begin(), divisions.begin() + index, *value);
        first_value = false;
      }
      divisions[index] = *value;
      last_index = index;
    }
    absl::StatusOr<absl::string_view> next = tokens.At(i + 1);
    if (!next.ok()) return next.status();
    if (*next != "]") ++i;  // the ',' (unchecked, like PyTorch)
  }
  if (i >= tokens.size()) return Error(kRoundupNoBracket);
  return i;
}

Step ParseRoundup(const Tokenizer& tokens, size_t i,
                  std::array<size_t, kRoundupPower2Intervals>& divisions) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<absl::string_view> first = tokens.At(++i);
  if (!first.ok()) return first.status();
  if (*first == "[") return ParseRoundupList(tokens, i, divisions);
  absl::StatusOr<size_t> value = tokens.ToSizeT(i);
  if (!value.ok()) return value.status();
  if (!IsPowerOfTwo(*value)) {
    return Error("For roundups, the divisions has to be power of 2 ");
  }
  divisions.fill(*value);
  return i;
}

Step ParseGarbageCollectionThreshold(const Tokenizer& tokens, size_t i,
                                     double& threshold) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<double> value = tokens.ToDouble(++i);
  if (!value.ok()) return value.status();
  if (!(*value > 0 && *value < 1.0)) {
    return Error("garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
  }
  threshold = *value;
  return i;
}

Step ParseLargeSegmentSize(const Tokenizer& tokens, size_t i,
                           AllocatorConfig& config) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<size_t> mb = tokens.ToSizeT(++i);
  if (!mb.ok()) return mb.status();
  if (*mb <= kMinLargeSegmentSizeMb) {
    return Error(
        absl::StrCat("CachingAllocator option large_segment_size_mb must be > ",
                     kMinLargeSegmentSizeMb, " MB"));
  }
  config.large_segment_size = std::min(*mb, kMaxSizeMb) * kMiB;
  return i;
}

// One generic key (AcceleratorAllocatorConfig::parseArgs's chain).
Step ParseGenericKey(const Tokenizer& tokens, size_t i,
                     AllocatorConfig& config) {
  const std::string& key = tokens[i];
  const size_t min_mb = config.large_segment_size / kMiB;
  if (key == "large_segment_size_mb") return tokens.SkipKey(i);  // pre-pass
  if (key == "max_split_size_mb") {
    return ParseMegabytes(
        tokens, i, min_mb,
        "CachingAllocator option max_split_size_mb too small, must be >= ",
        config.max_split_size);
  }
  if (key == "max_non_split_rounding_mb") {
    return ParseMegabytes(tokens, i, min_mb,
                          "CachingAllocator option max_non_split_rounding_mb "
                          "too small, must be >= ",
                          config.max_non_split_rounding);
  }
  if (key == "garbage_collection_threshold") {
    return ParseGarbageCollectionThreshold(tokens, i,
                                           config.garbage_collection_threshold);
  }
  if (key == "roundup_power2_divisions") {
    return ParseRoundup(tokens, i, config.roundup_power2_divisions);
  }
  if (key == "expandable_segments") {
    return ParseBool(tokens, i, config.expandable_segments);
  }
  if (key == "pinned_use_background_threads") {
    return ParseBool(tokens, i, config.pinned_use_background_threads);
  }
  if (!IsKnownKey(key)) {
    return Error(absl::StrCat("Unrecognized key '", key,
                              "' in Accelerator allocator config."));
  }
  return tokens.SkipKey(i);
}

// AcceleratorAllocatorConfig::parseArgs.
absl::Status ParseGenericKeys(const Tokenizer& tokens,
                              AllocatorConfig& config) {
  config.max_split_size = AllocatorConfig{}.max_split_size;
  config.roundup_power2_divisions.fill(0);
  config.garbage_collection_threshold = 0;
  // large_segment_size_mb first, wherever it is: the other sizes are checked
  // against it. This pass looks at every token, values included.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] != "large_segment_size_mb") continue;
    Step next = ParseLargeSegmentSize(tokens, i, config);
    if (!next.ok()) return next.status();
    i = *next;
  }
  config.max_non_split_rounding = config.large_segment_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    Step next = ParseGenericKey(tokens, i, config);
    if (!next.ok()) return next.status();
    i = *next;
    if (i + 1 < tokens.size()) ++i;  // the ',' (unchecked, like PyTorch)
  }
  return absl::OkStatus();
}

// CUDAAllocatorConfig::parseAllocatorConfig: the name must be one PyTorch
// knows and the one the process loaded with.
Step ParseBackend(const Tokenizer& tokens, size_t i, AllocatorBackend loaded) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<absl::string_view> name = tokens.At(++i);
  if (!name.ok()) return name.status();
  if (*name != "native" && *name != "cudaMallocAsync") {
    return Error(
        "Unknown allocator backend, options are native and cudaMallocAsync");
  }
  if (*name != BackendName(loaded)) {
    return Error(
        absl::StrCat(kBackendMismatch, *name, " != ", BackendName(loaded)));
  }
  return i;
}

Step ParseRegisterThreads(const Tokenizer& tokens, size_t i, size_t& threads) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<size_t> value = tokens.ToSizeT(++i);
  if (!value.ok()) return value.status();
  if (!IsPowerOfTwo(*value)) {
    return Error(absl::StrCat(
        "Number of register threads has to be power of 2, got ", *value));
  }
  if (*value > kMaxRegisterThreads) {
    return Error(absl::StrCat(
        "Number of register threads should be less than or equal to ",
        kMaxRegisterThreads, ", got ", *value));
  }
  threads = *value;
  return i;
}

Step ParseReserveSegmentSize(const Tokenizer& tokens, size_t i,
                             size_t& size_mb) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<size_t> value = tokens.ToSizeT(++i);
  if (!value.ok()) return value.status();
  if (*value == 0) {
    return Error("Pinned reserve segment size has to be greater than 0");
  }
  size_mb = *value;
  return i;
}

Step ParseMemoryFraction(const Tokenizer& tokens, size_t i, double& fraction) {
  if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
  absl::StatusOr<double> value = tokens.ToDouble(++i);
  if (!value.ok()) return value.status();
  if (!(*value >= 0.0 && *value <= 1.0)) {
    return Error(
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
  }
  fraction = *value;
  return i;
}

// One key of CUDAAllocatorConfig::parseArgs's chain. The hip spellings are
// accepted on CUDA builds too.
Step ParseCudaKey(const Tokenizer& tokens, size_t i, AllocatorConfig& config) {
  const std::string& key = tokens[i];
  if (key == "backend") return ParseBackend(tokens, i, config.backend);
  if (key == "release_lock_on_cudamalloc" ||
      key == "release_lock_on_hipmalloc") {
    return ParseBool(tokens, i, config.release_lock_on_cudamalloc);
  }
  if (key == "pinned_use_cuda_host_register" ||
      key == "pinned_use_hip_host_register") {
    return ParseBool(tokens, i, config.pinned_use_cuda_host_register);
  }
  if (key == "pinned_num_register_threads") {
    return ParseRegisterThreads(tokens, i, config.pinned_num_register_threads);
  }
  if (key == "pinned_reserve_segment_size_mb") {
    return ParseReserveSegmentSize(tokens, i,
                                   config.pinned_reserve_segment_size_mb);
  }
  if (key == "graph_capture_record_stream_reuse") {
    return ParseBool(tokens, i, config.graph_capture_record_stream_reuse);
  }
  if (key == "per_process_memory_fraction") {
    return ParseMemoryFraction(tokens, i, config.per_process_memory_fraction);
  }
  if (!IsKnownKey(key)) {
    return Error(
        absl::StrCat("Unrecognized key '", key, "' in CUDA allocator config."));
  }
  return tokens.SkipKey(i);
}

// CUDAAllocatorConfig::parseArgs. Nothing is reset: these keys persist.
absl::Status ParseCudaKeys(const Tokenizer& tokens, AllocatorConfig& config) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    Step next = ParseCudaKey(tokens, i, config);
    if (!next.ok()) return next.status();
    i = *next;
    if (i + 1 < tokens.size()) ++i;  // the ',' (unchecked, like PyTorch)
  }
  return absl::OkStatus();
}

// BackendStaticInitializer::parseEnvForBackend, when libc10_cuda loads:
// walks the keys, skipping values, up to the first `backend`. Its asserts
// abort the process before Python starts.
absl::StatusOr<AllocatorBackend> ScanBackend(const Tokenizer& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == "backend") {
      if (absl::Status s = tokens.Expect(++i); !s.ok()) return s;
      absl::StatusOr<absl::string_view> name = tokens.At(++i);
      if (!name.ok()) return name.status();
      return *name == "cudaMallocAsync" ? AllocatorBackend::kCudaMallocAsync
                                        : AllocatorBackend::kNative;
    }
    Step next = tokens.SkipKey(i);
    if (!next.ok()) return next.status();
    i = *next;
    if (i + 1 < tokens.size()) ++i;
  }
  return AllocatorBackend::kNative;
}

// ---------------------------------------------------------------------------
// Formatting.

std::string FormatDouble(double value) {
  char buffer[32];
  // Shortest form that reads back to the same double.
  const auto [end, ec] =
      std::to_chars(std::begin(buffer), std::end(buffer), value);
  return std::string(buffer, end);
}

absl::string_view FormatBool(bool value) { return value ? "True" : "False"; }

// One entry of a roundup list: an interval index and its divisions, or '>'
// (no index).
struct RoundupEntry {
  std::optional<int> index;
  size_t divisions;
};

using Divisions = std::array<size_t, kRoundupPower2Intervals>;

// How to get intervals j..15 right when the unnamed ones among them hold
// values[b]: name j or not, then maybe a '>' that gives the unnamed ones
// after j values[fill]; `cost` counts the entries from j on.
struct RoundupMove {
  int cost = 0;
  bool name = false;
  int fill = -1;
};
using RoundupPlan = std::vector<std::vector<RoundupMove>>;

// The cheapest moves for the intervals after k, by dynamic programming from
// the last interval back. `values` holds 0 first, then every value in
// `target`.
RoundupPlan PlanAfter(const Divisions& target, int k,
                      const std::vector<size_t>& values) {
  const int n = static_cast<int>(values.size());
  RoundupPlan plan(kRoundupPower2Intervals + 1, std::vector<RoundupMove>(n));
  for (int j = kRoundupPower2Intervals - 1; j > k; --j) {
    const std::vector<RoundupMove>& next = plan[j + 1];
    for (int b = 0; b < n; ++b) {
      const bool right = values[b] == target[j];
      RoundupMove best = {next[b].cost + (right ? 0 : 1), !right, -1};
      for (int g = 0; g < n; ++g) {
        if (2 + next[g].cost < best.cost) best = {2 + next[g].cost, true, g};
      }
      plan[j][b] = best;
    }
  }
  return plan;
}

// The shortest list whose first entry names interval k with `fill` (so
// intervals 0..k get `fill`), then names intervals k+1..15 left to right as
// PlanAfter says; the intervals 0..k that `fill` gets wrong are named last,
// where they move no '>'.
std::vector<RoundupEntry> RoundupListFrom(const Divisions& target, int k,
                                          size_t fill,
                                          const std::vector<size_t>& values) {
  const RoundupPlan plan = PlanAfter(target, k, values);
  const std::vector<RoundupMove>& after = plan[k + 1];
  // After the first entry the unnamed intervals hold 0 (values[0]) unless a
  // '>' right after it gives them something else.
  int held = 0;
  for (int g = 1; g < static_cast<int>(values.size()); ++g) {
    if (1 + after[g].cost < after[held].cost + (held == 0 ? 0 : 1)) held = g;
  }
  std::vector<RoundupEntry> entries = {{k, fill}};
  if (held != 0) entries.push_back({std::nullopt, values[held]});
  for (int j = k + 1; j < kRoundupPower2Intervals; ++j) {
    const RoundupMove& move = plan[j][held];
    if (move.name) entries.push_back({j, target[j]});
    if (move.fill >= 0) {
      entries.push_back({std::nullopt, values[move.fill]});
      held = move.fill;
    }
  }
  for (int j = 0; j <= k; ++j) {
    if (target[j] != fill) entries.push_back({j, target[j]});
  }
  return entries;
}

std::string FormatRoundupEntries(const std::vector<RoundupEntry>& entries) {
  std::vector<std::string> parts;
  for (const RoundupEntry& entry : entries) {
    parts.push_back(entry.index ? absl::StrCat(size_t{1} << *entry.index, ":",
                                               entry.divisions)
                                : absl::StrCat(">:", entry.divisions));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

std::string FormatRoundup(const Divisions& divisions) {
  if (std::all_of(divisions.begin(), divisions.end(),
                  [&](size_t d) { return d == divisions[0]; })) {
    return absl::StrCat(divisions[0]);  // never 0: that is the default
  }
  std::vector<RoundupEntry> best;
  if (divisions[0] == 0 &&
      std::all_of(divisions.begin() + 1, divisions.end(),
                  [&](size_t d) { return d == divisions[1]; })) {
    best = {{std::nullopt, divisions[1]}};  // "[>:d]" skips interval 0
  }
  std::string best_text = best.empty() ? "" : FormatRoundupEntries(best);
  std::vector<size_t> values = {0};
  for (size_t d : divisions) {
    if (std::find(values.begin(), values.end(), d) == values.end()) {
      values.push_back(d);
    }
  }
  for (int k = 0; k < kRoundupPower2Intervals; ++k) {
    for (size_t fill : values) {
      std::vector<RoundupEntry> entries =
          RoundupListFrom(divisions, k, fill, values);
      std::string text = FormatRoundupEntries(entries);
      if (best.empty() || entries.size() < best.size() ||
          (entries.size() == best.size() && text.size() < best_text.size())) {
        best = std::move(entries);
        best_text = std::move(text);
      }
    }
  }
  return best_text;
}

// Every key at its value in `config`, in canonical order; `all` also writes
// the persistent keys that are at their defaults.
std::vector<std::string> FormatKeys(const AllocatorConfig& config, bool all) {
  const AllocatorConfig defaults;
  std::vector<std::string> keys;
  auto add = [&](bool differs, absl::string_view key, const auto& value) {
    if (differs) keys.push_back(absl::StrCat(key, ":", value));
  };
  add(!all && config.backend != defaults.backend, "backend",
      BackendName(config.backend));
  add(all || config.large_segment_size != defaults.large_segment_size,
      "large_segment_size_mb", config.large_segment_size / kMiB);
  add(config.max_split_size != defaults.max_split_size, "max_split_size_mb",
      config.max_split_size / kMiB);
  add(config.max_non_split_rounding != config.large_segment_size,
      "max_non_split_rounding_mb", config.max_non_split_rounding / kMiB);
  add(config.roundup_power2_divisions != defaults.roundup_power2_divisions,
      "roundup_power2_divisions",
      FormatRoundup(config.roundup_power2_divisions));
  add(config.garbage_collection_threshold !=
          defaults.garbage_collection_threshold,
      "garbage_collection_threshold",
      FormatDouble(config.garbage_collection_threshold));
  add(all || config.expandable_segments != defaults.expandable_segments,
      "expandable_segments", FormatBool(config.expandable_segments));
  add(all || config.per_process_memory_fraction !=
                 defaults.per_process_memory_fraction,
      "per_process_memory_fraction",
      FormatDouble(config.per_process_memory_fraction));
  add(all || config.release_lock_on_cudamalloc !=
                 defaults.release_lock_on_cudamalloc,
      "release_lock_on_cudamalloc",
      FormatBool(config.release_lock_on_cudamalloc));
  add(all || config.pinned_use_cuda_host_register !=
                 defaults.pinned_use_cuda_host_register,
      "pinned_use_cuda_host_register",
      FormatBool(config.pinned_use_cuda_host_register));
  add(all || config.pinned_num_register_threads !=
                 defaults.pinned_num_register_threads,
      "pinned_num_register_threads", config.pinned_num_register_threads);
  // 0 cannot be written (PyTorch wants > 0), so it is never pushed.
  add(config.pinned_reserve_segment_size_mb !=
          defaults.pinned_reserve_segment_size_mb,
      "pinned_reserve_segment_size_mb", config.pinned_reserve_segment_size_mb);
  add(all || config.pinned_use_background_threads !=
                 defaults.pinned_use_background_threads,
      "pinned_use_background_threads",
      FormatBool(config.pinned_use_background_threads));
  add(all || config.graph_capture_record_stream_reuse !=
                 defaults.graph_capture_record_stream_reuse,
      "graph_capture_record_stream_reuse",
      FormatBool(config.graph_capture_record_stream_reuse));
  return keys;
}

}  // namespace

absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(std::string_view conf) {
  const Tokenizer tokens(ToAbsl(conf));
  absl::StatusOr<AllocatorBackend> backend = ScanBackend(tokens);
  if (!backend.ok()) return backend.status();
  AllocatorConfig config;
  config.backend = *backend;
  // Under cudaMallocAsync the generic pass runs at load time, before CUDA's.
  const bool generic_first = *backend == AllocatorBackend::kCudaMallocAsync;
  absl::Status first = generic_first ? ParseGenericKeys(tokens, config)
                                     : ParseCudaKeys(tokens, config);
  if (!first.ok()) return first;
  absl::Status second = generic_first ? ParseCudaKeys(tokens, config)
                                      : ParseGenericKeys(tokens, config);
  if (!second.ok()) return second;
  return config;
}

AllocatorConfigUpdate ApplyAllocatorConfigUpdate(
    std::string_view conf, const AllocatorConfig& current) {
  const Tokenizer tokens(ToAbsl(conf));
  AllocatorConfigUpdate update = {absl::OkStatus(), current};
  update.status = ParseGenericKeys(tokens, update.config);
  if (update.status.ok()) update.status = ParseCudaKeys(tokens, update.config);
  return update;
}

absl::StatusOr<AllocatorConfig> ParseAllocatorConfigUpdate(
    std::string_view conf, const AllocatorConfig& current) {
  AllocatorConfigUpdate update = ApplyAllocatorConfigUpdate(conf, current);
  if (!update.status.ok()) return update.status;
  return update.config;
}

std::string FormatAllocatorConfig(const AllocatorConfig& config) {
  return absl::StrJoin(FormatKeys(config, /*all=*/false), ",");
}

std::optional<std::string> CanonicalAllocatorConfig(std::string_view conf) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(conf);
  if (!parsed.ok()) return std::nullopt;
  return FormatAllocatorConfig(*parsed);
}

std::string FormatAllocatorConfigUpdate(const AllocatorConfig& config) {
  return absl::StrJoin(FormatKeys(config, /*all=*/true), ",");
}

}  // namespace allocd
