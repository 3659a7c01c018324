// ParseAllocatorConfig / ApplyAllocatorConfigUpdate / FormatAllocatorConfig
// against PyTorch 2.11. The expectations come from PyTorch's source
// (c10/core/AllocatorConfig.{h,cpp}, c10/cuda/CUDAAllocatorConfig.cpp; the
// function is named where it helps) and from runs of the real PyTorch
// 2.11.0+cu130 (pytorch_oracle_cases.inc), never from our own output.
#include "allocator/config.h"

#include <bit>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/absl_string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct OracleCase {
  const char* conf;
  const char* error;  // "" = accepted
  const char* state;  // fields that differ from the defaults
};
#include "tests/allocator/pytorch_oracle_cases.inc"

constexpr size_t kUnset = std::numeric_limits<size_t>::max();
// The largest max_split_size PyTorch stores: std::min(mb, SIZE_MAX / kMB).
constexpr size_t kClampedMax = kUnset / kMiB * kMiB;

using Divisions = std::array<size_t, kRoundupPower2Intervals>;

std::string G17(double value) {
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

// The oracle's state encoding (see pytorch_oracle_cases.inc).
std::string StateOf(const AllocatorConfig& c) {
  const AllocatorConfig d;
  std::vector<std::string> parts;
  auto add = [&](bool differs, const char* name, const std::string& value) {
    if (differs) parts.push_back(absl::StrCat(name, "=", value));
  };
  add(c.large_segment_size != d.large_segment_size, "ls",
      absl::StrCat(c.large_segment_size));
  add(c.max_split_size != d.max_split_size, "ms",
      absl::StrCat(c.max_split_size));
  add(c.max_non_split_rounding != d.max_non_split_rounding, "nsr",
      absl::StrCat(c.max_non_split_rounding));
  add(c.roundup_power2_divisions != d.roundup_power2_divisions, "rd",
      absl::StrJoin(c.roundup_power2_divisions, ","));
  add(c.garbage_collection_threshold != d.garbage_collection_threshold, "gc",
      G17(c.garbage_collection_threshold));
  add(c.expandable_segments != d.expandable_segments, "es", "1");
  add(c.pinned_use_background_threads != d.pinned_use_background_threads, "pbg",
      "1");
  add(c.pinned_num_register_threads != d.pinned_num_register_threads, "thr",
      absl::StrCat(c.pinned_num_register_threads));
  add(c.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb,
      "res", absl::StrCat(c.pinned_reserve_segment_size_mb));
  add(c.release_lock_on_cudamalloc != d.release_lock_on_cudamalloc, "rl", "1");
  add(c.pinned_use_cuda_host_register != d.pinned_use_cuda_host_register, "hr",
      "1");
  add(c.graph_capture_record_stream_reuse !=
          d.graph_capture_record_stream_reuse,
      "gr", "1");
  add(c.per_process_memory_fraction != d.per_process_memory_fraction, "fr",
      G17(c.per_process_memory_fraction));
  add(c.backend != d.backend, "be", "cudaMallocAsync");
  return absl::StrJoin(parts, ";");
}

// Python shows std::stoull/std::stod failures as just "stoull"/"stod"; we
// add which token it was.
void ExpectSameError(const std::string& pytorch, const absl::Status& status,
                     const std::string& context) {
  ASSERT_FALSE(status.ok()) << context << " PyTorch: " << pytorch;
  if (pytorch == "stoull" || pytorch == "stod") {
    EXPECT_THAT(std::string(status.message()), StartsWith(pytorch + ":"))
        << context;
  } else {
    EXPECT_EQ(status.message(), pytorch) << context;
  }
}

Divisions DivisionsOf(absl::string_view conf) {
  absl::StatusOr<AllocatorConfig> config =
      ParseAllocatorConfig(absl::StrCat("roundup_power2_divisions:", conf));
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? config->roundup_power2_divisions : Divisions{};
}

std::string ErrorOf(absl::string_view conf) {
  absl::StatusOr<AllocatorConfig> config =
      ParseAllocatorConfig(std::string(conf));
  EXPECT_FALSE(config.ok()) << conf;
  return config.ok() ? "" : std::string(config.status().message());
}

// ---------------------------------------------------------------------------
// What the real PyTorch 2.11 did.

TEST(AbslStringViewTest, ViewsTheSameBytesWithoutCopying) {
  const std::string conf = "max_split_size_mb:128";
  const std::string_view value = std::string_view(conf).substr(18);
  const absl::string_view view = ToAbsl(value);
  EXPECT_EQ(view.data(), conf.data() + 18);
  EXPECT_EQ(view, "128");
}

TEST(ConfigOracleTest, StartupParseMatchesPyTorch) {
  for (const OracleCase& c : kOracleEnvCases) {
    absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(c.conf);
    const std::string context = absl::StrCat("conf: \"", c.conf, "\"");
    if (*c.error != '\0') {
      ExpectSameError(c.error, config.status(), context);
      continue;
    }
    ASSERT_TRUE(config.ok()) << context << ": " << config.status();
    EXPECT_EQ(StateOf(*config), c.state) << context;
  }
}

TEST(ConfigOracleTest, RuntimeUpdatesMatchPyTorch) {
  for (const std::vector<OracleCase>& sequence : kOracleUpdateSequences) {
    AllocatorConfig current;
    for (const OracleCase& c : sequence) {
      AllocatorConfigUpdate update =
          ApplyAllocatorConfigUpdate(c.conf, current);
      const std::string context = absl::StrCat("update: \"", c.conf, "\"");
      if (*c.error != '\0') {
        ExpectSameError(c.error, update.status, context);
      } else {
        EXPECT_TRUE(update.status.ok()) << context << ": " << update.status;
      }
      // Also after a failure: PyTorch keeps what it applied before it.
      EXPECT_EQ(StateOf(update.config), c.state) << context;
      current = update.config;
    }
  }
}

// ---------------------------------------------------------------------------
// The two rejections in the shipped traces' ground truth (a real 2.11 run).

TEST(ConfigTest, RealRejections) {
  EXPECT_EQ(ErrorOf("max_split_size_mb:64,roundup_power2:true,"
                    "allocator:cudaMallocAsync"),
            "Unrecognized key 'roundup_power2' in CUDA allocator config.");
  EXPECT_EQ(ErrorOf("max_split_size_mb:256,expandable_segments:true,"
                    "garbage_collection_threshold:0.8"),
            "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got "
            "'true'");
}

TEST(ConfigTest, EmptyIsDefault) {
  EXPECT_EQ(*ParseAllocatorConfig(""), AllocatorConfig{});
  EXPECT_EQ(*ParseAllocatorConfig(" \t "), AllocatorConfig{});
}

// ---------------------------------------------------------------------------
// ConfigTokenizer: ',', ':', '[' and ']' are tokens; isspace characters are
// dropped everywhere, also inside words.

TEST(ConfigTokenizerTest, WhitespaceIsDroppedEverywhere) {
  EXPECT_EQ(ParseAllocatorConfig(" max_split_size_mb : 128 , "
                                 "expandable_segments : True ")
                ->max_split_size,
            128 * kMiB);
  EXPECT_EQ(ParseAllocatorConfig("max_split\t_size_mb:1 28")->max_split_size,
            128 * kMiB);
  EXPECT_TRUE(
      ParseAllocatorConfig("expandable_segments:Tr ue")->expandable_segments);
  // Non-ASCII spaces are part of the word.
  EXPECT_EQ(ErrorOf("\xa0max_split_size_mb:64"),
            "Unrecognized key '\xa0max_split_size_mb' in CUDA allocator "
            "config.");
}

// checkToken(i, ":") and checkToken(i, ",") only check that token i exists.
TEST(ConfigTokenizerTest, SeparatorsAreNotChecked) {
  EXPECT_EQ(ParseAllocatorConfig("max_split_size_mb,128")->max_split_size,
            128 * kMiB);
  absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(
      "max_split_size_mb:128]garbage_collection_threshold:0.5");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->garbage_collection_threshold, 0.5);
  EXPECT_TRUE(
      ParseAllocatorConfig("expandable_segments[True")->expandable_segments);
  EXPECT_TRUE(ParseAllocatorConfig("max_split_size_mb:128:"
                                   "expandable_segments:True")
                  ->expandable_segments);
  EXPECT_EQ(DivisionsOf("[64,8]"), DivisionsOf("[64:8]"));
}

TEST(ConfigTokenizerTest, EmptyItemsBecomeKeys) {
  EXPECT_TRUE(ParseAllocatorConfig("max_split_size_mb:128,").ok());
  EXPECT_EQ(ErrorOf(",max_split_size_mb:128"),
            "Unrecognized key ',' in CUDA allocator config.");
  EXPECT_EQ(ErrorOf("max_split_size_mb:128,,expandable_segments:True"),
            "Unrecognized key ',' in CUDA allocator config.");
}

// Running off the end is a TORCH_INTERNAL_ASSERT (which aborts the process
// when it happens in the load-time backend scan).
TEST(ConfigTokenizerTest, TruncatedInputIsAnInternalAssert) {
  const std::string check_index =
      "i < config_.size() INTERNAL ASSERT FAILED at "
      "\"/pytorch/c10/core/AllocatorConfig.h\":124, please report a bug to "
      "PyTorch. Index out of bounds in ConfigTokenizer";
  for (const char* conf : {"max_split_size_mb", "max_split_size_mb:", "foo",
                           ":", "max_split_size_mb=128"}) {
    EXPECT_EQ(ErrorOf(conf), check_index) << conf;
  }
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[64:8"),
              HasSubstr("Expected closing bracket ']' in ConfigTokenizer"));
  EXPECT_THAT(ErrorOf("backend:"),
              HasSubstr("AllocatorConfig.h\":55, please report a bug"));
}

// ---------------------------------------------------------------------------
// Sizes: parseMaxSplitSize, parseMaxNonSplitRoundingSize,
// parseLargeSegmentSize.

TEST(ConfigSizeTest, MaxSplitSizeRange) {
  EXPECT_EQ(ErrorOf("max_split_size_mb:19"),
            "CachingAllocator option max_split_size_mb too small, must be >= "
            "20");
  EXPECT_EQ(ParseAllocatorConfig("max_split_size_mb:20")->max_split_size,
            20 * kMiB);
  // std::min(val, SIZE_MAX / kMB) * kMB.
  EXPECT_EQ(ParseAllocatorConfig("max_split_size_mb:18446744073709551615")
                ->max_split_size,
            kClampedMax);
  // std::stoull wraps negative numbers around.
  EXPECT_EQ(ParseAllocatorConfig("max_split_size_mb:-5")->max_split_size,
            kClampedMax);
  EXPECT_THAT(ErrorOf("max_split_size_mb:99999999999999999999"),
              StartsWith("stoull:"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:abc"), StartsWith("stoull:"));
  // stoull reads the leading number: "64MB" is 64, "0x40" is 0, "1e3" is 1.
  EXPECT_EQ(ParseAllocatorConfig("max_split_size_mb:64MB")->max_split_size,
            64 * kMiB);
  EXPECT_THAT(ErrorOf("max_split_size_mb:0x40"), HasSubstr("must be >= 20"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:1e3"), HasSubstr("must be >= 20"));
}

TEST(ConfigSizeTest, MaxNonSplitRounding) {
  EXPECT_EQ(ErrorOf("max_non_split_rounding_mb:19"),
            "CachingAllocator option max_non_split_rounding_mb too small, "
            "must be >= 20");
  EXPECT_EQ(ParseAllocatorConfig("max_non_split_rounding_mb:64")
                ->max_non_split_rounding,
            64 * kMiB);
}

// large_segment_size_mb is read before every other key and sets the floor
// (and the default) of the two sizes above.
TEST(ConfigSizeTest, LargeSegmentSize) {
  EXPECT_EQ(ErrorOf("large_segment_size_mb:10"),
            "CachingAllocator option large_segment_size_mb must be > 10 MB");
  absl::StatusOr<AllocatorConfig> c =
      ParseAllocatorConfig("large_segment_size_mb:64");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->large_segment_size, 64 * kMiB);
  EXPECT_EQ(c->max_non_split_rounding, 64 * kMiB);
  for (const char* conf : {"large_segment_size_mb:64,max_split_size_mb:32",
                           "max_split_size_mb:32,large_segment_size_mb:64"}) {
    EXPECT_EQ(ErrorOf(conf),
              "CachingAllocator option max_split_size_mb too small, must be "
              ">= 64")
        << conf;
  }
  c = ParseAllocatorConfig("max_split_size_mb:20,large_segment_size_mb:11");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_non_split_rounding, 11 * kMiB);
}

// ---------------------------------------------------------------------------
// parseGarbageCollectionThreshold: std::stod, then (0, 1) open.

TEST(ConfigThresholdTest, Range) {
  for (const char* value : {"0", "1", "1.0", "-0.5", "nan", "inf"}) {
    EXPECT_EQ(ErrorOf(absl::StrCat("garbage_collection_threshold:", value)),
              "garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
        << value;
  }
  for (const auto& [value, expected] :
       std::vector<std::pair<const char*, double>>{{"0.5", 0.5},
                                                   {".25", 0.25},
                                                   {"5e-1", 0.5},
                                                   {"0x0.8p0", 0.5},
                                                   {"0.8abc", 0.8},
                                                   {"0.9999999", 0.9999999}}) {
    EXPECT_EQ(ParseAllocatorConfig(
                  absl::StrCat("garbage_collection_threshold:", value))
                  ->garbage_collection_threshold,
              expected)
        << value;
  }
  // Subnormal results set ERANGE: std::stod throws.
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:1e-310"),
              StartsWith("stod:"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:abc"), StartsWith("stod:"));
}

// ---------------------------------------------------------------------------
// parseRoundUpPower2Divisions.

TEST(ConfigRoundupTest, SingleValueFillsEveryInterval) {
  Divisions all4;
  all4.fill(4);
  EXPECT_EQ(DivisionsOf("4"), all4);
  EXPECT_EQ(ErrorOf("roundup_power2_divisions:3"),
            "For roundups, the divisions has to be power of 2 ");
  // 0 is allowed in a list but not here (isPowerOf2_64(0) is false).
  EXPECT_EQ(ErrorOf("roundup_power2_divisions:0"),
            "For roundups, the divisions has to be power of 2 ");
}

// The documented example: the first entry fills the intervals below it,
// '>' the ones after the last named one, and the unnamed ones in between
// (128 MiB and 512 MiB) stay 0.
TEST(ConfigRoundupTest, ListSemantics) {
  EXPECT_EQ(DivisionsOf("[64:8,256:4,1024:4,>:1]"),
            (Divisions{8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1}));
  EXPECT_EQ(DivisionsOf("[64:8]"),
            (Divisions{8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // '>' with nothing named yet starts after interval 0.
  EXPECT_EQ(DivisionsOf("[>:4]"),
            (Divisions{0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  // Order matters: only the first named entry fills downwards.
  EXPECT_EQ(DivisionsOf("[256:4,64:8]"),
            (Divisions{4, 4, 4, 4, 4, 4, 8, 4, 4, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(DivisionsOf("[>:4,64:8]"),
            (Divisions{8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(DivisionsOf("[2:2,1:4,>:8]"),
            (Divisions{4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}));
  EXPECT_EQ(DivisionsOf("[64:8,256:0,>:2]"),
            (Divisions{8, 8, 8, 8, 8, 8, 8, 0, 0, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(DivisionsOf("[]"), Divisions{});
}

// A boundary of 2^k MiB names interval k, clamped to the last one.
TEST(ConfigRoundupTest, BoundariesNameIntervals) {
  EXPECT_EQ(DivisionsOf("[1:2]"), (Divisions{2}));
  EXPECT_EQ(DivisionsOf("[2:4]"), (Divisions{4, 4}));
  Divisions all4;
  all4.fill(4);
  EXPECT_EQ(DivisionsOf("[65536:4]"), all4);
  EXPECT_EQ(DivisionsOf("[32768:4]"), all4);
  Divisions last_only{};
  last_only[15] = 16;
  EXPECT_EQ(DivisionsOf("[1:0,32768:16]"), last_only);
  EXPECT_EQ(ErrorOf("roundup_power2_divisions:[63:4]"),
            "For roundups, the intervals have to be power of 2 ");
  EXPECT_EQ(ErrorOf("roundup_power2_divisions:[0:4]"),
            "For roundups, the intervals have to be power of 2 ");
  EXPECT_EQ(ErrorOf("roundup_power2_divisions:[64:3]"),
            "For roundups, the divisions has to be power of 2 or 0 to "
            "disable roundup ");
}

// AcceleratorAllocatorConfig::roundup_power2_divisions(size): the interval
// of a request is floor(log2(size)) - 20, clamped to [0, 15].
TEST(ConfigRoundupTest, RequestSizesFallInTheNamedIntervals) {
  const Divisions divisions = DivisionsOf("[64:8,256:4,1024:4,>:1]");
  auto for_size = [&](size_t size) {
    const int index = std::clamp(static_cast<int>(std::bit_width(size)) - 21, 0,
                                 kRoundupPower2Intervals - 1);
    return divisions[index];
  };
  EXPECT_EQ(for_size(4096), 8u);             // below 1 MiB: interval 0
  EXPECT_EQ(for_size(100 * kMiB), 8u);       // [64, 128) MiB
  EXPECT_EQ(for_size(200 * kMiB), 0u);       // [128, 256) MiB: unnamed
  EXPECT_EQ(for_size(300 * kMiB), 4u);       // [256, 512) MiB
  EXPECT_EQ(for_size(600 * kMiB), 0u);       // [512, 1024) MiB: unnamed
  EXPECT_EQ(for_size(1500 * kMiB), 4u);      // [1, 2) GiB
  EXPECT_EQ(for_size(size_t{3} << 30), 1u);  // after the last named: '>'
  EXPECT_EQ(for_size(size_t{1} << 40), 1u);  // above 64 GiB: the last
}

// A second roundup key overwrites only what it names.
TEST(ConfigRoundupTest, RepeatedKeyMerges) {
  EXPECT_EQ(ParseAllocatorConfig("roundup_power2_divisions:[64:8],"
                                 "roundup_power2_divisions:[>:2]")
                ->roundup_power2_divisions,
            (Divisions{8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
}

// ---------------------------------------------------------------------------
// Booleans: ConfigTokenizer::toBool takes "True" and "False" only.

TEST(ConfigBoolTest, OnlyCapitalisedTrueAndFalse) {
  EXPECT_TRUE(
      ParseAllocatorConfig("expandable_segments:True")->expandable_segments);
  EXPECT_FALSE(
      ParseAllocatorConfig("expandable_segments:False")->expandable_segments);
  EXPECT_EQ(ErrorOf("expandable_segments:1"),
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got "
            "'1'");
  EXPECT_EQ(ErrorOf("release_lock_on_cudamalloc:true"),
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got "
            "'true'");
  EXPECT_EQ(ErrorOf("expandable_segments:[True]"),
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got "
            "'['");
}

// ---------------------------------------------------------------------------
// CUDAAllocatorConfig keys.

TEST(ConfigCudaKeysTest, ValuesAndRanges) {
  absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(
      "release_lock_on_hipmalloc:True,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:128,pinned_reserve_segment_size_mb:1024,"
      "graph_capture_record_stream_reuse:True,per_process_memory_fraction:0."
      "5,pinned_use_background_threads:True");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->release_lock_on_cudamalloc);
  EXPECT_TRUE(c->pinned_use_cuda_host_register);
  EXPECT_EQ(c->pinned_num_register_threads, 128u);
  EXPECT_EQ(c->pinned_reserve_segment_size_mb, 1024u);
  EXPECT_TRUE(c->graph_capture_record_stream_reuse);
  EXPECT_EQ(c->per_process_memory_fraction, 0.5);
  EXPECT_TRUE(c->pinned_use_background_threads);

  EXPECT_EQ(ErrorOf("pinned_num_register_threads:3"),
            "Number of register threads has to be power of 2, got 3");
  EXPECT_EQ(ErrorOf("pinned_num_register_threads:256"),
            "Number of register threads should be less than or equal to 128, "
            "got 256");
  EXPECT_EQ(ErrorOf("pinned_reserve_segment_size_mb:0"),
            "Pinned reserve segment size has to be greater than 0");
  EXPECT_EQ(ErrorOf("per_process_memory_fraction:1.5"),
            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
  // Accepted; every allocation then fails (seen on PyTorch 2.11).
  EXPECT_EQ(ParseAllocatorConfig("per_process_memory_fraction:0")
                ->per_process_memory_fraction,
            0.0);
}

TEST(ConfigBackendTest, NamesAndLoadTimeScan) {
  EXPECT_EQ(ParseAllocatorConfig("backend:cudaMallocAsync")->backend,
            AllocatorBackend::kCudaMallocAsync);
  EXPECT_EQ(ParseAllocatorConfig("backend : cudaMallocAsync ")->backend,
            AllocatorBackend::kCudaMallocAsync);
  EXPECT_EQ(ErrorOf("backend:foo"),
            "Unknown allocator backend, options are native and "
            "cudaMallocAsync");
  EXPECT_EQ(ErrorOf("backend:hipMallocAsync"),
            "Unknown allocator backend, options are native and "
            "cudaMallocAsync");
  // The load-time scan stops at the first backend; a later different one
  // trips CUDAAllocatorConfig::parseAllocatorConfig's assert.
  EXPECT_EQ(ErrorOf("backend:native,backend:cudaMallocAsync"),
            "tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at "
            "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44, please report "
            "a bug to PyTorch. Allocator backend parsed at runtime != "
            "allocator backend parsed at load time, cudaMallocAsync != "
            "native");
}

// Under cudaMallocAsync the generic keys are parsed at load time, first, so
// an unknown key gets the generic wording there.
TEST(ConfigBackendTest, CudaMallocAsyncParsesGenericKeysFirst) {
  EXPECT_EQ(ErrorOf("backend:cudaMallocAsync,max_split_size_mb:64,foo:1"),
            "Unrecognized key 'foo' in Accelerator allocator config.");
  EXPECT_EQ(ErrorOf("max_split_size_mb:64,foo:1"),
            "Unrecognized key 'foo' in CUDA allocator config.");
}

// PyTorch defers the CUDA-specific pass under cudaMallocAsync until pinned
// memory or an update reads it; seen on 2.11: the process starts, then
// torch.empty(16, pin_memory=True) raises this. We reject at once.
TEST(ConfigBackendTest, DeferredCudaKeyErrorsAreReportedAtOnce) {
  EXPECT_EQ(ErrorOf("backend:cudaMallocAsync,pinned_num_register_threads:3"),
            "Number of register threads has to be power of 2, got 3");
  EXPECT_EQ(ErrorOf("backend:cudaMallocAsync,per_process_memory_fraction:2"),
            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
}

TEST(ConfigTest, NativeEnvParsesCudaKeysFirst) {
  // CUDAAllocatorConfig::instance() parses before the generic keys.
  EXPECT_EQ(ErrorOf("expandable_segments:true,pinned_num_register_threads:3"),
            "Number of register threads has to be power of 2, got 3");
  EXPECT_EQ(ErrorOf("max_split_size_mb:abc,foo:1"),
            "Unrecognized key 'foo' in CUDA allocator config.");
}

// ---------------------------------------------------------------------------
// Runtime updates (_set_allocator_settings).

TEST(ConfigUpdateTest, ResetsAndPersistentFields) {
  absl::StatusOr<AllocatorConfig> start = ParseAllocatorConfig(
      "max_split_size_mb:128,roundup_power2_divisions:4,"
      "garbage_collection_threshold:0.5,max_non_split_rounding_mb:64,"
      "expandable_segments:True,large_segment_size_mb:32,"
      "per_process_memory_fraction:0.5,pinned_num_register_threads:8,"
      "pinned_use_background_threads:True");
  ASSERT_TRUE(start.ok()) << start.status();
  absl::StatusOr<AllocatorConfig> after =
      ParseAllocatorConfigUpdate("", *start);
  ASSERT_TRUE(after.ok());
  AllocatorConfig expected = *start;
  expected.max_split_size = kUnset;
  expected.roundup_power2_divisions = {};
  expected.garbage_collection_threshold = 0;
  expected.max_non_split_rounding = 32 * kMiB;  // back to large_segment_size
  EXPECT_EQ(*after, expected);
}

TEST(ConfigUpdateTest, UnknownKeyHasTheGenericWording) {
  EXPECT_EQ(ParseAllocatorConfigUpdate("max_split_size_mb:128,foo:1",
                                       AllocatorConfig{})
                .status()
                .message(),
            "Unrecognized key 'foo' in Accelerator allocator config.");
}

TEST(ConfigUpdateTest, FailedUpdateIsPartlyApplied) {
  AllocatorConfig current =
      *ParseAllocatorConfig("expandable_segments:True,max_split_size_mb:256");
  AllocatorConfigUpdate update = ApplyAllocatorConfigUpdate(
      "max_split_size_mb:128,expandable_segments:false,"
      "garbage_collection_threshold:0.5",
      current);
  EXPECT_EQ(update.status.message(),
            "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got "
            "'false'");
  EXPECT_EQ(update.config.max_split_size, 128 * kMiB);
  EXPECT_TRUE(update.config.expandable_segments);
  EXPECT_EQ(update.config.garbage_collection_threshold, 0.0);
  // The generic pass succeeded, the CUDA pass failed: generic keys stay.
  update = ApplyAllocatorConfigUpdate(
      "max_split_size_mb:128,pinned_num_register_threads:3", AllocatorConfig{});
  EXPECT_FALSE(update.status.ok());
  EXPECT_EQ(update.config.max_split_size, 128 * kMiB);
}

TEST(ConfigUpdateTest, BackendCannotChange) {
  EXPECT_TRUE(
      ParseAllocatorConfigUpdate("backend:native", AllocatorConfig{}).ok());
  EXPECT_THAT(std::string(ParseAllocatorConfigUpdate("backend:cudaMallocAsync",
                                                     AllocatorConfig{})
                              .status()
                              .message()),
              HasSubstr("cudaMallocAsync != native"));
  AllocatorConfig async;
  async.backend = AllocatorBackend::kCudaMallocAsync;
  EXPECT_THAT(std::string(ParseAllocatorConfigUpdate("backend:native", async)
                              .status()
                              .message()),
              HasSubstr("native != cudaMallocAsync"));
}

TEST(ConfigUpdateTest, LargeSegmentSizePersistsAndRaisesTheFloor) {
  AllocatorConfig c = *ParseAllocatorConfigUpdate("large_segment_size_mb:64",
                                                  AllocatorConfig{});
  EXPECT_EQ(
      ParseAllocatorConfigUpdate("max_split_size_mb:32", c).status().message(),
      "CachingAllocator option max_split_size_mb too small, must be >= "
      "64");
  EXPECT_EQ(ParseAllocatorConfigUpdate("", c)->large_segment_size, 64 * kMiB);
}

// ---------------------------------------------------------------------------
// FormatAllocatorConfig.

TEST(ConfigFormatTest, CanonicalStrings) {
  EXPECT_EQ(FormatAllocatorConfig(AllocatorConfig{}), "");
  EXPECT_EQ(FormatAllocatorConfig(*ParseAllocatorConfig(
                " expandable_segments:True, garbage_collection_threshold:0.8,"
                "max_split_size_mb:256 ,backend:cudaMallocAsync")),
            "backend:cudaMallocAsync,max_split_size_mb:256,"
            "garbage_collection_threshold:0.8,expandable_segments:True");
  // Keys at their defaults are left out.
  EXPECT_EQ(FormatAllocatorConfig(*ParseAllocatorConfig(
                "expandable_segments:False,max_non_split_rounding_mb:20,"
                "backend:native,pinned_num_register_threads:1")),
            "");
}

TEST(ConfigFormatTest, CanonicalConfigsOfConfigsThatActAlikeAreEqual) {
  EXPECT_EQ(CanonicalAllocatorConfig(" max_split_size_mb:64,expandable_segments:False"),
            CanonicalAllocatorConfig("max_split_size_mb:64"));
  EXPECT_EQ(CanonicalAllocatorConfig("expandable_segments:True,max_split_size_mb:128"),
            "max_split_size_mb:128,expandable_segments:True");
  EXPECT_EQ(CanonicalAllocatorConfig(""), "");
  EXPECT_NE(CanonicalAllocatorConfig("max_split_size_mb:64"),
            CanonicalAllocatorConfig("max_split_size_mb:128"));
  // What PyTorch rejects has none.
  EXPECT_EQ(CanonicalAllocatorConfig("max_split_size_mb:1"), std::nullopt);
  EXPECT_EQ(CanonicalAllocatorConfig("no_such_key:1"), std::nullopt);
}

std::string FormatDivisions(const Divisions& divisions) {
  AllocatorConfig c;
  c.roundup_power2_divisions = divisions;
  return FormatAllocatorConfig(c);
}

TEST(ConfigFormatTest, RoundupShortestForms) {
  EXPECT_EQ(FormatDivisions(DivisionsOf("[1:4,>:4]")),
            "roundup_power2_divisions:4");
  EXPECT_EQ(FormatDivisions(DivisionsOf("[>:4]")),
            "roundup_power2_divisions:[>:4]");
  EXPECT_EQ(FormatDivisions(DivisionsOf("[64:8,256:4,1024:4,>:1]")),
            "roundup_power2_divisions:[64:8,256:4,1024:4,>:1]");
  // [2, 8, 8, 8, 4, ...]: three entries, the fix-up for interval 0 last.
  EXPECT_EQ(FormatDivisions(DivisionsOf("[8:8,>:4,1:2]")),
            "roundup_power2_divisions:[8:8,>:4,1:2]");
  // Intervals left 0 after the first entry stay unnamed.
  EXPECT_EQ(FormatDivisions(DivisionsOf("[64:8]")),
            "roundup_power2_divisions:[64:8]");
  // [8 x7, 0, 0, 2 x7] needs three entries; more than one form has three.
  const std::string text = FormatDivisions(DivisionsOf("[64:8,256:0,>:2]"));
  EXPECT_EQ(std::count(text.begin(), text.end(), ','), 2) << text;
  EXPECT_EQ(DivisionsOf(text.substr(text.find(':') + 1)),
            DivisionsOf("[64:8,256:0,>:2]"));
}

// Any config PyTorch can hold: random values in each field's domain.
AllocatorConfig RandomConfig(std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto chance = [&]() { return pick(2) == 0; };
  auto divisions = [&]() { return chance() ? 0 : size_t{1} << pick(64); };
  AllocatorConfig c;
  if (chance()) c.large_segment_size = (11 + pick(100)) * kMiB;
  const size_t min_mb = c.large_segment_size / kMiB;
  if (chance()) c.max_split_size = (min_mb + pick(5000)) * kMiB;
  if (pick(8) == 0) c.max_split_size = kClampedMax;
  c.max_non_split_rounding = c.large_segment_size;
  if (chance()) c.max_non_split_rounding = (min_mb + pick(500)) * kMiB;
  if (chance()) {
    const size_t base = divisions();
    for (size_t& d : c.roundup_power2_divisions) {
      d = pick(3) == 0 ? divisions() : base;
    }
    if (c.roundup_power2_divisions == Divisions{} && chance()) {
      c.roundup_power2_divisions.fill(1);
    }
  }
  if (chance()) {
    c.garbage_collection_threshold =
        std::uniform_real_distribution<double>(1e-300, 1.0)(rng);
  }
  c.expandable_segments = chance();
  if (pick(4) == 0) c.backend = AllocatorBackend::kCudaMallocAsync;
  if (chance()) {
    c.per_process_memory_fraction =
        pick(4) == 0 ? 0.0 : std::uniform_real_distribution<double>(0, 1)(rng);
  }
  c.release_lock_on_cudamalloc = chance();
  c.pinned_use_cuda_host_register = chance();
  c.pinned_num_register_threads = size_t{1} << pick(8);
  c.pinned_use_background_threads = chance();
  c.graph_capture_record_stream_reuse = chance();
  if (chance()) c.pinned_reserve_segment_size_mb = 1 + pick(100000);
  return c;
}

TEST(ConfigFormatTest, RoundTripsRandomConfigs) {
  std::mt19937_64 rng(2011);
  for (int i = 0; i < 10000; ++i) {
    const AllocatorConfig c = RandomConfig(rng);
    const std::string text = FormatAllocatorConfig(c);
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    ASSERT_EQ(*parsed, c) << text;
    ASSERT_EQ(FormatAllocatorConfig(*parsed), text);
  }
}

TEST(ConfigFormatTest, RoundTripsEveryConfigPyTorchAccepted) {
  for (const OracleCase& c : kOracleEnvCases) {
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(c.conf);
    if (!parsed.ok()) continue;
    const std::string text = FormatAllocatorConfig(*parsed);
    EXPECT_EQ(ParseAllocatorConfig(text).value_or(AllocatorConfig{}), *parsed)
        << c.conf << " -> " << text;
  }
}

// Every list of length <= 3 over a few boundaries and divisions: the
// canonical form is never longer than the input and means the same.
TEST(ConfigFormatTest, RoundupListsNeverGetLonger) {
  const std::vector<std::string> boundaries = {"1",   "4",     "64",
                                               "256", "32768", ">"};
  const std::vector<std::string> values = {"0", "2", "8"};
  std::vector<std::string> entries;
  for (const std::string& b : boundaries) {
    for (const std::string& v : values) entries.push_back(b + ":" + v);
  }
  for (const std::string& a : entries) {
    for (const std::string& b : entries) {
      for (const std::string& c : entries) {
        const std::string list = absl::StrCat("[", a, ",", b, ",", c, "]");
        const Divisions divisions = DivisionsOf(list);
        const std::string text = FormatDivisions(divisions);
        if (divisions == Divisions{}) {
          EXPECT_EQ(text, "");
          continue;
        }
        EXPECT_EQ(DivisionsOf(text.substr(text.find(':') + 1)), divisions)
            << list << " -> " << text;
        EXPECT_LE(std::count(text.begin(), text.end(), ','), 2)
            << list << " -> " << text;
      }
    }
  }
}

// FormatAllocatorConfigUpdate leaves a live process with exactly the target,
// whatever it held before.
TEST(ConfigFormatTest, UpdateStringReachesTheTargetFromAnyState) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; ++i) {
    AllocatorConfig before = RandomConfig(rng);
    AllocatorConfig target = RandomConfig(rng);
    target.backend = before.backend;
    if (target.pinned_reserve_segment_size_mb == 0) {
      // 0 cannot be written back; the old value stays.
      target.pinned_reserve_segment_size_mb =
          before.pinned_reserve_segment_size_mb;
    }
    const std::string text = FormatAllocatorConfigUpdate(target);
    absl::StatusOr<AllocatorConfig> after =
        ParseAllocatorConfigUpdate(text, before);
    ASSERT_TRUE(after.ok()) << text << ": " << after.status();
    ASSERT_EQ(*after, target) << text;
  }
}

}  // namespace
}  // namespace allocd
