#include "server/config_pusher.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPredicted[] = "allocd_config_predicted_peak_reserved_bytes";

class ConfigPusherTest : public ::testing::Test {
 protected:
  // A session of job "llama" whose client started with
  // max_split_size_mb:64, registered as DaemonCore does.
  std::shared_ptr<Session> Register(
      const std::string& current = "", uint64_t current_version = 0,
      const std::optional<ConfigPusher::Learned>& learned = std::nullopt,
      bool started_on_learned = false) {
    absl::MutexLock fanout(&pusher_.fanout_mu());
    std::shared_ptr<Session> session = sessions_.Create(
        {.job = "llama", .initial_config = "max_split_size_mb:64"});
    registered_ = pusher_.Register(*session, current, current_version, learned,
                                   started_on_learned);
    return session;
  }

  // The versions pushed to `session` so far, and whether each was a
  // rollback.
  static std::vector<std::pair<uint64_t, bool>> Pushed(Session& session) {
    std::vector<std::pair<uint64_t, bool>> pushed;
    v1::ControlMessage m;
    while (session.WaitNext(&m, absl::ZeroDuration())) {
      pushed.emplace_back(m.config().config().version(),
                          m.config().rollback());
    }
    return pushed;
  }

  // Pushes `config` to `session` as a canary: its version (0 if refused).
  uint64_t PushCanary(Session& session, const std::string& config) {
    absl::StatusOr<uint64_t> version =
        pusher_.PushToSession(session.id(), config, "test", "canary", 0);
    EXPECT_TRUE(version.ok()) << version.status();
    return version.ok() ? *version : 0;
  }

  SessionRegistry sessions_;
  Metrics metrics_;
  ConfigPusher pusher_{&sessions_, &metrics_};
  ConfigPusher::AtRegistration registered_;
};

TEST_F(ConfigPusherTest, AConfigsPredictedPeakIsKeptAndExportedForItsJob) {
  absl::StatusOr<v1::SetConfigResponse> set = pusher_.Set(
      "llama", "expandable_segments:True", "test", 4802478080);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->config().predicted_peak_reserved_bytes(), 4802478080u);
  EXPECT_EQ(pusher_.Get("llama").config().predicted_peak_reserved_bytes(),
            4802478080u);
  EXPECT_THAT(metrics_.Render(),
              HasSubstr(std::string(kPredicted) +
                        "{job=\"llama\"} 4802478080"));
  // Another job's config without a prediction exports nothing for it.
  ASSERT_TRUE(
      pusher_.Set("gpt2", "max_split_size_mb:256", "test", 0).ok());
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr("job=\"gpt2\"} ")));
}

TEST_F(ConfigPusherTest, ANewConfigWithoutAPredictionRemovesTheOldOne) {
  ASSERT_TRUE(
      pusher_.Set("llama", "expandable_segments:True", "test", 1 << 30)
          .ok());
  ASSERT_TRUE(
      pusher_.Set("llama", "max_split_size_mb:256", "test", 0).ok());
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr(std::string(kPredicted) + "{")));
}

TEST_F(ConfigPusherTest, ClearingAJobsConfigRemovesItsPrediction) {
  ASSERT_TRUE(
      pusher_.Set("llama", "expandable_segments:True", "test", 1 << 30)
          .ok());
  pusher_.Clear("llama", "test");
  EXPECT_THAT(metrics_.Render(), Not(HasSubstr(std::string(kPredicted) + "{")));
}

// A new session is pushed its job's config; one whose client declares it
// runs that config already (it reconnected) is not, and runs it under the
// version this daemon knows.
TEST_F(ConfigPusherTest,
       ARegisteringSessionIsPushedItsJobsConfigUnlessItRunsIt) {
  absl::StatusOr<v1::SetConfigResponse> set =
      pusher_.Set("llama", "expandable_segments:True", "test", 0);
  ASSERT_TRUE(set.ok()) << set.status();
  const uint64_t version = set->config().version();

  std::shared_ptr<Session> fresh = Register();
  EXPECT_EQ(registered_.running.version, 0u);
  EXPECT_EQ(registered_.config->version, version);
  EXPECT_EQ(Pushed(*fresh),
            (std::vector<std::pair<uint64_t, bool>>{{version, false}}));

  std::shared_ptr<Session> back = Register("expandable_segments:True", version);
  EXPECT_EQ(registered_.running.version, version);
  EXPECT_EQ(back->Current().version, version);
  EXPECT_TRUE(Pushed(*back).empty());
  // Declared under a version this daemon never set (it restarted): adopted
  // as a new one, with its config.
  std::shared_ptr<Session> restarted =
      Register("expandable_segments:True", version + 100);
  EXPECT_GT(registered_.running.version, version);
  EXPECT_EQ(registered_.running.config, "expandable_segments:True");
  EXPECT_TRUE(Pushed(*restarted).empty());
}

// An admin's config for a label reaches the job in every tenant; one for
// "LABEL@TENANT" reaches that tenant's sessions alone and wins over the
// label's there, and removing it gives them the label's again.
TEST_F(ConfigPusherTest, AJobsConfigForOneTenantReachesThatTenantAlone) {
  auto session_of = [&](const TenantId& tenant) {
    absl::MutexLock fanout(&pusher_.fanout_mu());
    std::shared_ptr<Session> s =
        sessions_.Create({.tenant = tenant, .job = "llama"});
    registered_ = pusher_.Register(*s, "", 0);
    return s;
  };
  std::shared_ptr<Session> a = session_of("uid:1001");
  std::shared_ptr<Session> b = session_of("uid:1002");

  absl::StatusOr<v1::SetConfigResponse> for_a =
      pusher_.Set("llama@uid:1001", "expandable_segments:True", "an admin", 0);
  ASSERT_TRUE(for_a.ok()) << for_a.status();
  EXPECT_EQ(for_a->pushed_to(), 1u);
  EXPECT_EQ(Pushed(*a), (std::vector<std::pair<uint64_t, bool>>{
                            {for_a->config().version(), false}}));
  EXPECT_TRUE(Pushed(*b).empty());

  // The label's config reaches the tenants without their own.
  absl::StatusOr<v1::SetConfigResponse> every =
      pusher_.Set("llama", "max_split_size_mb:256", "an admin", 0);
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_EQ(every->pushed_to(), 1u);
  EXPECT_TRUE(Pushed(*a).empty());
  EXPECT_EQ(Pushed(*b).size(), 1u);
  EXPECT_EQ(pusher_.Get("llama@uid:1001").config().config(),
            "expandable_segments:True");
  EXPECT_EQ(pusher_.Get("llama@uid:1002").config().config(),
            "max_split_size_mb:256");
  EXPECT_EQ(pusher_.Get("llama").config().config(), "max_split_size_mb:256");

  // A new session of tenant A registers onto its tenant's config.
  std::shared_ptr<Session> a2 = session_of("uid:1001");
  EXPECT_EQ(registered_.config->config, "expandable_segments:True");
  EXPECT_TRUE(pusher_.HasOwnConfig("llama", "uid:1001"));
  EXPECT_TRUE(pusher_.HasOwnConfig("llama", "uid:1003"));  // the label's
  EXPECT_FALSE(pusher_.HasOwnConfig("bert", "uid:1001"));

  // Clearing the label's config leaves tenant A, which has its own, alone.
  ASSERT_TRUE(pusher_.Set("", "garbage_collection_threshold:0.6", "an admin", 0).ok());
  Pushed(*a);
  Pushed(*b);
  pusher_.Clear("llama", "an admin");
  EXPECT_TRUE(Pushed(*a).empty());
  EXPECT_EQ(Pushed(*b).size(), 1u);
  ASSERT_TRUE(pusher_.Set("llama", "max_split_size_mb:256", "an admin", 0).ok());
  Pushed(*b);

  pusher_.Clear("llama@uid:1001", "an admin");
  EXPECT_EQ(Pushed(*a).size(), 1u);
  EXPECT_EQ(pusher_.Get("llama@uid:1001").config().config(),
            "max_split_size_mb:256");
  EXPECT_TRUE(Pushed(*b).empty());

  // Keys that name no tenant's job are refused.
  for (const char* bad : {"@uid:1001", "llama@", "llama@uid 1001",
                          "llama@uid:1001@x"}) {
    EXPECT_EQ(pusher_.Set(bad, "expandable_segments:True", "an admin", 0)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// A job's learned config is handed at registration over the node default,
// as a version of its own; a config set for the job wins over it, and a
// session that runs it already is not pushed it again.
TEST_F(ConfigPusherTest, ALearnedConfigIsHandedUnlessTheJobHasItsOwn) {
  const ConfigPusher::Learned learned{.config = "expandable_segments:True",
                                      .author = "autotune decision 3"};
  ASSERT_TRUE(pusher_.Set("", "max_split_size_mb:256", "test", 0).ok());

  std::shared_ptr<Session> first = Register("", 0, learned);
  ASSERT_TRUE(registered_.learned.has_value());
  const uint64_t version = registered_.learned->version;
  EXPECT_EQ(registered_.learned->config, "expandable_segments:True");
  EXPECT_EQ(registered_.config->version, version);
  EXPECT_EQ(Pushed(*first),
            (std::vector<std::pair<uint64_t, bool>>{{version, false}}));
  ASSERT_TRUE(pusher_.store().Find(version).has_value());
  EXPECT_EQ(pusher_.store().Find(version)->author, "autotune decision 3");
  EXPECT_EQ(pusher_.History("llama", 1).entries(0).event(), "learned");
  // The learned config is no job config: the job's effective one is still
  // the default.
  EXPECT_EQ(pusher_.Get("llama").config().config(), "max_split_size_mb:256");

  std::shared_ptr<Session> back =
      Register("expandable_segments:True", version, learned);
  EXPECT_EQ(registered_.learned->version, version);
  EXPECT_TRUE(Pushed(*back).empty());

  absl::StatusOr<v1::SetConfigResponse> own =
      pusher_.Set("llama", "garbage_collection_threshold:0.6", "an admin", 0);
  ASSERT_TRUE(own.ok()) << own.status();
  std::shared_ptr<Session> admin_set = Register("", 0, learned);
  EXPECT_FALSE(registered_.learned.has_value());
  EXPECT_EQ(Pushed(*admin_set), (std::vector<std::pair<uint64_t, bool>>{
                                    {own->config().version(), false}}));
}

// A client that started on the learned config (allocd run asked before
// the job allocated) runs its version with nothing pushed, and a rollback
// returns to its initial config, the job's own. One that started on a
// learned config the daemon no longer hands runs it as adopted, and the
// job's config is pushed over it.
TEST_F(ConfigPusherTest, AClientStartedOnTheLearnedConfigRunsItsVersionAndRollsBackToItsOwn) {
  const ConfigPusher::Learned learned{.config = "expandable_segments:True",
                                      .author = "autotune decision 3"};
  std::shared_ptr<Session> started =
      Register("expandable_segments:True", 0, learned, /*started_on_learned=*/true);
  ASSERT_TRUE(registered_.learned.has_value());
  EXPECT_EQ(registered_.running.version, registered_.learned->version);
  EXPECT_NE(registered_.running.version, 0u);
  EXPECT_EQ(started->Current().config, "expandable_segments:True");
  EXPECT_TRUE(Pushed(*started).empty());
  EXPECT_EQ(pusher_.History("llama", 1).entries(0).event(), "learned");
  EXPECT_TRUE(pusher_.RollBackAfterOom(*started, 1 << 20));
  EXPECT_EQ(Pushed(*started), (std::vector<std::pair<uint64_t, bool>>{{0, true}}));
  EXPECT_EQ(started->identity().initial_config, "max_split_size_mb:64");

  ASSERT_TRUE(pusher_.Set("", "max_split_size_mb:256", "test", 0).ok());
  std::shared_ptr<Session> stale = Register("expandable_segments:True", 0,
                                            std::nullopt, /*started_on_learned=*/true);
  EXPECT_FALSE(registered_.learned.has_value());
  EXPECT_NE(registered_.running.version, 0u);
  EXPECT_EQ(registered_.running.config, "expandable_segments:True");
  ASSERT_TRUE(registered_.config.has_value());
  EXPECT_EQ(Pushed(*stale), (std::vector<std::pair<uint64_t, bool>>{
                                {registered_.config->version, false}}));
}

// An OOM under a pushed version rolls back to the config before, once; an
// OOM after the daemon refused the session memory does not.
TEST_F(ConfigPusherTest, AnOomRollsBackOnceUnlessTheDaemonRefusedMemory) {
  std::shared_ptr<Session> session = Register();
  const uint64_t canary = PushCanary(*session, "expandable_segments:True");
  v1::ConfigAck ack;
  ack.set_session_id(session->id());
  ack.set_version(canary);
  ack.set_applied(true);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  EXPECT_EQ(session->Current().version, canary);
  Pushed(*session);

  session->NoteAcquireRefused();
  EXPECT_FALSE(pusher_.RollBackAfterOom(*session, 1 << 20));
  EXPECT_TRUE(pusher_.RollBackAfterOom(*session, 1 << 20));
  EXPECT_FALSE(pusher_.RollBackAfterOom(*session, 1 << 20));
  EXPECT_EQ(Pushed(*session),
            (std::vector<std::pair<uint64_t, bool>>{{0, true}}));
}

TEST_F(ConfigPusherTest, AnAckOfAnUnknownVersionOrAnOverlongNackIsRefused) {
  std::shared_ptr<Session> session = Register();
  v1::ConfigAck ack;
  ack.set_session_id(session->id());
  ack.set_version(12345);
  EXPECT_TRUE(absl::IsInvalidArgument(pusher_.Ack(*session, ack)));
  ack.set_version(0);
  ack.set_error(std::string(4097, 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(pusher_.Ack(*session, ack)));
  ack.set_error("PyTorch said no");
  EXPECT_TRUE(pusher_.Ack(*session, ack).ok());
  EXPECT_EQ(pusher_.History("llama", 0).entries(0).event(), "nack");
}

// The core rolls a canary back on its OOM, and the autotuner asks the same
// when its task runs: after the client ACKed the first, the second pushes
// nothing (under ASan the worker came after the ACK, and pushed it twice).
// A session with a push unanswered is still rolled back.
TEST_F(ConfigPusherTest, ARollbackToWhatTheSessionRunsWithNothingInFlightPushesNothing) {
  std::shared_ptr<Session> session = Register();
  const uint64_t canary = PushCanary(*session, "expandable_segments:True");
  v1::ConfigAck ack;
  ack.set_session_id(session->id());
  ack.set_applied(true);
  ack.set_version(canary);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  Pushed(*session);
  ASSERT_TRUE(pusher_.RollBackAfterOom(*session, 1 << 20));
  ack.set_version(0);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  EXPECT_EQ(Pushed(*session), (std::vector<std::pair<uint64_t, bool>>{{0, true}}));
  ASSERT_TRUE(pusher_.RollBackSession(session->id(), "max_split_size_mb:64", "autotune").ok());
  EXPECT_TRUE(Pushed(*session).empty());

  PushCanary(*session, "expandable_segments:True");
  Pushed(*session);
  ASSERT_TRUE(pusher_.RollBackSession(session->id(), "max_split_size_mb:64", "autotune").ok());
  const std::vector<std::pair<uint64_t, bool>> rolled = Pushed(*session);
  ASSERT_EQ(rolled.size(), 1u);
  EXPECT_TRUE(rolled[0].second);
}

// A session answers the versions pushed to it (and those it ran), not
// another job's: acking every stored version would keep them all from
// being pruned, and grow what the session remembers.
TEST_F(ConfigPusherTest, ASessionAnswersOnlyWhatWasPushedToIt) {
  std::shared_ptr<Session> session = Register();
  absl::StatusOr<v1::SetConfigResponse> other =
      pusher_.Set("other-job", "expandable_segments:True", "test", 0);
  ASSERT_TRUE(other.ok()) << other.status();
  v1::ConfigAck ack;
  ack.set_session_id(session->id());
  ack.set_applied(true);
  ack.set_version(other->config().version());
  EXPECT_TRUE(absl::IsInvalidArgument(pusher_.Ack(*session, ack)));
  EXPECT_EQ(session->AppliedVersions(), std::vector<uint64_t>{0});

  const uint64_t canary = PushCanary(*session, "expandable_segments:True");
  ack.set_version(canary);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());  // again: it runs it
  EXPECT_EQ(session->AppliedVersions(), (std::vector<uint64_t>{0, canary}));
  // Its initial config too (what a rollback returns to).
  ack.set_version(0);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  // A NACKed push is answered: not again.
  const uint64_t refused = PushCanary(*session, "max_split_size_mb:128");
  ack.set_version(refused);
  ack.set_applied(false);
  ASSERT_TRUE(pusher_.Ack(*session, ack).ok());
  ack.set_applied(true);
  EXPECT_TRUE(absl::IsInvalidArgument(pusher_.Ack(*session, ack)));
}

}  // namespace
}  // namespace allocd
