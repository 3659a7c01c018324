#include "server/daemon_core.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPredicted[] = "allocd_config_predicted_peak_reserved_bytes";

class DaemonCoreTest : public ::testing::Test {
 protected:
  MemfdChunkSource source_;
  NodePool pool_{&source_, uint64_t{1} << 30};
  Metrics metrics_;
  DaemonCore core_{{}, &pool_, &metrics_};
};

TEST_F(DaemonCoreTest, AConfigsPredictedPeakIsKeptAndExportedForItsJob) {
  absl::StatusOr<v1::SetConfigResponse> set =
      core_.SetConfig("llama", "expandable_segments:True", "test", 4802478080);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->config().predicted_peak_reserved_bytes(), 4802478080u);
  EXPECT_EQ(core_.GetConfig("llama").config().predicted_peak_reserved_bytes(),
            4802478080u);
  EXPECT_THAT(metrics_.Render(),
              HasSubstr(std::string(kPredicted) +
                        "{job=\"llama\"} 4802478080"));
  // Another job's config without a prediction exports nothing for it.
  ASSERT_TRUE(core_.SetConfig("gpt2", "max_split_size_mb:256", "test").ok());
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr("job=\"gpt2\"} ")));
}

TEST_F(DaemonCoreTest, ANewConfigWithoutAPredictionRemovesTheOldOne) {
  ASSERT_TRUE(
      core_.SetConfig("llama", "expandable_segments:True", "test", 1 << 30)
          .ok());
  ASSERT_TRUE(core_.SetConfig("llama", "max_split_size_mb:256", "test").ok());
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr(std::string(kPredicted) + "{")));
}

TEST_F(DaemonCoreTest, ClearingAJobsConfigRemovesItsPrediction) {
  ASSERT_TRUE(
      core_.SetConfig("llama", "expandable_segments:True", "test", 1 << 30)
          .ok());
  core_.ClearConfig("llama", "test");
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr(std::string(kPredicted) + "{")));
}

}  // namespace
}  // namespace allocd
