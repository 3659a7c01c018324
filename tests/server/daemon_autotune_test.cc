// DaemonAutotune's learned configs through a DaemonCore, wired as the daemon
// wires them: a push the autotuner kept for a job is learned for the job's
// tenant and label, and a session of the job's next run (here: on a daemon
// started again on the same store) is handed it at registration.
#include "server/daemon_autotune.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/trace/snapshot_reader.h"
#include "proto/protocol.h"
#include "server/autotune/learned_configs.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kLearned[] = "expandable_segments:True";

// One daemon's parts over a learned-configs store that outlives it.
struct TestDaemon {
  explicit TestDaemon(LearnedConfigs* learned,
                      AutotuneMode default_mode = AutotuneMode::kApply,
                      PriorSetting prior = {.kind = PriorSetting::Kind::kOff})
      : autotune({.default_policy = {.mode = default_mode}, .prior = prior}, &core,
                 &metrics, learned) {
    core.SetObserver(&autotune);
  }
  ~TestDaemon() { core.SetObserver(nullptr); }

  struct Registered {
    SessionId id = 0;
    std::string secret;
    // The configs pushed to it at registration, with each push's reason.
    std::vector<std::pair<std::string, std::string>> pushed;
    uint64_t stream_from_reserved = 0;  // as the response said
    std::string start_config_source;
    // What the daemon said it reads of its stream (StreamDemand), as it
    // registered.
    std::vector<uint64_t> demands;
  };
  // `mode`: the autotune mode the job asks for ("": none); `rank`: its
  // place in a job of several.
  Registered Register(uid_t uid, const std::string& job,
                      const std::string& mode = "", const v1::JobRank& rank = {},
                      const std::string& initial_config = "max_split_size_mb:64") {
    v1::RegisterRequest r;
    r.set_job(job);
    *r.mutable_rank() = rank;
    r.mutable_autotune()->set_mode(mode);
    r.set_initial_config(initial_config);
    return Register(uid, std::move(r));
  }
  // `r` as it stands (its features, say), from a process of `uid`.
  Registered Register(uid_t uid, v1::RegisterRequest r) {
    r.set_protocol_version(1);
    const PeerCredentials peer{.pid = 4242, .uid = uid, .gid = uid};
    absl::StatusOr<v1::RegisterResponse> response = core.Register(peer, r);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    Registered out{.id = response->session_id(),
                   .secret = response->session_secret(),
                   .stream_from_reserved = response->stream_from_reserved(),
                   .start_config_source = response->start_config_source()};
    absl::StatusOr<std::shared_ptr<Session>> session =
        core.Watch(peer, out.id, response->session_secret());
    EXPECT_TRUE(session.ok()) << session.status();
    v1::ControlMessage m;
    while (session.ok() && (*session)->WaitNext(&m, absl::ZeroDuration())) {
      if (m.has_config()) out.pushed.emplace_back(m.config().config().config(), m.config().reason());
      if (m.has_stream()) out.demands.push_back(m.stream().from_reserved());
    }
    return out;
  }

  // What the autotuner reports once the canary's watch passed: the push
  // set as uid 1001's job's config, its decision under that version.
  AutotuneDecision Kept(SessionId canary, const std::string& job) {
    absl::StatusOr<uint64_t> set = autotune.SetJobConfig(
        {"uid:1001", job}, kLearned, "decision 7", 5LL << 30);
    EXPECT_TRUE(set.ok()) << set.status();
    AutotuneDecision d = Pushed(canary, job);
    d.version = set.value_or(0);
    d.realized_peak = 6LL << 30;
    return d;
  }

  // The mode of `tenant`'s job `job` in the autotuner's status.
  std::string ModeOf(const TenantId& tenant, const std::string& job) const {
    const v1::AutotuneStatusResponse status = autotune.Status();
    for (const v1::AutotuneJob& j : status.jobs()) {
      if (j.tenant() == tenant && j.job() == job) return j.mode();
    }
    return "(no such job)";
  }

  // The control messages waiting for session `id`.
  std::vector<v1::ControlMessage> Messages(uid_t uid, SessionId id,
                                           const std::string& secret) {
    std::vector<v1::ControlMessage> out;
    const PeerCredentials peer{.pid = 4242, .uid = uid, .gid = uid};
    absl::StatusOr<std::shared_ptr<Session>> session = core.Watch(peer, id, secret);
    EXPECT_TRUE(session.ok()) << session.status();
    v1::ControlMessage m;
    while (session.ok() && (*session)->WaitNext(&m, absl::ZeroDuration())) {
      out.push_back(m);
    }
    return out;
  }
  // The configs pushed to session `id` and waiting.
  std::vector<std::string> Pending(uid_t uid, SessionId id,
                                   const std::string& secret) {
    std::vector<std::string> out;
    for (const v1::ControlMessage& m : Messages(uid, id, secret)) {
      if (m.has_config()) out.push_back(m.config().config().config());
    }
    return out;
  }
  // The StreamDemands waiting for session `id`: each one's from_reserved.
  std::vector<uint64_t> Demands(uid_t uid, SessionId id, const std::string& secret) {
    std::vector<uint64_t> out;
    for (const v1::ControlMessage& m : Messages(uid, id, secret)) {
      if (m.has_stream()) out.push_back(m.stream().from_reserved());
    }
    return out;
  }

  // A decision of uid 1001's job pushed to `canary`, checked as the job's
  // next runs would start on it (learned: the push itself).
  static AutotuneDecision Pushed(SessionId canary, const std::string& job) {
    return {.id = 7,
            .job = job,
            .tenant = "uid:1001",
            .trigger = AutotuneTrigger::kBadStartConfig,
            .result = AutotuneResult::kPushed,
            .from_config = "max_split_size_mb:64",
            .to_config = kLearned,
            .predicted_peak_current = 20LL << 30,
            .predicted_peak_switched = 5LL << 30,
            .sessions = {canary},
            .decided_on = canary,
            .learned = LearnedFromPush{.config = kLearned}};
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
    // Set for the job, but not yet checked as its next runs would start on
    // it: not learned yet either.
    AutotuneDecision unchecked = first.Kept(canary, "llama");
    unchecked.learned.reset();
    first.autotune.OnDecision(unchecked);
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
  // What the run can expect of it: what the job reached under it then.
  EXPECT_THAT(again.pushed[0].second, HasSubstr("peaked at 6.00 GiB reserved under it then"));
  const v1::HistoryResponse history = next.core.History("llama", 10);
  ASSERT_GT(history.entries_size(), 0);
  bool recorded = false;
  for (const v1::HistoryEntry& e : history.entries()) {
    recorded |= e.event() == "learned" && e.config() == kLearned;
  }
  EXPECT_TRUE(recorded);

  // It may leave its allocation stream off until it outgrows the 6 GiB the
  // job reached under it by the growth margin (10%).
  EXPECT_EQ(again.start_config_source, "learned");
  EXPECT_EQ(again.stream_from_reserved, static_cast<uint64_t>(1.1 * static_cast<double>(6LL << 30)));

  // Another tenant's job of the same label, and another job, learned
  // nothing: they stream from the start.
  const TestDaemon::Registered other_tenant = next.Register(1002, "llama");
  EXPECT_TRUE(other_tenant.pushed.empty());
  EXPECT_EQ(other_tenant.stream_from_reserved, 0u);
  const TestDaemon::Registered other_job = next.Register(1001, "bert");
  EXPECT_TRUE(other_job.pushed.empty());
  EXPECT_EQ(other_job.stream_from_reserved, 0u);

  const v1::AutotuneLearnedResponse listed = next.autotune.Learned();
  ASSERT_EQ(listed.learned_size(), 1);
  EXPECT_EQ(listed.learned(0).tenant(), "uid:1001");
  EXPECT_EQ(listed.learned(0).job(), "llama");
  EXPECT_EQ(listed.learned(0).config(), kLearned);
  EXPECT_EQ(listed.learned(0).from_config(), "max_split_size_mb:64");
  EXPECT_EQ(listed.state_file(), "");
}

// A push set for the job whose check found it worse from the start than
// what the run had without it (issue 40): the job's next run starts on
// that instead, and a job that had learned it keeps it as it was.
TEST(DaemonAutotuneLearnedTest, APushThatLostItsCheckFromTheStartTeachesWhatTheRunHad) {
  LearnedConfigs learned;
  {
    TestDaemon daemon(&learned);
    const SessionId canary = daemon.Register(1001, "llama").id;
    AutotuneDecision kept = daemon.Kept(canary, "llama");
    kept.learned = LearnedFromPush{.config = "max_split_size_mb:64",
                                   .peak = 4LL << 30,
                                   .pushed_peak = 5LL << 30,
                                   .why = "learned max_split_size_mb:64 instead of the push's"};
    daemon.autotune.OnDecision(kept);
    const std::optional<LearnedConfig> l = learned.Find({"uid:1001", "llama"});
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->config, "max_split_size_mb:64");
    EXPECT_EQ(l->from_config, kLearned);  // what it was learned instead of
    EXPECT_EQ(l->decision_id, kept.id);
    EXPECT_EQ(l->predicted_peak_current, 5LL << 30);
    EXPECT_EQ(l->predicted_peak_switched, 4LL << 30);
    // The push's realised peak is no measure of it.
    EXPECT_FALSE(l->realized_peak.has_value());

    // A later decision whose check chose the config the job learned keeps
    // what it learned then.
    AutotuneDecision again = daemon.Kept(canary, "llama");
    again.id = 9;
    again.learned = kept.learned;
    daemon.autotune.OnDecision(again);
    EXPECT_EQ(learned.Find({"uid:1001", "llama"})->decision_id, kept.id);
  }
  TestDaemon next(&learned);
  const TestDaemon::Registered started = next.Register(1001, "llama", "", {}, "");
  ASSERT_EQ(started.pushed.size(), 1u);
  EXPECT_EQ(started.pushed[0].first, "max_split_size_mb:64");
}

// Events [begin, end) of `trace` as a client sends them.
v1::EventBatch Batch(const Trace& trace, size_t begin, size_t end) {
  v1::EventBatch batch;
  batch.set_sequence(begin);
  for (size_t i = begin; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    batch.add_ops(static_cast<uint32_t>(e.op));
    batch.add_sizes(e.size);
    batch.add_ids(e.id);
    batch.add_streams(trace.streams[e.stream]);
  }
  return batch;
}

// The same through the daemon's own autotuner. Started on
// roundup_power2_divisions:2, llama_lora's first 30% of events push a
// config that, switched there, saves a quarter of the peak (and keeps its
// gain when the sizes grow), and that from the start peaks above what it
// replaced. (From roundup_power2_divisions:4 the push they made did not
// keep its gain on grown sizes: expandable segments alone are pushed now,
// which peak below it from the start.) Its canary runs it within the
// margin and ends: the run's other session gets it, and the job's next
// run starts on roundup_power2_divisions:2.
TEST(DaemonAutotuneLearnedTest, APushWorseFromTheRunsStartIsNotWhatTheNextRunStartsOn) {
  absl::StatusOr<Trace> trace =
      ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
  ASSERT_TRUE(trace.ok()) << trace.status();
  constexpr char kStart[] = "roundup_power2_divisions:2";
  LearnedConfigs learned;
  {
    TestDaemon daemon(&learned);
    const TestDaemon::Registered canary = daemon.Register(1001, "llama", "", {}, kStart);
    const TestDaemon::Registered other = daemon.Register(1001, "llama", "", {}, kStart);
    const size_t pushed_at = trace->events.size() * 3 / 10;
    daemon.autotune.Events(canary.id, Batch(*trace, 0, pushed_at));
    daemon.autotune.WaitIdle();
    const v1::AutotuneHistoryResponse history = daemon.autotune.History("llama", 1);
    ASSERT_EQ(history.decisions_size(), 1);
    const v1::AutotuneDecision& d = history.decisions(0);
    ASSERT_EQ(d.result(), "pushed") << d.why();
    ASSERT_EQ(d.from_config(), kStart);
    daemon.autotune.Acked(canary.id, d.version(), true, "");
    daemon.autotune.Events(canary.id, Batch(*trace, pushed_at, pushed_at + 10000));
    daemon.autotune.Stats(canary.id,
                          {{"reserved_bytes.all.current", d.predicted_peak_switched()},
                           {"allocated_bytes.all.current", d.predicted_peak_allocated()}},
                          d.version());
    daemon.core.EndSession(canary.id, "the job's process exited");
    daemon.autotune.WaitIdle();
    EXPECT_THAT(daemon.Pending(1001, other.id, other.secret),
                ::testing::ElementsAre(d.to_config()));
    const std::optional<LearnedConfig> l = learned.Find({"uid:1001", "llama"});
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->config, kStart);
    EXPECT_EQ(l->from_config, d.to_config());
    EXPECT_GT(l->predicted_peak_current, l->predicted_peak_switched * 105 / 100);
    const v1::AutotuneHistoryResponse after = daemon.autotune.History("llama", 1);
    EXPECT_THAT(after.decisions(0).why(),
                HasSubstr("learned roundup_power2_divisions:2 instead of the push's"));
  }
  TestDaemon next(&learned);
  const TestDaemon::Registered started = next.Register(1001, "llama", "", {}, "");
  ASSERT_EQ(started.pushed.size(), 1u);
  EXPECT_EQ(started.pushed[0].first, kStart);
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
  other.result = AutotuneResult::kRolledBack;
  daemon.autotune.OnDecision(other);
  EXPECT_TRUE(learned.Find({"uid:1001", "llama"}).has_value());
  AutotuneDecision undone = TestDaemon::Pushed(handed.id, "llama");
  undone.id = 2;
  undone.result = AutotuneResult::kRolledBack;
  daemon.autotune.OnDecision(undone);
  EXPECT_FALSE(learned.Find({"uid:1001", "llama"}).has_value());
  EXPECT_TRUE(daemon.Register(1001, "llama").pushed.empty());
}

// A start its review kept on the job's own events (issue 40) is what the
// job settled on, as a kept push is: its next run starts on it as learned,
// and three such jobs make the node's prior.
TEST(DaemonAutotuneLearnedTest, AStartItsReviewKeptIsLearnedAndCountsTowardThePrior) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  for (const char* job : {"a", "b", "c"}) {
    const TestDaemon::Registered started = daemon.Register(1001, job);
    AutotuneDecision review = TestDaemon::Pushed(started.id, job);
    review.trigger = AutotuneTrigger::kStartReview;
    review.result = AutotuneResult::kKept;
    daemon.autotune.OnDecision(review);
    ASSERT_TRUE(learned.Find({"uid:1001", job}).has_value()) << job;
    EXPECT_EQ(learned.Find({"uid:1001", job})->config, kLearned);
    EXPECT_EQ(learned.Find({"uid:1001", job})->from_config, "max_split_size_mb:64");
  }
  // A review that could not replay (kept nothing: no to_config) learns nothing.
  const TestDaemon::Registered skipped = daemon.Register(1001, "d");
  AutotuneDecision unreplayed = TestDaemon::Pushed(skipped.id, "d");
  unreplayed.trigger = AutotuneTrigger::kStartReview;
  unreplayed.result = AutotuneResult::kSkipped;
  unreplayed.to_config.clear();
  daemon.autotune.OnDecision(unreplayed);
  EXPECT_FALSE(learned.Find({"uid:1001", "d"}).has_value());
  // A new job of the tenant, started on its own harmless config, starts on
  // what the three settled on.
  const TestDaemon::Registered fresh = daemon.Register(1001, "e");
  ASSERT_EQ(fresh.pushed.size(), 1u);
  EXPECT_EQ(fresh.pushed[0].first, kLearned);
  EXPECT_THAT(fresh.pushed[0].second, HasSubstr("3 jobs of tenant uid:1001 agree"));
}

// Once the job learned a config, the session its decision was made on, if
// it runs that config, has nothing to decide until it outgrows it: it is
// told it may stop its stream up to the peak the job reached under it, plus
// the growth margin. The job's other sessions were told at registration
// that their streams are not read; another tenant's job of the label and
// another job are told nothing.
TEST(DaemonAutotuneLearnedTest, ALearnedConfigPausesTheStreamTheJobIsDecidedOn) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned);
  // The canary, decided on, which runs the push (here: from its start).
  const TestDaemon::Registered canary = daemon.Register(1001, "llama", "", {}, kLearned);
  const TestDaemon::Registered other = daemon.Register(1001, "llama", "", {}, kLearned);
  const TestDaemon::Registered other_tenant =
      daemon.Register(1002, "llama", "", {}, kLearned);
  const TestDaemon::Registered other_job = daemon.Register(1001, "bert", "", {}, kLearned);
  EXPECT_EQ(canary.stream_from_reserved, 0u);
  EXPECT_EQ(other.stream_from_reserved, kStreamNotRead);

  // Pushed to the canary only: nothing learned, no stream paused.
  AutotuneDecision canary_only = TestDaemon::Pushed(canary.id, "llama");
  absl::StatusOr<uint64_t> version =
      daemon.core.PushToSession(canary.id, kLearned, "autotune", "canary", 0);
  ASSERT_TRUE(version.ok());
  canary_only.version = *version;
  daemon.autotune.OnDecision(canary_only);
  EXPECT_TRUE(daemon.Demands(1001, canary.id, canary.secret).empty());

  daemon.autotune.OnDecision(daemon.Kept(canary.id, "llama"));
  ASSERT_TRUE(learned.Find({"uid:1001", "llama"}).has_value());
  const uint64_t margin = static_cast<uint64_t>(1.1 * static_cast<double>(6LL << 30));
  EXPECT_THAT(daemon.Demands(1001, canary.id, canary.secret), ::testing::ElementsAre(margin));
  EXPECT_TRUE(daemon.Demands(1001, other.id, other.secret).empty());
  EXPECT_TRUE(daemon.Demands(1002, other_tenant.id, other_tenant.secret).empty());
  EXPECT_TRUE(daemon.Demands(1001, other_job.id, other_job.secret).empty());

  // A rollback of what was learned pauses nothing.
  AutotuneDecision rolled_back = daemon.Kept(canary.id, "llama");
  rolled_back.result = AutotuneResult::kRolledBack;
  daemon.autotune.OnDecision(rolled_back);
  EXPECT_TRUE(daemon.Demands(1001, canary.id, canary.secret).empty());
}

// A decision that keeps the job on its config (it found nothing 5% better,
// or only recommends, as in recommend mode) settles it as a learned config
// does: the session it was made on, running that config, may pause until
// it grows past the peak it predicted there. A decision that could not
// decide pauses nothing.
TEST(DaemonAutotuneLearnedTest, ADecisionThatKeepsTheConfigPausesTheStreamTheJobIsDecidedOn) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kRecommend);
  const TestDaemon::Registered own = daemon.Register(1001, "llama");
  AutotuneDecision first{.id = 3,
                         .job = "llama",
                         .tenant = "uid:1001",
                         .trigger = AutotuneTrigger::kFirstPass,
                         .result = AutotuneResult::kSkipped,
                         .from_config = "max_split_size_mb:64",
                         .predicted_peak_current = 10LL << 30,
                         .decided_on = own.id};
  daemon.autotune.OnDecision(first);
  EXPECT_TRUE(daemon.Demands(1001, own.id, own.secret).empty());
  const uint64_t margin = static_cast<uint64_t>(1.1 * static_cast<double>(10LL << 30));
  for (AutotuneResult result : {AutotuneResult::kKept, AutotuneResult::kRecommended}) {
    first.result = result;
    daemon.autotune.OnDecision(first);
    EXPECT_THAT(daemon.Demands(1001, own.id, own.secret), ::testing::ElementsAre(margin));
  }
  // A config the session does not run settles nothing of it.
  first.from_config = kLearned;
  daemon.autotune.OnDecision(first);
  EXPECT_TRUE(daemon.Demands(1001, own.id, own.secret).empty());
  EXPECT_TRUE(learned.List().empty());
}

// One session's stream a job is decided on: the job's other sessions are
// told at registration that theirs is not read, and when the recorded one
// ends, the next is told it is read now (its job not yet settled: all of it).
TEST(DaemonAutotuneLearnedTest, OnlyTheSessionAJobIsDecidedOnIsAskedForItsStream) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kRecommend);
  const TestDaemon::Registered first = daemon.Register(1001, "ddp");
  const TestDaemon::Registered second = daemon.Register(1001, "ddp");
  const TestDaemon::Registered third = daemon.Register(1001, "ddp");
  EXPECT_EQ(first.stream_from_reserved, 0u);
  EXPECT_EQ(second.stream_from_reserved, kStreamNotRead);
  EXPECT_EQ(third.stream_from_reserved, kStreamNotRead);
  daemon.core.EndSession(first.id, "the rank's process exited");
  EXPECT_THAT(daemon.Demands(1001, second.id, second.secret), ::testing::ElementsAre(0u));
  EXPECT_TRUE(daemon.Demands(1001, third.id, third.secret).empty());
  // Another tenant's job of the label records its own.
  EXPECT_EQ(daemon.Register(1002, "ddp").stream_from_reserved, 0u);
}

}  // namespace
// Job labels are scoped by tenant (issue 29): what a job asks for is its
// own tenant's job's, an admin's mode for a label holds in every tenant and
// a job can only lower it, and a push kept for one tenant's job reaches
// that tenant's sessions only.
TEST(DaemonAutotuneTenantsTest, AModeAJobAsksForIsItsTenantsJobsOnly) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kRecommend);
  daemon.Register(1001, "victim");
  daemon.Register(1002, "victim", "apply");
  EXPECT_EQ(daemon.ModeOf("uid:1002", "victim"), "apply");
  EXPECT_EQ(daemon.ModeOf("uid:1001", "victim"), "recommend");
  // The victim asking after the attacker keeps the attacker's job as it is.
  daemon.Register(1001, "victim", "off");
  EXPECT_EQ(daemon.ModeOf("uid:1001", "victim"), "off");
  EXPECT_EQ(daemon.ModeOf("uid:1002", "victim"), "apply");
}

TEST(DaemonAutotuneTenantsTest, AJobMayLowerAnAdminsModeButNeverRaiseIt) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply);
  ASSERT_TRUE(daemon.autotune.SetMode("llama", "recommend").ok());
  daemon.Register(1001, "llama", "apply");
  daemon.Register(1002, "llama", "off");
  daemon.Register(1003, "llama");
  EXPECT_EQ(daemon.ModeOf("uid:1001", "llama"), "recommend");
  EXPECT_EQ(daemon.ModeOf("uid:1002", "llama"), "off");
  EXPECT_EQ(daemon.ModeOf("uid:1003", "llama"), "recommend");
  // The admin's mode moves every tenant's job, each under what it asked.
  ASSERT_TRUE(daemon.autotune.SetMode("llama", "apply").ok());
  EXPECT_EQ(daemon.ModeOf("uid:1001", "llama"), "apply");
  EXPECT_EQ(daemon.ModeOf("uid:1002", "llama"), "off");
  EXPECT_EQ(daemon.ModeOf("uid:1003", "llama"), "apply");
  // The config file's mode for the label is an admin's too.
  daemon.autotune.SetFilePolicies(
      std::nullopt, {{"bert", AutotuneFilePolicy{.mode = AutotuneMode::kOff}}});
  daemon.Register(1001, "bert", "apply");
  EXPECT_EQ(daemon.ModeOf("uid:1001", "bert"), "off");
}

TEST(DaemonAutotuneTenantsTest, AKeptPushReachesItsTenantsSessionsOfTheLabelOnly) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned);
  const TestDaemon::Registered mine = daemon.Register(1001, "llama");
  const TestDaemon::Registered theirs = daemon.Register(1002, "llama");
  absl::StatusOr<uint64_t> version = daemon.autotune.SetJobConfig(
      {"uid:1001", "llama"}, kLearned, "decision 7", 5LL << 30);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_THAT(daemon.Pending(1001, mine.id, mine.secret),
              ::testing::ElementsAre(kLearned));
  EXPECT_TRUE(daemon.Pending(1002, theirs.id, theirs.secret).empty());
  // The label's config (an admin's, for every tenant) is left as it was.
  EXPECT_FALSE(daemon.core.GetConfig("llama").has_config());
  // Kept for uid 1001's job: learned for it, not for uid 1002's.
  AutotuneDecision kept = TestDaemon::Pushed(mine.id, "llama");
  kept.version = *version;
  daemon.autotune.OnDecision(kept);
  EXPECT_TRUE(learned.Find({"uid:1001", "llama"}).has_value());
  EXPECT_FALSE(learned.Find({"uid:1002", "llama"}).has_value());
  // The history names the decision's tenant.
  const v1::HistoryResponse history = daemon.core.History("llama", 10);
  bool named = false;
  for (const v1::HistoryEntry& e : history.entries()) {
    named |= e.event() == "autotune" && absl::StrContains(e.detail(), "uid:1001");
  }
  EXPECT_TRUE(named);
}

// A tenant registering and ending sessions under ever new labels (issue 29)
// leaves no per-job state behind past its live sessions and a bounded
// number of ended jobs' kept versions, while a live job keeps what it asked
// for and its kept push.
TEST(DaemonAutotuneTenantsTest, ALabelFloodLeavesNoJobStateBehindItsLiveSessions) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply);
  const TestDaemon::Registered live = daemon.Register(1001, "live", "recommend");
  absl::StatusOr<uint64_t> live_version = daemon.autotune.SetJobConfig(
      {"uid:1001", "live"}, kLearned, "decision 7", 5LL << 30);
  ASSERT_TRUE(live_version.ok()) << live_version.status();

  constexpr int kLabels = 3000;
  static_assert(kLabels > DaemonAutotune::kEndedJobVersionsKept);
  uint64_t last_flood_version = 0;
  for (int i = 0; i < kLabels; ++i) {
    const std::string label = absl::StrCat("flood-", i);
    const TestDaemon::Registered flood = daemon.Register(1002, label, "apply");
    ASSERT_NE(flood.id, 0u);
    // A push set for the flood's job, as the autotuner keeps one.
    absl::StatusOr<uint64_t> set =
        daemon.autotune.SetJobConfig({"uid:1002", label}, kLearned, "flood", 0);
    ASSERT_TRUE(set.ok()) << set.status();
    last_flood_version = *set;
    daemon.core.EndSession(flood.id, "the flood's process exited");
  }
  const DaemonAutotune::JobStateSizes sizes =
      daemon.autotune.JobStateSizesForTest();
  EXPECT_EQ(sizes.live_jobs, 1u);
  EXPECT_EQ(sizes.preferences, 1u);
  EXPECT_EQ(sizes.policied, 1u);
  EXPECT_EQ(sizes.versions, 1u + DaemonAutotune::kEndedJobVersionsKept);

  // The live job: its mode as it asked, its kept push learned.
  EXPECT_EQ(daemon.ModeOf("uid:1001", "live"), "recommend");
  AutotuneDecision kept = TestDaemon::Pushed(live.id, "live");
  kept.version = *live_version;
  daemon.autotune.OnDecision(kept);
  EXPECT_TRUE(learned.Find({"uid:1001", "live"}).has_value());

  // A decision on a push of a job that just ended is still learned.
  AutotuneDecision late = TestDaemon::Pushed(0, absl::StrCat("flood-", kLabels - 1));
  late.tenant = "uid:1002";
  late.id = 8;
  late.version = last_flood_version;
  daemon.autotune.OnDecision(late);
  EXPECT_TRUE(learned.Find({"uid:1002", late.job}).has_value());

  // A job that ends and comes back asks again: its state is a live job's.
  const TestDaemon::Registered back = daemon.Register(1002, "flood-0", "off");
  EXPECT_EQ(daemon.ModeOf("uid:1002", "flood-0"), "off");
  EXPECT_EQ(daemon.autotune.JobStateSizesForTest().live_jobs, 2u);
  daemon.core.EndSession(back.id, "done");
  daemon.core.EndSession(live.id, "done");
  const DaemonAutotune::JobStateSizes after =
      daemon.autotune.JobStateSizesForTest();
  EXPECT_EQ(after.live_jobs, 0u);
  EXPECT_EQ(after.preferences, 0u);
  EXPECT_EQ(after.policied, 0u);
  EXPECT_LE(after.versions, DaemonAutotune::kEndedJobVersionsKept);
}

// Issue 40: with --autotune-prior learned, a harmful start config is
// replaced at registration (and at the LearnedConfig RPC, asked with the
// job's start config), on a fresh node by the seed prior, and a job without
// a learned config starts on what at least three of its tenant's (else the
// node's) learned configs agree on.
TEST(DaemonAutotuneStartTest, AHarmfulStartIsReplacedAndANewJobStartsOnThePrior) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  const TestDaemon::Registered replaced = daemon.Register(1001, "fresh");
  ASSERT_EQ(replaced.pushed.size(), 1u);
  EXPECT_EQ(replaced.pushed[0].first, kLearned);
  EXPECT_THAT(replaced.pushed[0].second,
              AllOf(HasSubstr("started on the seed prior expandable_segments:True"),
                    HasSubstr("instead of max_split_size_mb:64, known to be harmful")));
  EXPECT_THAT(daemon.metrics.Render(),
              HasSubstr("allocd_autotune_start_configs_total{source=\"prior\"} 1"));
  // A job that asks for recommend is left on its own.
  EXPECT_TRUE(daemon.Register(1001, "asks", "recommend").pushed.empty());

  for (const char* job : {"a", "b", "c"}) {
    ASSERT_TRUE(learned.Record({"uid:1001", job}, {.config = "max_split_size_mb:512"}).ok());
  }
  const TestDaemon::Registered on_prior = daemon.Register(1001, "new");
  ASSERT_EQ(on_prior.pushed.size(), 1u);
  EXPECT_EQ(on_prior.pushed[0].first, "max_split_size_mb:512");
  EXPECT_THAT(on_prior.pushed[0].second, HasSubstr("3 jobs of tenant uid:1001 agree"));
  // Nothing was learned of this job: a prior (or a replacement) is no
  // reason to leave its stream off.
  EXPECT_EQ(on_prior.start_config_source, "prior");
  EXPECT_EQ(on_prior.stream_from_reserved, 0u);
  EXPECT_EQ(replaced.stream_from_reserved, 0u);
  // Another tenant has no prior of its own: the node's.
  const TestDaemon::Registered node = daemon.Register(1002, "new");
  ASSERT_EQ(node.pushed.size(), 1u);
  EXPECT_THAT(node.pushed[0].second, HasSubstr("3 jobs of the node agree"));
  bool history = false;
  const v1::HistoryResponse entries = daemon.core.History("new", 10);
  for (const v1::HistoryEntry& e : entries.entries()) {
    history |= e.event() == "prior" && e.config() == "max_split_size_mb:512";
  }
  EXPECT_TRUE(history);

  // allocd run asks before the job starts, with its start config.
  v1::LearnedConfigRequest ask;
  ask.set_job("other");
  ask.set_start_config("max_split_size_mb:64");
  const PeerCredentials peer{.pid = 4242, .uid = 1001, .gid = 1001};
  absl::StatusOr<v1::LearnedConfigResponse> answer = daemon.core.LearnedConfig(peer, ask);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->config(), "max_split_size_mb:512");
  EXPECT_EQ(answer->source(), "prior");
  ask.set_start_config("max_split_size_mb:1");
  EXPECT_FALSE(daemon.core.LearnedConfig(peer, ask).ok());
}

// A process that says at registration what it does with CUDA memory is
// never started on a config that would break it: with CUDA IPC (a consumer
// of another uid cannot pidfd_getfd it), no expandable segments; its
// harmful split size still goes.
TEST(DaemonAutotuneStartTest, AStartTheJobsFeaturesWouldBreakIsLeftOut) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  v1::RegisterRequest r;
  r.set_job("shares");
  r.set_initial_config("max_split_size_mb:64");
  r.mutable_features()->set_cuda_ipc(true);
  const TestDaemon::Registered shares = daemon.Register(1001, r);
  ASSERT_EQ(shares.pushed.size(), 1u);
  EXPECT_EQ(shares.pushed[0].first, "");
  EXPECT_THAT(shares.pushed[0].second, AllOf(HasSubstr("instead of max_split_size_mb:64"),
                                             HasSubstr("expandable_segments:True was left out")));
  // The same job without the feature is started on expandable segments.
  EXPECT_EQ(daemon.Register(1001, "plain").pushed.at(0).first, kLearned);
}

// What a job's earlier run was seen doing counts as declared for its next:
// its hooks report CUDA IPC only once it shares, after the start config is
// set. Another job of the label, in another tenant, learns nothing of it.
TEST(DaemonAutotuneStartTest, AJobSeenSharingCudaTensorsIsNotStartedOnExpandableSegmentsAgain) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  const TestDaemon::Registered first = daemon.Register(1001, "shares", "", {}, "");
  ASSERT_EQ(first.pushed.size(), 1u);
  EXPECT_EQ(first.pushed[0].first, kLearned);  // the seed: nothing seen yet
  v1::JobFeatures ipc;
  ipc.set_cuda_ipc(true);
  daemon.autotune.Features(first.id, ipc);
  daemon.core.EndSession(first.id, "the job's process exited");

  const TestDaemon::Registered next = daemon.Register(1001, "shares", "", {}, "");
  EXPECT_TRUE(next.pushed.empty()) << next.pushed.at(0).first;
  EXPECT_EQ(daemon.Register(1002, "shares", "", {}, "").pushed.at(0).first, kLearned);
}

// A fresh node (issue 40): a job on PyTorch's defaults, which would cut
// segments in its first steps that stay, starts on the seed prior, which
// says where it came from; once three learned configs agree, theirs wins.
TEST(DaemonAutotuneStartTest, ANewJobOnAFreshNodeStartsOnTheSeedUntilLearnedConfigsAgree) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  const TestDaemon::Registered seeded = daemon.Register(1001, "fresh", "", {}, "");
  ASSERT_EQ(seeded.pushed.size(), 1u);
  EXPECT_EQ(seeded.pushed[0].first, kLearned);
  EXPECT_THAT(seeded.pushed[0].second,
              AllOf(HasSubstr("started on the seed prior expandable_segments:True (fewer than 3 "
                              "learned configs agree yet; set by --autotune-seed-prior)"),
                    HasSubstr("instead of its own PyTorch's defaults")));
  EXPECT_THAT(daemon.metrics.Render(),
              HasSubstr("allocd_autotune_start_configs_total{source=\"prior\"} 1"));
  // allocd run asks before the job starts.
  v1::LearnedConfigRequest ask;
  ask.set_job("run");
  const PeerCredentials peer{.pid = 4242, .uid = 1001, .gid = 1001};
  absl::StatusOr<v1::LearnedConfigResponse> answer = daemon.core.LearnedConfig(peer, ask);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->config(), kLearned);
  EXPECT_EQ(answer->source(), "prior");
  // A job already on expandable segments, or not in apply mode, keeps its own.
  EXPECT_TRUE(daemon.Register(1001, "expandable", "", {},
                              "expandable_segments:True,roundup_power2_divisions:4")
                  .pushed.empty());
  EXPECT_TRUE(daemon.Register(1001, "asks", "recommend", {}, "").pushed.empty());

  for (const char* job : {"a", "b", "c"}) {
    ASSERT_TRUE(learned.Record({"uid:1001", job}, {.config = "max_split_size_mb:512"}).ok());
  }
  const TestDaemon::Registered on_prior = daemon.Register(1001, "new", "", {}, "");
  ASSERT_EQ(on_prior.pushed.size(), 1u);
  EXPECT_EQ(on_prior.pushed[0].first, "max_split_size_mb:512");
  EXPECT_THAT(on_prior.pushed[0].second, HasSubstr("3 jobs of tenant uid:1001 agree"));
}

// --autotune-seed-prior off keeps learned priors but no seed: on a fresh
// node a job starts on its own config, a harmful one made safe.
TEST(DaemonAutotuneStartTest, WithTheSeedOffAFreshNodesJobStartsOnItsOwn) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{.seed = std::nullopt});
  EXPECT_TRUE(daemon.Register(1001, "fresh", "", {}, "").pushed.empty());
  const TestDaemon::Registered replaced = daemon.Register(1001, "harmful");
  ASSERT_EQ(replaced.pushed.size(), 1u);
  EXPECT_EQ(replaced.pushed[0].first, kLearned);
  EXPECT_THAT(replaced.pushed[0].second,
              AllOf(HasSubstr("instead of max_split_size_mb:64, known to be harmful"),
                    HasSubstr("no prior: fewer than 3 learned configs agree")));
  EXPECT_THAT(daemon.metrics.Render(),
              HasSubstr("allocd_autotune_start_configs_total{source=\"replaced\"} 1"));
  for (const char* job : {"a", "b", "c"}) {
    ASSERT_TRUE(learned.Record({"uid:1001", job}, {.config = "max_split_size_mb:512"}).ok());
  }
  EXPECT_EQ(daemon.Register(1001, "new", "", {}, "").pushed.at(0).first,
            "max_split_size_mb:512");
}

// The seed is vetoed as any prior: a process that shares CUDA tensors
// with another uid starts on its own PyTorch's defaults.
TEST(DaemonAutotuneStartTest, ASeedTheJobsFeaturesWouldBreakIsLeftOut) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  v1::RegisterRequest r;
  r.set_job("shares");
  r.mutable_features()->set_cuda_ipc(true);
  const TestDaemon::Registered shares = daemon.Register(1001, r);
  EXPECT_TRUE(shares.pushed.empty()) << shares.pushed.at(0).first;
  EXPECT_THAT(daemon.metrics.Render(),
              ::testing::Not(HasSubstr("allocd_autotune_start_configs_total{source=")));
}

// Learned configs imported from the ConfigMap (the config file's job
// configs) count toward the node's prior.
TEST(DaemonAutotuneStartTest, ConfigsImportedFromTheConfigMapCountTowardThePrior) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kApply, PriorSetting{});
  daemon.autotune.SetFileJobConfigs({{"a", "roundup_power2_divisions:4"},
                                     {"b", "roundup_power2_divisions:4"},
                                     {"c", "roundup_power2_divisions:4"}});
  const TestDaemon::Registered registered = daemon.Register(1001, "new");
  ASSERT_EQ(registered.pushed.size(), 1u);
  EXPECT_EQ(registered.pushed[0].first, "roundup_power2_divisions:4");
  EXPECT_THAT(registered.pushed[0].second, HasSubstr("3 jobs of the node agree"));
}

// What a session's process does with its CUDA memory (JobFeatures), said at
// registration and later in its telemetry, is its job's from then on: what
// decides the configs the job's decisions leave out.
TEST(DaemonAutotuneFeaturesTest, WhatSessionsReportIsTheirJobsFromThenOn) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned, AutotuneMode::kRecommend);
  const auto features_of = [&](const std::string& job) {
    const v1::AutotuneStatusResponse status = daemon.autotune.Status();
    for (const v1::AutotuneJob& j : status.jobs()) {
      if (j.job() == job) return j.features();
    }
    ADD_FAILURE() << "no job " << job;
    return v1::JobFeatures();
  };
  v1::RegisterRequest r;
  r.set_protocol_version(1);
  r.set_job("ddp");
  r.mutable_features()->set_nccl_registration(true);
  const PeerCredentials peer{.pid = 4242, .uid = 1001, .gid = 1001};
  absl::StatusOr<v1::RegisterResponse> first = daemon.core.Register(peer, r);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(features_of("ddp").nccl_registration());
  EXPECT_FALSE(features_of("ddp").cuda_ipc());

  const TestDaemon::Registered second = daemon.Register(1001, "ddp");
  v1::TelemetryReport report;
  report.set_session_id(second.id);
  report.set_session_secret(second.secret);
  report.mutable_features()->set_cuda_ipc(true);
  ASSERT_TRUE(daemon.core.Telemetry(peer, report).ok());
  EXPECT_TRUE(features_of("ddp").cuda_ipc());
  EXPECT_TRUE(features_of("ddp").nccl_registration());
  // Another job's are its own.
  daemon.Register(1001, "other");
  EXPECT_FALSE(features_of("other").cuda_ipc());
}

// A learned config that a feature seen only after it was kept would break
// is forgotten: the job's next run starts on its own config.
TEST(DaemonAutotuneFeaturesTest, ALearnedConfigTheJobsFeaturesBreakIsForgotten) {
  LearnedConfigs learned;
  ASSERT_TRUE(learned
                  .Record({"uid:1001", "loader"},
                          {.config = kLearned, .from_config = "max_split_size_mb:64",
                           .decision_id = 7})
                  .ok());
  TestDaemon daemon(&learned);
  const TestDaemon::Registered run = daemon.Register(1001, "loader");
  ASSERT_EQ(run.pushed.size(), 1u);  // started on it
  const PeerCredentials peer{.pid = 4242, .uid = 1001, .gid = 1001};
  v1::TelemetryReport graphs;
  graphs.set_session_id(run.id);
  graphs.set_session_secret(run.secret);
  graphs.mutable_features()->set_cuda_graphs(true);
  ASSERT_TRUE(daemon.core.Telemetry(peer, graphs).ok());
  EXPECT_TRUE(learned.Find({"uid:1001", "loader"}).has_value());  // graphs run it
  v1::TelemetryReport shares = graphs;
  shares.mutable_features()->set_cuda_ipc(true);
  ASSERT_TRUE(daemon.core.Telemetry(peer, shares).ok());
  EXPECT_FALSE(learned.Find({"uid:1001", "loader"}).has_value());
  EXPECT_TRUE(daemon.Register(1001, "loader").pushed.empty());
}

namespace {

v1::JobRank Rank(const std::string& run, uint32_t rank, uint32_t world_size) {
  v1::JobRank r;
  r.set_run_id(run);
  r.set_rank(rank);
  r.set_world_size(world_size);
  return r;
}

// The ranks of one run are one job whatever labels they give (the run's
// first session's), apart from another run of the label and from the
// label's sessions without a run; the job's config reaches its ranks only,
// and what it learns is its label's.
TEST(DaemonAutotuneRanksTest, TheRanksOfARunAreOneJobWhateverTheirLabels) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned);
  const TestDaemon::Registered rank1 = daemon.Register(1001, "train", "", Rank("r1", 1, 2));
  const TestDaemon::Registered rank0 =
      daemon.Register(1001, "train-rank0", "", Rank("r1", 0, 2));
  const TestDaemon::Registered other_run = daemon.Register(1001, "train", "", Rank("r2", 0, 2));
  const TestDaemon::Registered plain = daemon.Register(1001, "train");

  const v1::AutotuneStatusResponse status = daemon.autotune.Status();
  ASSERT_EQ(status.jobs_size(), 3) << status.DebugString();
  for (const v1::AutotuneJob& job : status.jobs()) EXPECT_EQ(job.job(), "train");
  EXPECT_EQ(status.jobs(0).run_id(), "");
  EXPECT_EQ(status.jobs(1).run_id(), "r1");
  ASSERT_EQ(status.jobs(1).ranks_size(), 2);
  EXPECT_TRUE(status.jobs(1).ranks(0).has_rank());
  EXPECT_EQ(status.jobs(1).ranks(0).rank(), 0u);
  EXPECT_FALSE(status.jobs(0).ranks(0).has_rank());  // no rank reported
  EXPECT_EQ(status.jobs(1).ranks(0).session_id(), rank0.id);
  EXPECT_EQ(status.jobs(1).ranks(1).session_id(), rank1.id);
  EXPECT_EQ(status.jobs(1).ranks(1).world_size(), 2u);
  EXPECT_EQ(status.jobs(1).ranks(1).config(), "max_split_size_mb:64");
  EXPECT_EQ(status.jobs(2).run_id(), "r2");

  absl::StatusOr<uint64_t> version = daemon.autotune.SetJobConfig(
      {.tenant = "uid:1001", .job = "train", .run = "r1"}, kLearned, "decision 7", 5LL << 30);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_THAT(daemon.Pending(1001, rank1.id, rank1.secret), ::testing::ElementsAre(kLearned));
  EXPECT_THAT(daemon.Pending(1001, rank0.id, rank0.secret), ::testing::ElementsAre(kLearned));
  EXPECT_TRUE(daemon.Pending(1001, other_run.id, other_run.secret).empty());
  EXPECT_TRUE(daemon.Pending(1001, plain.id, plain.secret).empty());

  AutotuneDecision kept = TestDaemon::Pushed(rank1.id, "train");
  kept.run = "r1";
  kept.version = *version;
  daemon.autotune.OnDecision(kept);
  ASSERT_TRUE(learned.Find({"uid:1001", "train"}).has_value());
  EXPECT_EQ(learned.Find({"uid:1001", "train"})->config, kLearned);
}

TEST(DaemonAutotuneRanksTest, ARankThatCannotBeIsRefusedAtRegistration) {
  LearnedConfigs learned;
  TestDaemon daemon(&learned);
  const PeerCredentials peer{.pid = 4242, .uid = 1001, .gid = 1001};
  v1::RegisterRequest r;
  r.set_protocol_version(1);
  *r.mutable_rank() = Rank("r1", 2, 2);
  EXPECT_EQ(daemon.core.Register(peer, r).status().code(), absl::StatusCode::kInvalidArgument);
  *r.mutable_rank() = Rank("run id with spaces", 0, 2);
  absl::StatusOr<v1::RegisterResponse> refused = daemon.core.Register(peer, r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("rank.run_id"));
}

}  // namespace
}  // namespace allocd
