// DaemonAutotune's learned configs through a DaemonCore, wired as the daemon
// wires them: a push the autotuner kept for a job is learned for the job's
// tenant and label, and a session of the job's next run (here: on a daemon
// started again on the same store) is handed it at registration.
#include "server/daemon_autotune.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/autotune/learned_configs.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr char kLearned[] = "expandable_segments:True";

// One daemon's parts over a learned-configs store that outlives it.
struct TestDaemon {
  explicit TestDaemon(LearnedConfigs* learned)
      : autotune({.default_policy = {.mode = AutotuneMode::kApply}}, &core,
                 &metrics, learned) {
    core.SetObserver(&autotune);
  }
  ~TestDaemon() { core.SetObserver(nullptr); }

  struct Registered {
    SessionId id = 0;
    // The configs pushed to it at registration, with each push's reason.
    std::vector<std::pair<std::string, std::string>> pushed;
  };
  Registered Register(uid_t uid, const std::string& job) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job(job);
    r.set_initial_config("max_split_size_mb:64");
    const PeerCredentials peer{.pid = 4242, .uid = uid, .gid = uid};
    absl::StatusOr<v1::RegisterResponse> response = core.Register(peer, r);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    Registered out{.id = response->session_id()};
    absl::StatusOr<std::shared_ptr<Session>> session =
        core.Watch(peer, out.id, response->session_secret());
    EXPECT_TRUE(session.ok()) << session.status();
    v1::ControlMessage m;
    while (session.ok() && (*session)->WaitNext(&m, absl::ZeroDuration())) {
      out.pushed.emplace_back(m.config().config().config(), m.config().reason());
    }
    return out;
  }

  // What the autotuner reports once the canary's watch passed: the push
  // set as the job's config (as DaemonAutotune::SetJobConfig does), its
  // decision under that version.
  AutotuneDecision Kept(SessionId canary, const std::string& job) {
    absl::StatusOr<v1::SetConfigResponse> set =
        core.SetConfig(job, kLearned, "autotune: decision 7", 5LL << 30, true);
    EXPECT_TRUE(set.ok()) << set.status();
    AutotuneDecision d = Pushed(canary, job);
    d.version = set.ok() ? set->config().version() : 0;
    return d;
  }

  static AutotuneDecision Pushed(SessionId canary, const std::string& job) {
    return {.id = 7,
            .job = job,
            .trigger = "bad_start_config",
            .result = "pushed",
            .from_config = "max_split_size_mb:64",
            .to_config = kLearned,
            .predicted_peak_current = 20LL << 30,
            .predicted_peak_switched = 5LL << 30,
            .sessions = {canary}};
  }

  MemfdChunkSource source;
  NodePool pool{&source, uint64_t{1} << 30};
  Metrics metrics;
  DaemonCore core{{}, &pool, &metrics};
  DaemonAutotune autotune;
};

TEST(DaemonAutotuneLearnedTest, AKeptPushIsHandedToTheNextRunOfTheSameTenantsJobOnly) {
  LearnedConfigs learned;
  {
    TestDaemon first(&learned);
    const SessionId canary = first.Register(1001, "llama").id;
    // Pushed to the canary only: not learned yet.
    AutotuneDecision canary_only = TestDaemon::Pushed(canary, "llama");
    absl::StatusOr<uint64_t> version =
        first.core.PushToSession(canary, kLearned, "autotune", "canary", 0);
    ASSERT_TRUE(version.ok());
    canary_only.version = *version;
    first.autotune.OnDecision(canary_only);
    EXPECT_TRUE(learned.List().empty());

    first.autotune.OnDecision(first.Kept(canary, "llama"));
    ASSERT_TRUE(learned.Find({"uid:1001", "llama"}).has_value());
    EXPECT_EQ(learned.Find({"uid:1001", "llama"})->config, kLearned);
    EXPECT_EQ(learned.Find({"uid:1001", "llama"})->decision_id, 7u);
  }

  TestDaemon next(&learned);
  const TestDaemon::Registered again = next.Register(1001, "llama");
  ASSERT_EQ(again.pushed.size(), 1u);
  EXPECT_EQ(again.pushed[0].first, kLearned);
  EXPECT_THAT(again.pushed[0].second, HasSubstr("learned"));
  const v1::HistoryResponse history = next.core.History("llama", 10);
  ASSERT_GT(history.entries_size(), 0);
  bool recorded = false;
  for (const v1::HistoryEntry& e : history.entries()) {
    recorded |= e.event() == "learned" && e.config() == kLearned;
  }
  EXPECT_TRUE(recorded);

  // Another tenant's job of the same label, and another job, learned nothing.
  EXPECT_TRUE(next.Register(1002, "llama").pushed.empty());
  EXPECT_TRUE(next.Register(1001, "bert").pushed.empty());

  const v1::AutotuneLearnedResponse listed = next.autotune.Learned();
  ASSERT_EQ(listed.learned_size(), 1);
  EXPECT_EQ(listed.learned(0).tenant(), "uid:1001");
  EXPECT_EQ(listed.learned(0).job(), "llama");
  EXPECT_EQ(listed.learned(0).config(), kLearned);
  EXPECT_EQ(listed.learned(0).from_config(), "max_split_size_mb:64");
  EXPECT_EQ(listed.state_file(), "");
}

TEST(DaemonAutotuneLearnedTest, AnAdminsConfigForTheJobWinsAndAJobNotInApplyGetsNone) {
  LearnedConfigs learned;
  ASSERT_TRUE(learned.Record({"uid:1001", "llama"}, {.config = kLearned, .decision_id = 3}).ok());
  TestDaemon daemon(&learned);
  ASSERT_TRUE(daemon.autotune.SetMode("llama", "recommend").ok());
  EXPECT_TRUE(daemon.Register(1001, "llama").pushed.empty());

  ASSERT_TRUE(daemon.autotune.SetMode("llama", "apply").ok());
  ASSERT_TRUE(daemon.core.SetConfig("llama", "garbage_collection_threshold:0.6",
                                    "uid 0 via allocctl").ok());
  const TestDaemon::Registered registered = daemon.Register(1001, "llama");
  ASSERT_EQ(registered.pushed.size(), 1u);
  EXPECT_EQ(registered.pushed[0].first, "garbage_collection_threshold:0.6");
}

TEST(DaemonAutotuneLearnedTest, ARollbackOfTheLearnedConfigForgetsIt) {
  LearnedConfigs learned;
  ASSERT_TRUE(learned.Record({"uid:1001", "llama"}, {.config = kLearned, .decision_id = 3}).ok());
  TestDaemon daemon(&learned);
  const TestDaemon::Registered handed = daemon.Register(1001, "llama");
  ASSERT_EQ(handed.pushed.size(), 1u);

  // A rollback of another config leaves it; of the learned one forgets it.
  AutotuneDecision other = TestDaemon::Pushed(handed.id, "llama");
  other.id = 1;
  other.to_config = "max_split_size_mb:512";
  other.result = "rolled_back";
  daemon.autotune.OnDecision(other);
  EXPECT_TRUE(learned.Find({"uid:1001", "llama"}).has_value());
  AutotuneDecision undone = TestDaemon::Pushed(handed.id, "llama");
  undone.id = 2;
  undone.result = "rolled_back";
  daemon.autotune.OnDecision(undone);
  EXPECT_FALSE(learned.Find({"uid:1001", "llama"}).has_value());
  EXPECT_TRUE(daemon.Register(1001, "llama").pushed.empty());
}

}  // namespace
}  // namespace allocd
