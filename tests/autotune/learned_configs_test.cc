#include "server/autotune/learned_configs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/scoped_temp_dir.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

class LearnedConfigsTest : public ::testing::Test {
 protected:
  std::string File() const { return dir_ + "/" + LearnedConfigs::kFileName; }

  static LearnedConfig Learned(std::string config, uint64_t decision,
                               absl::Time at = absl::FromUnixSeconds(1700000000)) {
    return {.config = std::move(config),
            .from_config = "max_split_size_mb:64",
            .decision_id = decision,
            .learned_at = at,
            .predicted_peak_current = 20LL << 30,
            .predicted_peak_switched = 5LL << 30,
            .predicted_peak_allocated = 4LL << 30,
            .predicted_peak_requested = 4LL << 30,
            .realized_peak = 5LL << 30};
  }

  const ScopedTempDir tmp_{"allocd_learned_"};
  const std::string dir_ = tmp_.path();
};

TEST_F(LearnedConfigsTest, RecordsLooksUpAndForgetsOnlyTheRolledBackConfig) {
  LearnedConfigs store;
  const JobKey llama{"uid:1001", "llama"};
  EXPECT_FALSE(store.Find(llama).has_value());
  ASSERT_TRUE(store.Record(llama, Learned("expandable_segments:True", 3)).ok());
  ASSERT_TRUE(store.Find(llama).has_value());
  EXPECT_EQ(store.Find(llama)->config, "expandable_segments:True");
  EXPECT_EQ(store.Find(llama)->decision_id, 3u);
  // The same label in another tenant is another job.
  EXPECT_FALSE(store.Find({"uid:1002", "llama"}).has_value());

  // A rollback of another config (a later push) keeps what was learned.
  EXPECT_FALSE(*store.Forget(llama, "garbage_collection_threshold:0.6"));
  EXPECT_TRUE(store.Find(llama).has_value());
  EXPECT_TRUE(*store.Forget(llama, "expandable_segments:True"));
  EXPECT_FALSE(store.Find(llama).has_value());
}

TEST_F(LearnedConfigsTest, ALaterKeptConfigReplacesTheEarlierOne) {
  LearnedConfigs store;
  const JobKey key{"", "bert"};
  ASSERT_TRUE(store.Record(key, Learned("expandable_segments:True", 1)).ok());
  ASSERT_TRUE(store.Record(key, Learned("max_split_size_mb:512", 7)).ok());
  EXPECT_EQ(store.List().size(), 1u);
  EXPECT_EQ(store.Find(key)->config, "max_split_size_mb:512");
}

TEST_F(LearnedConfigsTest, BoundedTheOneLearnedLongestAgoGoes) {
  LearnedConfigs store(/*max_jobs=*/2);
  const absl::Time t = absl::FromUnixSeconds(1700000000);
  ASSERT_TRUE(store.Record({"", "b"}, Learned("expandable_segments:True", 1, t)).ok());
  ASSERT_TRUE(store.Record({"", "a"}, Learned("expandable_segments:True", 2, t + absl::Minutes(1))).ok());
  ASSERT_TRUE(store.Record({"", "c"}, Learned("expandable_segments:True", 3, t + absl::Minutes(2))).ok());
  EXPECT_FALSE(store.Find({"", "b"}).has_value());
  EXPECT_TRUE(store.Find({"", "a"}).has_value());
  EXPECT_TRUE(store.Find({"", "c"}).has_value());
}

TEST_F(LearnedConfigsTest, ASecondStoreOnTheSameDirectoryReadsWhatTheFirstLearned) {
  const JobKey llama{"uid:1001", "llama"};
  const JobKey resnet{"node", "resnet"};
  {
    auto store = LearnedConfigs::Open(dir_ + "/state");
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Record(llama, Learned("expandable_segments:True", 3)).ok());
    ASSERT_TRUE((*store)->Record(resnet, Learned("max_split_size_mb:512", 4)).ok());
    ASSERT_TRUE(*(*store)->Forget(resnet, "max_split_size_mb:512"));
    EXPECT_EQ((*store)->path(), dir_ + "/state/" + LearnedConfigs::kFileName);
  }
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Nothing half-written is left beside it.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state/" + LearnedConfigs::kFileName + ".tmp"));

  std::string warning;
  auto again = LearnedConfigs::Open(dir_ + "/state", LearnedConfigs::kDefaultMaxJobs, &warning);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(warning, "");
  ASSERT_EQ((*again)->List().size(), 1u);
  ASSERT_TRUE((*again)->Find(llama).has_value());
  EXPECT_EQ(*(*again)->Find(llama), Learned("expandable_segments:True", 3));
  EXPECT_FALSE((*again)->Find(resnet).has_value());
}

TEST_F(LearnedConfigsTest, ACorruptFileIsMovedAsideAndTheStoreStartsEmpty) {
  for (const std::string text : {"{not json", R"({"format": 1, "jobs": [{"job": "x"}]})",
                                 R"({"format": 99, "jobs": []})"}) {
    { std::ofstream(File()) << text; }
    std::string warning;
    auto store = LearnedConfigs::Open(dir_, LearnedConfigs::kDefaultMaxJobs, &warning);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->List().empty()) << text;
    EXPECT_THAT(warning, HasSubstr("starting with no learned configs")) << text;
    std::stringstream aside;
    aside << std::ifstream(File() + ".corrupt").rdbuf();
    EXPECT_EQ(aside.str(), text);
    // What it learns next is written whole again.
    ASSERT_TRUE((*store)->Record({"", "llama"}, Learned("expandable_segments:True", 1)).ok());
    auto reread = LearnedConfigs::Open(dir_);
    ASSERT_TRUE(reread.ok());
    EXPECT_EQ((*reread)->List().size(), 1u);
    std::filesystem::remove(File());
  }
}

TEST_F(LearnedConfigsTest, ADirectoryThatCannotBeCreatedOrWrittenIsAClearError) {
  { std::ofstream(dir_ + "/a_file") << "x"; }
  auto under_file = LearnedConfigs::Open(dir_ + "/a_file/state");
  ASSERT_FALSE(under_file.ok());
  EXPECT_EQ(under_file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(under_file.status().message(), HasSubstr("--state-dir"));

  if (geteuid() == 0) GTEST_SKIP() << "root writes a read-only directory anyway";
  ASSERT_EQ(chmod(dir_.c_str(), 0500), 0);
  auto read_only = LearnedConfigs::Open(dir_);
  chmod(dir_.c_str(), 0700);
  ASSERT_FALSE(read_only.ok());
  EXPECT_THAT(read_only.status().message(), HasSubstr(dir_));
}

}  // namespace
}  // namespace allocd
