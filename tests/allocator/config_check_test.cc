// CheckAllocatorConfig: the verdict is ParseAllocatorConfig's (tested against
// PyTorch 2.11 in config_test.cc); here the words around it: explanations,
// warnings, suggestions and a fix that PyTorch accepts.
#include "allocator/config_check.h"

#include <string>
#include <vector>

#include "allocator/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::vector<std::string> KeyNames(const ConfigCheck& check) {
  std::vector<std::string> names;
  for (const ConfigKeyExplanation& key : check.keys) names.push_back(key.key);
  return names;
}

// The fix must be something PyTorch accepts.
void ExpectFixParses(const ConfigCheck& check) {
  ASSERT_TRUE(check.fixed_config.has_value());
  EXPECT_TRUE(ParseAllocatorConfig(*check.fixed_config).ok())
      << *check.fixed_config;
}

TEST(ConfigCheckTest, AcceptedConfigIsExplainedKeyByKey) {
  const ConfigCheck check =
      CheckAllocatorConfig("max_split_size_mb:128,expandable_segments:True");
  EXPECT_TRUE(check.accepted);
  EXPECT_THAT(check.error, IsEmpty());
  EXPECT_THAT(KeyNames(check),
              ElementsAre("max_split_size_mb", "expandable_segments"));
  EXPECT_EQ(check.keys[0].value, "128");
  EXPECT_THAT(check.keys[0].explanation, HasSubstr("128 MiB"));
  EXPECT_THAT(check.keys[0].explanation, HasSubstr("never split"));
  EXPECT_FALSE(check.fixed_config.has_value());
}

TEST(ConfigCheckTest, KeysAtTheirDefaultAreStillExplained) {
  const ConfigCheck check = CheckAllocatorConfig("expandable_segments:False");
  ASSERT_TRUE(check.accepted);
  EXPECT_THAT(
      check.keys,
      ElementsAre(AllOf(
          Field(&ConfigKeyExplanation::key, "expandable_segments"),
          Field(&ConfigKeyExplanation::value, "False"),
          Field(&ConfigKeyExplanation::explanation, HasSubstr("default")))));
}

TEST(ConfigCheckTest, RoundupExplanationNamesIntervals) {
  const ConfigCheck check =
      CheckAllocatorConfig("roundup_power2_divisions:[64:8,256:4,>:1]");
  ASSERT_TRUE(check.accepted);
  ASSERT_EQ(check.keys.size(), 1u);
  EXPECT_THAT(check.keys[0].explanation,
              AllOf(HasSubstr("below 128 MiB: rounded up to the next 1/8"),
                    HasSubstr("[128 MiB, 256 MiB): plain 512-byte rounding")));
  // The interval nobody named is worth a warning.
  EXPECT_THAT(check.warnings, Contains(AllOf(HasSubstr("[128 MiB, 256 MiB)"),
                                             HasSubstr("stay 0"))));
}

TEST(ConfigCheckTest, RealRejectionsGetTheirFixes) {
  ConfigCheck check = CheckAllocatorConfig(
      "max_split_size_mb:64,roundup_power2:true,allocator:cudaMallocAsync");
  EXPECT_FALSE(check.accepted);
  EXPECT_EQ(check.error,
            "Unrecognized key 'roundup_power2' in CUDA allocator config.");
  EXPECT_THAT(check.suggestions,
              Contains(HasSubstr("the key is roundup_power2_divisions")));
  EXPECT_THAT(check.suggestions,
              Contains(HasSubstr("-> backend:cudaMallocAsync")));
  ExpectFixParses(check);
  EXPECT_EQ(*check.fixed_config,
            "backend:cudaMallocAsync,max_split_size_mb:64");

  check = CheckAllocatorConfig(
      "max_split_size_mb:256,expandable_segments:true,"
      "garbage_collection_threshold:0.8");
  EXPECT_EQ(check.error,
            "Expected 'True' or 'False' at index 6 in ConfigTokenizer but got "
            "'true'");
  EXPECT_THAT(check.suggestions,
              Contains(HasSubstr("expandable_segments:true -> "
                                 "expandable_segments:True")));
  ExpectFixParses(check);
  EXPECT_EQ(*check.fixed_config,
            "max_split_size_mb:256,garbage_collection_threshold:0.8,"
            "expandable_segments:True");
}

TEST(ConfigCheckTest, MisspeltKeysByEditDistance) {
  const ConfigCheck check = CheckAllocatorConfig(
      "max_split_sise_mb:128,garbage_colection_threshold:0.5,"
      "expandible_segments:True");
  EXPECT_FALSE(check.accepted);
  EXPECT_THAT(check.suggestions,
              ElementsAre(HasSubstr("-> max_split_size_mb:128"),
                          HasSubstr("-> garbage_collection_threshold:0.5"),
                          HasSubstr("-> expandable_segments:True")));
  ExpectFixParses(check);
}

TEST(ConfigCheckTest, UnknownKeysAreDropped) {
  const ConfigCheck check =
      CheckAllocatorConfig("foo:bar,max_split_size_mb:128");
  EXPECT_THAT(check.suggestions, ElementsAre(HasSubstr("remove 'foo:bar'")));
  ExpectFixParses(check);
  EXPECT_EQ(*check.fixed_config, "max_split_size_mb:128");
}

TEST(ConfigCheckTest, ValuesAreBroughtIntoRange) {
  const ConfigCheck check = CheckAllocatorConfig(
      "max_split_size_mb:1GB,garbage_collection_threshold:80,"
      "roundup_power2_divisions:[64:3,>:6],pinned_num_register_threads:5,"
      "backend:async");
  EXPECT_FALSE(check.accepted);
  ExpectFixParses(check);
  const AllocatorConfig fixed = *ParseAllocatorConfig(*check.fixed_config);
  EXPECT_EQ(fixed.max_split_size, 1024 * kMiB);
  EXPECT_EQ(fixed.garbage_collection_threshold, 0.8);
  // The nearest power of two; ties go down.
  EXPECT_EQ(fixed.roundup_power2_divisions[6], 2u);
  EXPECT_EQ(fixed.roundup_power2_divisions[7], 4u);
  EXPECT_EQ(fixed.pinned_num_register_threads, 4u);
  EXPECT_EQ(fixed.backend, AllocatorBackend::kCudaMallocAsync);
}

TEST(ConfigCheckTest, ConflictingItemsAreDroppedUntilAccepted) {
  // Each parses alone; together max_split_size_mb is below the floor that
  // large_segment_size_mb sets.
  const ConfigCheck check =
      CheckAllocatorConfig("large_segment_size_mb:64,max_split_size_mb:32");
  EXPECT_FALSE(check.accepted);
  EXPECT_THAT(check.suggestions,
              ElementsAre(HasSubstr("remove 'max_split_size_mb:32'")));
  ExpectFixParses(check);
}

// "max_split_size_mb=64" (the '=' of allocd tune --space) makes PyTorch's
// tokenizer run out of tokens: its message is an internal assert. The check
// says the syntax instead, and fixes it.
TEST(ConfigCheckTest, AnEqualsSignIsExplainedAndFixed) {
  const ConfigCheck check = CheckAllocatorConfig("max_split_size_mb=64");
  EXPECT_FALSE(check.accepted);
  EXPECT_THAT(check.pytorch_error, HasSubstr("INTERNAL ASSERT"));
  EXPECT_THAT(check.error, Not(HasSubstr("INTERNAL ASSERT")));
  EXPECT_THAT(check.error, HasSubstr("key:value"));
  EXPECT_THAT(check.error, HasSubstr("'=' where ':' belongs"));
  ExpectFixParses(check);
  EXPECT_EQ(*check.fixed_config, "max_split_size_mb:64");
}

// What the daemon, replay and the transparent mode say of a rejected
// config: PyTorch's own words where they speak to a user, the syntax where
// PyTorch's are an internal assert ("garbage": issue 41).
TEST(ConfigRejectionTest, TranslatesOnlyPyTorchsInternalAsserts) {
  const absl::Status garbage = ParseAllocatorConfig("garbage").status();
  ASSERT_THAT(garbage.message(), HasSubstr("INTERNAL ASSERT"));
  const std::string said = ConfigRejection("garbage", garbage);
  EXPECT_THAT(said, HasSubstr("key:value"));
  EXPECT_THAT(said, HasSubstr("'garbage' has no value"));
  EXPECT_THAT(said, Not(HasSubstr("INTERNAL ASSERT")));
  const absl::Status unknown = ParseAllocatorConfig("max_splitsize_mb:64").status();
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(ConfigRejection("max_splitsize_mb:64", unknown), unknown.message());
}

// PyTorch drops whitespace everywhere, so "a:1 b:2" is "a:1b:2", which it
// rejects. The fix keeps both keys, and the message says what PyTorch read.
TEST(ConfigCheckTest, SpaceSeparatedKeysKeepEveryKey) {
  for (const char* conf : {"max_split_size_mb:64 expandable_segments:True",
                           "garbage_collection_threshold:0.6 max_split_size_mb:128"}) {
    const ConfigCheck check = CheckAllocatorConfig(conf);
    EXPECT_FALSE(check.accepted) << conf;
    EXPECT_THAT(check.error, HasSubstr("spaces do not separate keys")) << conf;
    ExpectFixParses(check);
    const ConfigCheck spaced_fix = CheckAllocatorConfig(*check.fixed_config);
    EXPECT_EQ(spaced_fix.keys.size(), 2u) << *check.fixed_config;
  }
  const ConfigCheck check =
      CheckAllocatorConfig("max_split_size_mb:64 expandable_segments:True");
  EXPECT_THAT(check.error,
              HasSubstr("read \"max_split_size_mb:64expandable_segments:True\""));
  EXPECT_EQ(*check.fixed_config, "max_split_size_mb:64,expandable_segments:True");
  // A space after the ':' is no separator (and PyTorch accepts it).
  EXPECT_TRUE(CheckAllocatorConfig("max_split_size_mb: 64").accepted);
}

// 1.5 is not a percentage anybody writes: no "fix" to 0.015, but the range
// and an example.
TEST(ConfigCheckTest, AThresholdAboveOneIsNotReadAsAPercentage) {
  const ConfigCheck check = CheckAllocatorConfig("garbage_collection_threshold:1.5");
  EXPECT_FALSE(check.accepted);
  EXPECT_FALSE(check.fixed_config.has_value()) << *check.fixed_config;
  EXPECT_THAT(check.suggestions,
              ElementsAre(AllOf(HasSubstr("strictly between 0 and 1"),
                                HasSubstr("0.8"))));
  // A whole percentage still reads as one.
  const ConfigCheck percent = CheckAllocatorConfig("garbage_collection_threshold:60");
  ASSERT_TRUE(percent.fixed_config.has_value());
  EXPECT_EQ(*percent.fixed_config, "garbage_collection_threshold:0.6");
}

TEST(ConfigCheckTest, NothingToSalvageMeansNoFix) {
  const ConfigCheck check = CheckAllocatorConfig("hello world");
  EXPECT_FALSE(check.accepted);
  EXPECT_FALSE(check.fixed_config.has_value());
}

TEST(ConfigCheckTest, WarnsAboutKeysWithoutDeviceMemoryEffect) {
  const ConfigCheck check = CheckAllocatorConfig(
      "pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:True");
  ASSERT_TRUE(check.accepted);
  EXPECT_THAT(check.warnings,
              Contains(HasSubstr("pinned_use_cuda_host_register has no effect "
                                 "on device memory")));
  EXPECT_THAT(check.warnings,
              Contains(HasSubstr("release_lock_on_cudamalloc has no effect")));
}

TEST(ConfigCheckTest, ThresholdWarningDependsOnAFraction) {
  EXPECT_THAT(CheckAllocatorConfig("garbage_collection_threshold:0.6").warnings,
              Contains(HasSubstr("only under a per-process memory fraction")));
  EXPECT_THAT(CheckAllocatorConfig("garbage_collection_threshold:0.6,"
                                   "per_process_memory_fraction:0.9")
                  .warnings,
              Not(Contains(HasSubstr("per-process memory fraction"))));
}

TEST(ConfigCheckTest, OtherWarnings) {
  EXPECT_THAT(CheckAllocatorConfig("expandable_segments:True").warnings,
              Contains(HasSubstr("CUDA IPC")));
  EXPECT_THAT(
      CheckAllocatorConfig("backend:cudaMallocAsync,max_split_size_mb:64")
          .warnings,
      Contains(HasSubstr("backend:cudaMallocAsync ignores max_split_size_mb")));
  EXPECT_THAT(CheckAllocatorConfig("per_process_memory_fraction:0").warnings,
              Contains(HasSubstr("every allocation fails")));
  EXPECT_THAT(CheckAllocatorConfig("max_split_size_mb:64MB").warnings,
              Contains(HasSubstr("ignores 'MB'")));
  EXPECT_THAT(CheckAllocatorConfig("max_split_size_mb:64,max_split_size_mb:128")
                  .warnings,
              Contains(HasSubstr("the last one wins")));
  EXPECT_THAT(CheckAllocatorConfig("max_split_size_mb,128").warnings,
              Contains(HasSubstr("write it as \"max_split_size_mb:128\"")));
  EXPECT_THAT(CheckAllocatorConfig("max_split_size_mb:99999999999999").warnings,
              Contains(HasSubstr("clamps")));
}

TEST(ConfigCheckTest, CleanConfigHasNoWarnings) {
  EXPECT_THAT(CheckAllocatorConfig("max_split_size_mb:512,"
                                   "roundup_power2_divisions:4")
                  .warnings,
              IsEmpty());
}

}  // namespace
}  // namespace allocd
