#include "server/config_watcher.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"
#include "tests/scoped_temp_dir.h"

namespace allocd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ConfigWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/config.json";
  }
  void Write(const std::string& text) {
    // Like the kubelet: a new file renamed over the old one.
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << text;
    std::rename(tmp.c_str(), path_.c_str());
  }
  std::string Effective(const std::string& job) {
    return core_.GetConfig(job).config().config();
  }
  // A session of `job` in this process, registered as the core would.
  std::shared_ptr<Session> Register(const std::string& job) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job(job);
    absl::StatusOr<v1::RegisterResponse> response =
        core_.Register({.pid = getpid(), .uid = getuid()}, r);
    EXPECT_TRUE(response.ok());
    return *core_.Watch({.pid = getpid(), .uid = getuid()},
                        response->session_id(), response->session_secret());
  }

  ScopedTempDir dir_{"allocd_watch_"};
  std::string path_;
  MemfdChunkSource source_;
  NodePool pool_{&source_, uint64_t{1} << 30};
  Metrics metrics_;
  DaemonCore core_{{}, &pool_, &metrics_};
};

TEST_F(ConfigWatcherTest, AppliesChangesAndKeepsTheLastGoodFileOnErrors) {
  Write(R"({"default": "expandable_segments:True",
            "jobs": {"llama": "max_split_size_mb:256"},
            "uid_quotas": {"1000": "1GiB"}})");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EXPECT_EQ(Effective("llama"), "max_split_size_mb:256");
  EXPECT_EQ(Effective("other"), "expandable_segments:True");
  std::shared_ptr<Session> llama = Register("llama");
  v1::ControlMessage m;
  ASSERT_TRUE(llama->WaitNext(&m, absl::ZeroDuration()));  // at registration

  // A bad entry: nothing changes, the error names it.
  Write(R"({"jobs": {"llama": "max_split_size_mb:1"}})");
  absl::Status bad = (*watcher)->Reload();
  EXPECT_THAT(bad.message(), HasSubstr("jobs.llama"));
  EXPECT_EQ(Effective("llama"), "max_split_size_mb:256");
  EXPECT_FALSE(llama->WaitNext(&m, absl::ZeroDuration()));
  EXPECT_THAT(metrics_.Render(), HasSubstr("allocd_config_reload_errors_total 1"));

  // The job's entry changes: its sessions get the new config.
  Write(R"({"default": "expandable_segments:True",
            "jobs": {"llama": "garbage_collection_threshold:0.6"}})");
  ASSERT_TRUE((*watcher)->Reload().ok());
  EXPECT_EQ(Effective("llama"), "garbage_collection_threshold:0.6");
  ASSERT_TRUE(llama->WaitNext(&m, absl::ZeroDuration()));
  EXPECT_EQ(m.config().config().config(), "garbage_collection_threshold:0.6");

  // Its entry is removed: back to the default, pushed.
  Write(R"({"default": "expandable_segments:True"})");
  ASSERT_TRUE((*watcher)->Reload().ok());
  EXPECT_EQ(Effective("llama"), "expandable_segments:True");
  ASSERT_TRUE(llama->WaitNext(&m, absl::ZeroDuration()));
  EXPECT_EQ(m.config().config().config(), "expandable_segments:True");
  // The same content again is not a change.
  ASSERT_TRUE((*watcher)->Reload().ok());
  EXPECT_FALSE(llama->WaitNext(&m, absl::ZeroDuration()));
  EXPECT_THAT(metrics_.Render(), HasSubstr("allocd_config_reloads_total 3"));
}

TEST_F(ConfigWatcherTest, UidQuotasAreReplaced) {
  Write(R"({"uid_quotas": {"4242": "4MiB"}})");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE(pool_.AddSession(100, 4242, 1, "node").ok());
  EXPECT_FALSE(pool_.Acquire(100, 6 << 20).ok());
  Write(R"({})");
  ASSERT_TRUE((*watcher)->Reload().ok());
  EXPECT_TRUE(pool_.Acquire(100, 6 << 20).ok());
}

TEST_F(ConfigWatcherTest, TenantQuotasAreReplaced) {
  Write(R"({"tenant_quotas": {"uid:1001": "4MiB"}})");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  ASSERT_TRUE(pool_.AddSession(100, 4242, 1, "uid:1001").ok());
  ASSERT_TRUE(pool_.AddSession(101, 4242, 2, "uid:1002").ok());
  EXPECT_THAT(pool_.Acquire(100, 6 << 20).status().message(),
              HasSubstr("tenant uid:1001 quota exceeded"));
  EXPECT_TRUE(pool_.Acquire(101, 6 << 20).ok());
  Write(R"({"tenant_quotas": {"uid:1002": "4MiB"}})");
  ASSERT_TRUE((*watcher)->Reload().ok());
  EXPECT_TRUE(pool_.Acquire(100, 6 << 20).ok());
  EXPECT_FALSE(pool_.Acquire(101, 2 << 20).ok());
}

// Under the daemon's --tenancy (uid here) no peer is "pod:a": a quota for
// it would bind nobody, and the file is refused (issue 41).
TEST_F(ConfigWatcherTest, ATenantQuotaNoPeerCanHaveIsAStartError) {
  Write(R"({"tenant_quotas": {"pod:a": "4MiB"}})");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  ASSERT_FALSE(watcher.ok());
  EXPECT_THAT(watcher.status().message(),
              AllOf(HasSubstr("tenant_quotas.pod:a"), HasSubstr("--tenancy uid")));
}

TEST_F(ConfigWatcherTest, ABadFileAtStartIsAStartError) {
  Write("{ not json");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  EXPECT_FALSE(watcher.ok());
  EXPECT_THAT(watcher.status().message(), HasSubstr(path_));
  // There is no last good file to keep: the daemon cannot start with it.
  EXPECT_THAT(watcher.status().message(), HasSubstr("cannot start with --config"));
  EXPECT_THAT(watcher.status().message(), Not(HasSubstr("last good")));
}

TEST_F(ConfigWatcherTest, AQuotaInPercentIsOfThePool) {
  Write(R"({"uid_quotas": {"4242": "25%"}})");
  absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
      ConfigWatcher::Start(path_, absl::Hours(1), &core_, nullptr, &metrics_);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  ASSERT_TRUE(pool_.AddSession(100, 4242, 1, "node").ok());
  // 25% of the 1 GiB pool.
  EXPECT_TRUE(pool_.Acquire(100, 256 << 20).ok());
  EXPECT_FALSE(pool_.Acquire(100, 2 << 20).ok());
}

}  // namespace
}  // namespace allocd
