#include "server/autotune/compatibility.h"

#include <string>

#include "gtest/gtest.h"

namespace allocd {
namespace {

AllocatorConfig Config(const std::string& conf) {
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(conf);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : AllocatorConfig{};
}

JobFeatures Ipc() {
  JobFeatures f;
  f.cuda_ipc = true;
  return f;
}

JobFeatures Nccl() {
  JobFeatures f;
  f.nccl_registration = true;
  return f;
}

TEST(ConfigIncompatibilityTest, AJobThatSharesCudaTensorsNeverTurnsOnExpandableSegments) {
  const AllocatorConfig off = Config("max_split_size_mb:64");
  const AllocatorConfig on = Config("expandable_segments:True");
  for (bool live : {true, false}) {
    const std::optional<std::string> why = ConfigIncompatibility(Ipc(), off, on, live);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("pidfd_getfd"), std::string::npos) << *why;
    EXPECT_NE(why->find("another uid"), std::string::npos) << *why;
  }
  // Already on: its consumers open what it shares now; a push changes nothing.
  EXPECT_EQ(ConfigIncompatibility(Ipc(), on, Config("expandable_segments:True,"
                                                    "roundup_power2_divisions:4"),
                                  true),
            std::nullopt);
  // Off is PyTorch's own advice for shared tensors.
  EXPECT_EQ(ConfigIncompatibility(Ipc(), on, off, true), std::nullopt);
  // The keys that only cut blocks differently are safe.
  EXPECT_EQ(ConfigIncompatibility(Ipc(), off,
                                  Config("max_split_size_mb:512,roundup_power2_divisions:8,"
                                         "max_non_split_rounding_mb:256,"
                                         "garbage_collection_threshold:0.6"),
                                  true),
            std::nullopt);
}

TEST(ConfigIncompatibilityTest, NcclRegistrationRefusesExpandableSegmentsOnlyLive) {
  const AllocatorConfig off;
  const AllocatorConfig on = Config("expandable_segments:True");
  const std::optional<std::string> why = ConfigIncompatibility(Nccl(), off, on, true);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("NCCL"), std::string::npos) << *why;
  // A process that starts on it: PyTorch turns the registration off itself.
  EXPECT_EQ(ConfigIncompatibility(Nccl(), off, on, false), std::nullopt);
  EXPECT_EQ(ConfigIncompatibility(Nccl(), on, off, true), std::nullopt);
}

TEST(ConfigIncompatibilityTest, GraphsAndPoolsRefuseNoConfig) {
  JobFeatures f;
  f.cuda_graphs = true;
  f.mem_pool = true;
  EXPECT_EQ(ConfigIncompatibility(f, Config("max_split_size_mb:64"),
                                  Config("expandable_segments:True,max_split_size_mb:256"), true),
            std::nullopt);
}

TEST(ConfigIncompatibilityTest, AJobWithoutFeaturesTakesAnyConfig) {
  EXPECT_EQ(ConfigIncompatibility(JobFeatures{}, AllocatorConfig{},
                                  Config("expandable_segments:True"), true),
            std::nullopt);
}

TEST(JobFeaturesTest, FeaturesOnlyAccumulateAndAreNamed) {
  JobFeatures f;
  EXPECT_FALSE(f.any());
  EXPECT_EQ(FeatureNames(f), "");
  f |= Ipc();
  f |= Nccl();
  f |= JobFeatures{};
  EXPECT_TRUE(f.cuda_ipc);
  EXPECT_TRUE(f.nccl_registration);
  EXPECT_FALSE(f.cuda_graphs);
  EXPECT_EQ(FeatureNames(f), "cuda_ipc,nccl_registration");
}

}  // namespace
}  // namespace allocd
