#include "server/autotune/autotuner.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "server/autotune/start_config.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

const Trace& LlamaLora() {
  static const Trace* trace = [] {
    absl::StatusOr<Trace> t =
        ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
    EXPECT_TRUE(t.ok()) << t.status();
    return new Trace(t.ok() ? *std::move(t) : Trace{});
  }();
  return *trace;
}

// Records what the autotuner asks for; pushes get versions 100, 101, ...
class FakeActions : public AutotuneActions {
 public:
  struct Push {
    std::string kind;  // "session", "job", "rollback"
    uint64_t target;   // session id (0 for the job)
    std::string config;
    uint64_t version;
    TenantId tenant = "";  // a job push's job
    std::string run = "";
  };

  absl::StatusOr<uint64_t> PushToSession(SessionId session, const std::string& config,
                                         const std::string&, uint64_t) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back({"session", session, config, next_version_});
    return next_version_++;
  }
  absl::StatusOr<uint64_t> SetJobConfig(const JobKey& job, const std::string& config,
                                        const std::string&, uint64_t) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back({"job", 0, config, next_version_, job.tenant, job.run});
    return next_version_++;
  }
  absl::Status RollBackSession(SessionId session, const std::string& config,
                               const std::string&) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back({"rollback", session, config, 0});
    return absl::OkStatus();
  }
  void OnRun(const std::string&) override {
    absl::MutexLock lock(&mu_);
    ++runs_;
  }
  void OnDecision(const AutotuneDecision& decision) override {
    absl::MutexLock lock(&mu_);
    decisions_.push_back(decision);
  }
  void DemandStream(SessionId session, uint64_t from_reserved, std::string) override {
    absl::MutexLock lock(&mu_);
    demands_.emplace_back(session, from_reserved);
  }
  // The StreamDemands asked for: (session, from_reserved).
  std::vector<std::pair<SessionId, uint64_t>> demands() const {
    absl::MutexLock lock(&mu_);
    return demands_;
  }

  std::vector<Push> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  int runs() const {
    absl::MutexLock lock(&mu_);
    return runs_;
  }
  size_t decisions() const {
    absl::MutexLock lock(&mu_);
    return decisions_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Push> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<AutotuneDecision> decisions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<SessionId, uint64_t>> demands_ ABSL_GUARDED_BY(mu_);
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_version_ ABSL_GUARDED_BY(mu_) = 100;
};

// A clock the test moves.
class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

AutotuneOptions Options(FakeClock& clock, AutotuneMode mode) {
  AutotuneOptions options;
  options.default_policy.mode = mode;
  options.threads = 2;
  options.now = [&clock] { return clock.Now(); };
  return options;
}

// Feeds events [begin, end) of the trace in batches of `batch_events`.
void Feed(Autotuner& tuner, SessionId session, const Trace& trace, size_t begin,
          size_t end, size_t batch_events = 10000) {
  std::vector<EvidenceEvent> batch;
  for (size_t i = begin; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    batch.push_back({e.op, trace.streams[e.stream], e.id, e.size});
    if (batch.size() == batch_events || i + 1 == end) {
      tuner.Events(session, batch, 0);
      batch.clear();
    }
  }
}

// The training at once (the recording's last events free the whole model,
// which no step does): the first pass then decides on all of it, so runs
// are deterministic (fed in batches, the worker decides on whatever the
// window holds when it gets to it).
size_t TrainingEvents() { return LlamaLora().events.size() * 9 / 10; }

void FeedAll(Autotuner& tuner, SessionId session) {
  Feed(tuner, session, LlamaLora(), 0, TrainingEvents(), SIZE_MAX);
  tuner.WaitIdle();
}

std::map<std::string, int64_t> Reserved(int64_t bytes) {
  return {{"reserved_bytes.all.current", bytes}, {"allocated_bytes.all.current", bytes}};
}

// A report of `reserved` bytes by a job whose allocations peaked at `allocated`.
std::map<std::string, int64_t> Reserved(int64_t reserved, int64_t allocated) {
  return {{"reserved_bytes.all.current", reserved},
          {"allocated_bytes.all.current", allocated / 2},
          {"allocated_bytes.all.peak", allocated}};
}

// A config pushed at registration (the job's learned one) and ACKed is what
// the session runs: a decision starts from it, not from the config the
// process started with, and a harmful start config handed a good one is no
// longer hurried.
TEST(AutotunerTest, AConfigHandedAtRegistrationIsWhatADecisionStartsFrom) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 0);
  tuner.Handed(1, 7, "expandable_segments:True");
  tuner.Acked(1, 6, true, "");  // another version: not the handed one
  tuner.Acked(1, 7, true, "");
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].from_config, "expandable_segments:True");
  EXPECT_EQ(history[0].trigger, AutotuneTrigger::kFirstPass);
}

// A job the daemon started on a config instead of its own (issue 40): its
// first pass reviews that start on its own events, staying being its own
// config, as a start_review decision of its own, before deciding as usual.
TEST(AutotunerTest, AStartInsteadOfAHarmfulConfigIsReviewedAndKept) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "llama", "expandable_segments:True", 0);
  tuner.StartedInstead(1, "max_split_size_mb:64", "replaced: known to be harmful");
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_GE(history.size(), 1u);
  const AutotuneDecision& review = history.back();  // the oldest
  EXPECT_EQ(review.trigger, AutotuneTrigger::kStartReview);
  EXPECT_EQ(review.result, AutotuneResult::kKept) << review.why;
  // Read as a push that was kept: from staying, its own, to the start.
  EXPECT_EQ(review.from_config, "max_split_size_mb:64");
  EXPECT_EQ(review.to_config, "expandable_segments:True");
  // Staying on max_split_size_mb:64 peaks at several times the replacement.
  EXPECT_GT(review.predicted_peak_current, 2 * review.predicted_peak_switched) << review.why;
  EXPECT_NE(review.why.find("known to be harmful"), std::string::npos) << review.why;
  for (const FakeActions::Push& p : actions.pushes()) {
    EXPECT_NE(p.config, "max_split_size_mb:64");
  }
}

// A prior that does worse than the job's own config on the job's events
// returns the job to its own config.
TEST(AutotunerTest, APriorWorseThanTheJobsOwnConfigReturnsTheJobToIt) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 0);
  tuner.StartedInstead(1, "expandable_segments:True", "started on the node's prior");
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].trigger, AutotuneTrigger::kStartReview);
  EXPECT_EQ(history[0].result, AutotuneResult::kRolledBack) << history[0].why;
  EXPECT_EQ(history[0].to_config, "expandable_segments:True");
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].kind, "job");
  EXPECT_EQ(pushes[0].config, "expandable_segments:True");
  EXPECT_EQ(history[0].version, pushes[0].version);
}

TEST(AutotunerTest, RecommendComputesButPushesNothing) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  const AutotuneDecision& d = history[0];
  EXPECT_EQ(d.result, AutotuneResult::kRecommended) << d.why;
  EXPECT_EQ(d.trigger, AutotuneTrigger::kBadStartConfig);
  EXPECT_EQ(d.from_config, "max_split_size_mb:64");
  EXPECT_FALSE(d.to_config.empty());
  EXPECT_LT(d.predicted_peak_switched, d.predicted_peak_current);
  EXPECT_EQ(d.version, 0u);
  EXPECT_TRUE(actions.pushes().empty());
  EXPECT_EQ(actions.runs(), 1);
  const std::vector<AutotuneJobStatus> status = tuner.Status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].state, AutotuneJobState::kWatching);
  EXPECT_EQ(status[0].sessions, 1u);
  EXPECT_EQ(status[0].window_events, TrainingEvents());
  EXPECT_GT(status[0].window_bytes, 16 * status[0].window_events);
  EXPECT_LT(status[0].window_bytes, 24 * status[0].window_events);
  ASSERT_TRUE(status[0].last.has_value());
  EXPECT_EQ(status[0].last->id, d.id);
}

// Feeds llama_lora to session 1 `read` events at a time, as a client's
// rounds send them, until the job's first decision; when `lossy`, every
// other round loses its first event. Returns how many events were fed.
size_t FeedUntilDecided(Autotuner& tuner, const std::string& job, size_t read, bool lossy) {
  const Trace& trace = LlamaLora();
  size_t fed = 0;
  for (int round = 1; fed < trace.events.size() && tuner.History(job, 1).empty(); ++round) {
    const size_t lost = lossy && round % 2 == 0 ? 1 : 0;
    if (lost != 0) tuner.Events(1, {}, lost);
    const size_t next = std::min(fed + read, trace.events.size());
    Feed(tuner, 1, trace, fed + lost, next, SIZE_MAX);
    tuner.WaitIdle();
    fed = next;
  }
  return fed;
}

TEST(AutotunerTest, TheFirstPassWaitsForTwoSteps) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "", 1);
  const Trace& trace = LlamaLora();
  const size_t fed = FeedUntilDecided(tuner, "llama", 10000, /*lossy=*/false);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].trigger, AutotuneTrigger::kFirstPass);
  // llama_lora's step is 1/20 of the trace; two of them were needed.
  EXPECT_GE(history[0].window_events, trace.events.size() / 10);
  EXPECT_LT(fed, trace.events.size());
  // Nothing more comes from the first pass (later steps that ask for more
  // are decided on as larger requests).
  Feed(tuner, 1, trace, fed, trace.events.size());
  tuner.WaitIdle();
  for (const AutotuneDecision& d : tuner.History("llama", 10)) {
    if (d.id != history[0].id) {
      EXPECT_EQ(d.trigger, AutotuneTrigger::kLargerRequest);
    }
  }
}

// What the advisor sends on a busy job (on the H100: 8 events lost in
// llama_lora's 24 steps, one or two at a time between reads): the first pass
// still finds the step and decides within the run, not at its end.
TEST(AutotunerTest, TheFirstPassFindsTheStepOfAStreamThatLostEvents) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "", 1);
  const size_t fed = FeedUntilDecided(tuner, "llama", 9000, /*lossy=*/true);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].result, AutotuneResult::kRecommended) << history[0].why;
  EXPECT_LT(fed, LlamaLora().events.size() / 2);
}

// Apply mode up to the canary's push, decided on llama_lora's first
// `events` events; returns the decision.
AutotuneDecision PushToCanary(Autotuner& tuner, FakeActions& actions,
                              size_t events = TrainingEvents()) {
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  tuner.SessionStarted(2, "llama", "max_split_size_mb:64", 1);
  Feed(tuner, 1, LlamaLora(), 0, events, SIZE_MAX);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> history = tuner.History("llama", 1);
  EXPECT_EQ(history.size(), 1u);
  if (history.empty()) return {};
  EXPECT_EQ(history[0].result, AutotuneResult::kPushed) << history[0].why;
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  EXPECT_EQ(pushes.size(), 1u);
  if (pushes.empty()) return {};
  EXPECT_EQ(pushes[0].kind, "session");
  EXPECT_EQ(pushes[0].target, 1u);  // the oldest session
  EXPECT_EQ(pushes[0].config, history[0].to_config);
  EXPECT_EQ(history[0].version, pushes[0].version);
  EXPECT_EQ(tuner.Status()[0].state, AutotuneJobState::kCanary);
  return history[0];
}

TEST(AutotunerTest, ApplyPushesToTheCanaryThenTheJob) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  EXPECT_FALSE(d.trigger_to_ack.has_value());
  clock.Advance(absl::Seconds(2));
  tuner.Acked(1, d.version, true, "");
  ASSERT_TRUE(tuner.History("llama", 1)[0].trigger_to_ack.has_value());
  EXPECT_EQ(*tuner.History("llama", 1)[0].trigger_to_ack, absl::Seconds(2));
  const int64_t realized = d.predicted_peak_switched;
  tuner.Stats(1, Reserved(realized), d.version);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);  // still watching the canary
  clock.Advance(absl::Seconds(11));
  tuner.Stats(1, Reserved(realized - 1), d.version);
  tuner.WaitIdle();
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].kind, "job");
  EXPECT_EQ(pushes[1].config, d.to_config);
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.id, d.id);
  EXPECT_EQ(after.result, AutotuneResult::kPushed);
  EXPECT_EQ(after.version, pushes[1].version);
  EXPECT_EQ(after.sessions, (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(after.realized_peak.has_value());
  EXPECT_EQ(*after.realized_peak, realized);
  EXPECT_EQ(*after.realized_saving, d.predicted_peak_current - realized);
  EXPECT_EQ(tuner.Status()[0].state, AutotuneJobState::kApplied);
  // The rest of the job reports under the job's version: realised values
  // keep coming in.
  tuner.Stats(2, Reserved(realized + 5), pushes[1].version);
  EXPECT_EQ(*tuner.History("llama", 1)[0].realized_peak, realized + 5);
}

// A label names a job within its tenant (issue 29): another tenant's
// sessions under the same label are another job, with their own window,
// decisions and policy, and what is decided on one tenant's events is
// pushed to that tenant's sessions only.
TEST(AutotunerTest, TwoTenantsOfOneLabelAreTwoJobs) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1, "uid:1001");
  tuner.SessionStarted(2, "llama", "max_split_size_mb:64", 1, "uid:1002");
  tuner.SessionStarted(3, "llama", "max_split_size_mb:64", 1, "uid:1002");
  // Only uid 1002's sessions send events: only its job is decided on.
  Feed(tuner, 2, LlamaLora(), 0, TrainingEvents(), SIZE_MAX);
  tuner.WaitIdle();

  std::vector<AutotuneJobStatus> status = tuner.Status();
  ASSERT_EQ(status.size(), 2u);
  EXPECT_EQ(status[0].job, "llama");
  EXPECT_EQ(status[0].tenant, "uid:1001");
  EXPECT_EQ(status[0].sessions, 1u);
  EXPECT_EQ(status[0].window_events, 0u);
  EXPECT_EQ(status[0].state, AutotuneJobState::kWatching);
  EXPECT_FALSE(status[0].last.has_value());
  EXPECT_EQ(status[1].tenant, "uid:1002");
  EXPECT_EQ(status[1].sessions, 2u);
  EXPECT_GT(status[1].window_events, 0u);
  EXPECT_EQ(status[1].state, AutotuneJobState::kCanary);

  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  const AutotuneDecision d = history[0];
  EXPECT_EQ(d.tenant, "uid:1002");
  EXPECT_EQ(d.result, AutotuneResult::kPushed) << d.why;
  ASSERT_EQ(actions.pushes().size(), 1u);
  EXPECT_EQ(actions.pushes()[0].target, 2u);  // uid 1002's oldest session

  // The canary's watch passes: the config is set for uid 1002's job only,
  // and uid 1001's session is no session of that job.
  tuner.Acked(2, d.version, true, "");
  tuner.Stats(2, Reserved(d.predicted_peak_switched), d.version);
  clock.Advance(absl::Seconds(11));
  tuner.Stats(2, Reserved(d.predicted_peak_switched - 1), d.version);
  tuner.WaitIdle();
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].kind, "job");
  EXPECT_EQ(pushes[1].tenant, "uid:1002");
  EXPECT_EQ(tuner.History("llama", 1)[0].sessions, (std::vector<uint64_t>{2, 3}));

  // A policy for one tenant's job leaves the other's: uid 1001's job off
  // keeps no window, uid 1002's stays applied.
  tuner.SetPolicy({.tenant = "uid:1001", .job = "llama"}, {.mode = AutotuneMode::kOff});
  status = tuner.Status();
  EXPECT_EQ(status[0].state, AutotuneJobState::kOff);
  EXPECT_EQ(status[0].policy.mode, AutotuneMode::kOff);
  EXPECT_EQ(status[1].state, AutotuneJobState::kApplied);
  EXPECT_EQ(status[1].policy.mode, AutotuneMode::kApply);
  // An admin's run of the label runs each tenant's job that is not off.
  EXPECT_EQ(tuner.RunNow("llama", "uid:1001").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tuner.RunNow("llama", "uid:1003").status().code(), absl::StatusCode::kNotFound);
}

// The bar for a push: the best config on the steps after it, from
// the state at the push. The canary's window holds both; when it ends, the
// push is replayed where it happened and judged on what came after.
TEST(AutotunerTest, APushIsReviewedOnTheEventsAfterItWhenItsCanaryEnds) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, true, "");
  const Trace& trace = LlamaLora();
  const size_t after_push = trace.events.size() - TrainingEvents();
  Feed(tuner, 1, trace, TrainingEvents(), trace.events.size());
  EXPECT_FALSE(tuner.History("llama", 1)[0].best_reachable_peak.has_value());
  tuner.SessionEnded(1);
  tuner.WaitIdle();
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  ASSERT_TRUE(after.best_reachable_peak.has_value()) << after.why;
  // The window leaves out frees of what it never saw allocated.
  EXPECT_LE(after.reviewed_events, after_push);
  EXPECT_GT(after.reviewed_events, after_push * 9 / 10);
  // No better than the best, no worse than staying on the job's config.
  ReplayOptions stay;
  stay.live_switch = LiveSwitch{TrainingEvents(), std::nullopt, std::nullopt};
  absl::StatusOr<ReplayResult> stayed =
      Replay(trace, *ParseAllocatorConfig("max_split_size_mb:64"), stay);
  ASSERT_TRUE(stayed.ok()) << stayed.status();
  EXPECT_LE(*after.best_reachable_peak, stayed->after_switch->peak_reserved);
  EXPECT_GE(*after.best_reachable_peak, stayed->after_switch->peak_allocated);
}

TEST(AutotunerTest, ANackRollsBackAndTheConfigIsNotProposedAgain) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, false, "PyTorch rejected it");
  tuner.WaitIdle();
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].kind, "rollback");
  EXPECT_EQ(pushes[1].target, 1u);
  EXPECT_EQ(*ParseAllocatorConfig(pushes[1].config), *ParseAllocatorConfig("max_split_size_mb:64"));
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kRolledBack);
  EXPECT_NE(after.why.find("PyTorch rejected it"), std::string::npos) << after.why;
  // An admin's run finds the same best config, and keeps.
  absl::StatusOr<uint64_t> id = tuner.RunNow("llama");
  ASSERT_TRUE(id.ok()) << id.status();
  tuner.WaitIdle();
  const AutotuneDecision again = tuner.History("llama", 1)[0];
  EXPECT_EQ(again.id, *id);
  EXPECT_EQ(again.trigger, AutotuneTrigger::kAdmin);
  EXPECT_EQ(again.result, AutotuneResult::kKept) << again.why;
  EXPECT_EQ(actions.pushes().size(), 2u);
}

// A job's features reach its decisions: one whose session shares CUDA
// tensors is never pushed expandable segments, and the decision says so.
TEST(AutotunerTest, ADecisionLeavesOutWhatTheJobsFeaturesBreak) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  tuner.SessionStarted(2, "llama", "max_split_size_mb:64", 1);
  JobFeatures shares;
  shares.cuda_ipc = true;
  tuner.Features(2, shares);  // another session's: the job's all the same
  FeedAll(tuner, 1);
  const AutotuneDecision d = tuner.History("llama", 1).at(0);
  ASSERT_FALSE(d.left_out.empty()) << d.why;
  EXPECT_EQ(d.left_out[0].config, "expandable_segments:True");
  EXPECT_NE(d.why.find("pidfd_getfd"), std::string::npos) << d.why;
  for (const FakeActions::Push& push : actions.pushes()) {
    EXPECT_FALSE(ParseAllocatorConfig(push.config)->expandable_segments) << push.config;
  }
  EXPECT_TRUE(tuner.Status()[0].features.cuda_ipc);
}

// A feature can appear after the push: a push it breaks is rolled back for
// good; one it does not break stays.
TEST(AutotunerTest, APushAFeatureReportedLaterBreaksIsRolledBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  ASSERT_TRUE(ParseAllocatorConfig(d.to_config)->expandable_segments) << d.to_config;
  tuner.Acked(1, d.version, true, "");
  JobFeatures graphs;
  graphs.cuda_graphs = true;
  tuner.Features(1, graphs);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  JobFeatures shares;
  shares.cuda_ipc = true;
  tuner.Features(2, shares);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kRolledBack);
  EXPECT_NE(after.why.find("session 2 now uses cuda_ipc"), std::string::npos) << after.why;
}

TEST(AutotunerTest, AnOomUnderThePushedVersionRollsBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, true, "");
  tuner.Oom(1, d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  EXPECT_EQ(tuner.History("llama", 1)[0].result, AutotuneResult::kRolledBack);
  EXPECT_EQ(tuner.Status()[0].state, AutotuneJobState::kWatching);
  // A push rolled back is not judged on what came after it.
  tuner.SessionEnded(1);
  tuner.WaitIdle();
  EXPECT_FALSE(tuner.History("llama", 1)[0].best_reachable_peak.has_value());
}

TEST(AutotunerTest, ARealisedPeakWorseThanPredictedRollsBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, true, "");
  // What staying was predicted to cost, for what the job needed in the window.
  tuner.Stats(1, Reserved(d.predicted_peak_current, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kRolledBack);
  EXPECT_NE(after.why.find("realised peak"), std::string::npos) << after.why;
}

// Later steps of a job with dynamic shapes need more memory under any
// config (on the H100, llama_lora's steps after a first pass at step 3
// allocated 1.2x the window's peak): that is no reason to roll back.
// A push that kept most of its promise stays, though it missed the
// prediction by more than the margin (under ASan the sim job got its push
// later in a step than predicted: 4.90 GiB against 4.42, where staying
// costs 19.73).
TEST(AutotunerTest, APushThatKeptMostOfItsSavingIsNotRolledBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, true, "");
  ASSERT_GT(d.predicted_peak_current, 2 * d.predicted_peak_switched);
  tuner.Stats(1, Reserved(d.predicted_peak_switched * 12 / 10, d.predicted_peak_allocated),
              d.version);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  EXPECT_EQ(tuner.History("llama", 1)[0].result, AutotuneResult::kPushed);
}

TEST(AutotunerTest, AJobThatAllocatesMoreLaterIsNotRolledBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  ASSERT_GT(d.predicted_peak_allocated, 0);
  tuner.Acked(1, d.version, true, "");
  tuner.Stats(1, Reserved(d.predicted_peak_switched * 13 / 10, d.predicted_peak_allocated * 13 / 10),
              d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 1u);
  EXPECT_EQ(tuner.History("llama", 1)[0].result, AutotuneResult::kPushed);
  // The same job losing most of the saving on what it allocates is.
  tuner.Stats(1, Reserved(d.predicted_peak_current * 13 / 10 * 8 / 10,
                          d.predicted_peak_allocated * 13 / 10),
              d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  EXPECT_NE(tuner.History("llama", 1)[0].why.find("scaled by the job"), std::string::npos);
}

// The canary (session 1) asks for `bytes` once, and frees it.
void AskOnce(Autotuner& tuner, int64_t bytes) {
  const uint64_t stream = LlamaLora().streams[0];
  tuner.Events(1, {{TraceOp::kAlloc, stream, 0xA110C, static_cast<uint64_t>(bytes)},
                   {TraceOp::kFreeRequested, stream, 0xA110C, 0}},
               0);
}

// The growth that excuses a realised peak is measured on the canary's own
// stream once it sends events after the push: a job that resets PyTorch's
// peak every step (as ddp_train.py does) reports the window's need however
// much more its later steps ask for; and a report of growth the stream
// does not show excuses nothing: the push is judged on those events.
TEST(AutotunerTest, GrowthIsMeasuredOnTheCanarysStreamWhichNoJobResets) {
  for (const bool grew : {true, false}) {
    SCOPED_TRACE(grew ? "the stream grew" : "only the report grew");
    FakeClock clock;
    FakeActions actions;
    Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
    const AutotuneDecision d = PushToCanary(tuner, actions);
    ASSERT_GT(d.predicted_peak_requested, 0);
    ASSERT_GT(d.predicted_peak_current, 2 * d.predicted_peak_switched);
    tuner.Acked(1, d.version, true, "");
    // A step after the push asks for twice (or a tenth of) the window's most.
    AskOnce(tuner, grew ? 2 * d.predicted_peak_requested : d.predicted_peak_requested / 10);
    // 90% of what staying was predicted to cost: with the job's growth
    // (2x) well under what staying costs it, without it nearer to staying.
    const int64_t allocated_report = grew ? d.predicted_peak_allocated : 3 * d.predicted_peak_allocated;
    tuner.Stats(1, Reserved(d.predicted_peak_current * 9 / 10, allocated_report), d.version);
    tuner.WaitIdle();
    const AutotuneDecision after = tuner.History("llama", 1)[0];
    EXPECT_EQ(after.result, AutotuneResult::kPushed) << after.why;
    EXPECT_EQ(after.staying_after_push.has_value(), !grew) << after.why;
  }
}

// A push's prediction is carried to the steps the job really ran: scaled by
// how much more the canary's stream requested after the push than the
// window's events did, never below what the decision predicted; a stream
// that requested more than that by over 5% is predicted again on its own
// events (below).
TEST(AutotunerTest, APushsPredictionStandsForStepsThatRequestNoMore) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  ASSERT_GT(d.predicted_peak_requested, 0);
  EXPECT_FALSE(d.predicted_peak_at_need.has_value());
  tuner.Acked(1, d.version, true, "");
  AskOnce(tuner, d.predicted_peak_requested / 10);
  tuner.WaitIdle();
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  ASSERT_TRUE(after.realized_peak_requested.has_value());
  ASSERT_TRUE(after.predicted_peak_at_need.has_value());
  EXPECT_LE(*after.realized_peak_requested, d.predicted_peak_requested);
  EXPECT_EQ(*after.predicted_peak_at_need, d.predicted_peak_switched);
  EXPECT_EQ(after.at_need_basis, "");
}

// The canary's stream under watch (no decision runs then) requesting more
// than the standing prediction covered by over 5%, once that peak has
// passed: the pushed config is replayed on the events the canary ran after
// the push, and that replay stands for the prediction. A little more than
// it covered scales it; 5% more replays again.
TEST(AutotunerTest, AWatchedCanaryThatRequestsMoreIsPredictedAgainOnItsOwnEvents) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToCanary(tuner, actions);
  tuner.Acked(1, d.version, true, "");
  const int64_t grown = 3 * d.predicted_peak_requested / 2;
  AskOnce(tuner, grown);
  tuner.WaitIdle();
  const AutotuneDecision replayed = tuner.History("llama", 1)[0];
  ASSERT_TRUE(replayed.realized_peak_requested.has_value());
  ASSERT_TRUE(replayed.predicted_peak_at_need.has_value());
  const int64_t covered = *replayed.realized_peak_requested;
  EXPECT_GE(covered, grown);
  EXPECT_NE(replayed.at_need_basis.find(
                "replayed on the 2 events the canary ran after the push (requesting at most " +
                absl::StrFormat("%.2f GiB)", static_cast<double>(covered) / (1 << 30))),
            std::string::npos)
      << replayed.at_need_basis;
  // The replay held what the stream held: nothing is left to scale, and it
  // reserves at least that.
  EXPECT_GE(*replayed.predicted_peak_at_need, covered);

  AskOnce(tuner, grown + covered / 50);
  tuner.WaitIdle();
  const AutotuneDecision scaled = tuner.History("llama", 1)[0];
  EXPECT_EQ(scaled.at_need_basis, replayed.at_need_basis);
  ASSERT_GT(*scaled.realized_peak_requested, covered);
  EXPECT_NEAR(static_cast<double>(*scaled.predicted_peak_at_need),
              static_cast<double>(*replayed.predicted_peak_at_need) *
                  static_cast<double>(*scaled.realized_peak_requested) /
                  static_cast<double>(covered),
              1.0);

  AskOnce(tuner, 2 * grown);
  tuner.WaitIdle();
  const AutotuneDecision again = tuner.History("llama", 1)[0];
  EXPECT_NE(again.at_need_basis.find(absl::StrFormat(
                "(requesting at most %.2f GiB)",
                static_cast<double>(*again.realized_peak_requested) / (1 << 30))),
            std::string::npos)
      << again.at_need_basis;
  EXPECT_GE(*again.predicted_peak_at_need, *again.realized_peak_requested);
  EXPECT_EQ(again.result, AutotuneResult::kPushed);
}

TEST(AutotunerTest, ARestartedDaemonDoesNotPushTheConfigAgain) {
  FakeClock clock;
  std::string autotuned;
  {
    FakeActions actions;
    Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
    tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
    FeedAll(tuner, 1);
    autotuned = tuner.History("llama", 1)[0].to_config;
    ASSERT_FALSE(autotuned.empty());
  }
  // The new daemon: the client reconnects and declares what it runs.
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(7, "llama", autotuned, 3);
  FeedAll(tuner, 7);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].result, AutotuneResult::kKept) << history[0].why;
  EXPECT_TRUE(actions.pushes().empty());
}

TEST(AutotunerTest, AtMostThreadsReplaysAtOnce) {
  for (int threads : {1, 2}) {
    FakeClock clock;
    FakeActions actions;
    AutotuneOptions options = Options(clock, AutotuneMode::kRecommend);
    options.threads = threads;
    std::atomic<int> running{0};
    std::atomic<int> most{0};
    options.on_replay = [&](int delta) {
      const int now = running += delta;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
    };
    Autotuner tuner(options, &actions);
    // Three jobs decide at about the same time.
    for (SessionId s : {1, 2, 3}) {
      tuner.SessionStarted(s, "job" + std::to_string(s), "max_split_size_mb:64", 1);
    }
    for (SessionId s : {1, 2, 3}) {
      Feed(tuner, s, LlamaLora(), 0, TrainingEvents(), SIZE_MAX);
    }
    tuner.WaitIdle();
    EXPECT_EQ(tuner.History("", 10).size(), 3u);
    EXPECT_GE(most.load(), 1);
    EXPECT_LE(most.load(), threads);
    EXPECT_EQ(running.load(), 0);
  }
}

TEST(AutotunerTest, TriggersAreDebouncedByTheCooldown) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  ASSERT_EQ(actions.runs(), 1);
  // Retries within the cooldown start nothing.
  for (int64_t retries = 1; retries <= 5; ++retries) {
    tuner.Stats(1, {{"num_alloc_retries", retries}}, 1);
  }
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 1);
  clock.Advance(absl::Minutes(6));
  for (int64_t retries = 6; retries <= 10; ++retries) {
    tuner.Stats(1, {{"num_alloc_retries", retries}}, 1);
  }
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 2);
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, AutotuneTrigger::kAllocRetry);
  // Fragmentation must last fragmentation_for.
  clock.Advance(absl::Minutes(6));
  const std::map<std::string, int64_t> fragmented = {
      {"reserved_bytes.all.current", int64_t{3} << 30},
      {"allocated_bytes.all.current", int64_t{1} << 30}};
  tuner.Stats(1, fragmented, 1);
  clock.Advance(absl::Seconds(10));
  tuner.Stats(1, fragmented, 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 2);
  clock.Advance(absl::Seconds(25));
  tuner.Stats(1, fragmented, 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 3);
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, AutotuneTrigger::kFragmentation);
}

// A session that sends stats but no events yet (a learned run leaves its
// stream off until it outgrows what was learned, or runs out of memory):
// retries, growth, fragmentation and an OOM wait for a window to replay;
// its first pass is still the first decision, and triggers work as ever.
TEST(AutotunerTest, TriggersWaitForTheJobsFirstEvents) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  const std::map<std::string, int64_t> fragmented = {
      {"reserved_bytes.all.current", int64_t{3} << 30},
      {"allocated_bytes.all.current", int64_t{1} << 30},
      {"num_alloc_retries", 4}};
  for (int i = 0; i < 4; ++i) {
    tuner.Stats(1, fragmented, 1);
    clock.Advance(absl::Seconds(20));
  }
  tuner.Oom(1, 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 0);
  EXPECT_TRUE(tuner.History("llama", 10).empty());

  FeedAll(tuner, 1);
  tuner.WaitIdle();
  const int first = actions.runs();
  ASSERT_EQ(first, 1);  // the first pass, on the events
  // (named for its harmful start config, max_split_size_mb:64), not the OOM.
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, AutotuneTrigger::kBadStartConfig);
  clock.Advance(absl::Minutes(6));
  tuner.Stats(1, {{"num_alloc_retries", 5}}, 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), first + 1);
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, AutotuneTrigger::kAllocRetry);
}

// A job is decided on one session's stream: the first. When it ends, the
// next session's is read: all of it, for a job not yet decided; from the
// need its last decision settled on plus the growth margin, for one decided.
TEST(AutotunerTest, TheNextSessionIsToldWhatOfItsStreamIsReadWhenTheRecordedOneEnds) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "", 1);
  tuner.SessionStarted(2, "llama", "", 1);
  tuner.SessionStarted(3, "llama", "", 1);
  EXPECT_EQ(tuner.StreamReadFrom(1), 0u);
  EXPECT_EQ(tuner.StreamReadFrom(2), kStreamNotRead);
  EXPECT_EQ(tuner.StreamReadFrom(99), 0u);  // not the autotuner's session
  tuner.SessionEnded(1);
  EXPECT_EQ(tuner.StreamReadFrom(2), 0u);
  using Demand = std::pair<SessionId, uint64_t>;
  EXPECT_EQ(actions.demands(), std::vector<Demand>{Demand(2, 0)});

  FeedAll(tuner, 2);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> decided = tuner.History("llama", 1);
  ASSERT_EQ(decided.size(), 1u);
  ASSERT_NE(decided[0].result, AutotuneResult::kSkipped);
  const int64_t need = decided[0].result == AutotuneResult::kPushed
                           ? decided[0].predicted_peak_switched
                           : decided[0].predicted_peak_current;
  ASSERT_GT(need, 0);
  tuner.SessionEnded(2);
  const double margin = Options(clock, AutotuneMode::kRecommend).growth_margin;
  EXPECT_EQ(actions.demands().back(), Demand(3, GrownPast(need, margin)));
}

TEST(AutotunerTest, ASessionThatStartsAfterItsJobSettledIsReadOnlyOnceItOutgrowsIt) {
  // The next run of a job whose first pass kept its config, or a process
  // restarted: the job is decided, and its stream has nothing to tell the
  // autotuner until it needs more than the job settled at.
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "", 1);
  FeedAll(tuner, 1);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> decided = tuner.History("llama", 1);
  ASSERT_EQ(decided.size(), 1u);
  ASSERT_NE(decided[0].result, AutotuneResult::kSkipped);
  ASSERT_NE(decided[0].result, AutotuneResult::kPushed);
  tuner.SessionEnded(1);
  tuner.WaitIdle();  // the review at the session's end
  tuner.SessionStarted(2, "llama", "", 1);
  // What the newest decision predicted the job's config needs (the
  // history is newest first).
  int64_t need = 0;
  for (const AutotuneDecision& d : tuner.History("llama", 10)) {
    if (d.result != AutotuneResult::kSkipped) {
      need = d.predicted_peak_current;
      break;
    }
  }
  ASSERT_GT(need, 0);
  const double margin = Options(clock, AutotuneMode::kRecommend).growth_margin;
  EXPECT_EQ(tuner.StreamReadFrom(2), GrownPast(need, margin));
  // An undecided job's new session is read from its start.
  tuner.SessionStarted(3, "fresh", "", 1);
  EXPECT_EQ(tuner.StreamReadFrom(3), 0u);
}

TEST(AutotunerTest, AJobTurnedOffReadsNothingOfItsStreamAndTurnedOnReadsItAgain) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kOff), &actions);
  tuner.SessionStarted(1, "llama", "", 1);
  EXPECT_EQ(tuner.StreamReadFrom(1), kStreamNotRead);  // at its registration
  JobPolicy recommend;
  recommend.mode = AutotuneMode::kRecommend;
  tuner.SetPolicy({.job = "llama"}, recommend);
  using Demand = std::pair<SessionId, uint64_t>;
  EXPECT_EQ(actions.demands(), std::vector<Demand>{Demand(1, 0)});
  EXPECT_EQ(tuner.StreamReadFrom(1), 0u);
  tuner.SetPolicy({.job = "llama"}, recommend);  // no change: no demand
  EXPECT_EQ(actions.demands().size(), 1u);
  JobPolicy off;
  off.mode = AutotuneMode::kOff;
  tuner.SetPolicy({.job = "llama"}, off);
  EXPECT_EQ(actions.demands().back(), Demand(1, kStreamNotRead));
}

TEST(AutotunerTest, OffKeepsNoWindowAndRunsNothing) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kOff), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  EXPECT_EQ(actions.runs(), 0);
  EXPECT_EQ(tuner.Status()[0].state, AutotuneJobState::kOff);
  EXPECT_EQ(tuner.Status()[0].window_events, 0u);
  EXPECT_EQ(tuner.RunNow("llama").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tuner.RunNow("nobody").status().code(), absl::StatusCode::kNotFound);
  // A per-job policy turns it on.
  JobPolicy recommend;
  recommend.mode = AutotuneMode::kRecommend;
  tuner.SetPolicy({.job = "llama"}, recommend);
  FeedAll(tuner, 1);
  EXPECT_EQ(actions.runs(), 1);
}

TEST(AutotunerTest, AnAdminRunOnATooSmallWindowIsSkipped) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "small", "", 1);
  Feed(tuner, 1, LlamaLora(), 0, 500);
  absl::StatusOr<uint64_t> id = tuner.RunNow("small");
  ASSERT_TRUE(id.ok());
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> history = tuner.History("small", 5);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].id, *id);
  EXPECT_EQ(history[0].result, AutotuneResult::kSkipped);
  EXPECT_NE(history[0].why.find("fewer than"), std::string::npos) << history[0].why;
}

TEST(AutotunerTest, AGapInTheWindowSkipsTheRun) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "gappy", "max_split_size_mb:64", 1);
  Feed(tuner, 1, LlamaLora(), 0, 1000);
  tuner.Events(1, {}, 42);
  Feed(tuner, 1, LlamaLora(), 1000, 3000);
  tuner.WaitIdle();
  EXPECT_EQ(tuner.Status()[0].dropped_events, 42u);
  ASSERT_TRUE(tuner.RunNow("gappy").ok());
  tuner.WaitIdle();
  const AutotuneDecision d = tuner.History("gappy", 1)[0];
  EXPECT_EQ(d.result, AutotuneResult::kSkipped);
  EXPECT_NE(d.why.find("dropped"), std::string::npos) << d.why;
  EXPECT_TRUE(actions.pushes().empty());
}

// An advisor loses a few events between reading PyTorch's history and
// clearing it (measured on the H100: 15 of 416,255 for llama_lora): that
// must not keep a job from ever being tuned.
TEST(AutotunerTest, AFewLostEventsDoNotHoldTheJobBack) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "busy", "max_split_size_mb:64", 1);
  Feed(tuner, 1, LlamaLora(), 0, 3000);
  tuner.Events(1, {}, 2);
  Feed(tuner, 1, LlamaLora(), 3000, 6000);
  ASSERT_TRUE(tuner.RunNow("busy").ok());
  tuner.WaitIdle();
  const AutotuneDecision d = tuner.History("busy", 1)[0];
  EXPECT_EQ(d.why.find("dropped"), std::string::npos) << d.why;
}


// --- steps the job marks, aperiodic jobs, judging a push, growth

constexpr uint64_t kMiB = uint64_t{1} << 20;

AutotuneOptions SmallJobOptions(FakeClock& clock, AutotuneMode mode) {
  AutotuneOptions options = Options(clock, mode);
  options.first_pass_min_events = 200;
  options.aperiodic_after_events = 4000;
  return options;
}

// A training job as a client with the optimizer hook sends it, a step per
// call: weights, then steps whose activations vary in size from step to
// step (dynamic shapes), the optimizer's state made by the first step, and
// a step mark after each optimizer step when `marks`.
class TrainingJob {
 public:
  TrainingJob(Autotuner& tuner, SessionId session, bool marks)
      : tuner_(tuner), session_(session), marks_(marks) {
    std::vector<EvidenceEvent> weights;
    for (int i = 0; i < 20; ++i) weights.push_back(Alloc(96 * kMiB));
    tuner_.Events(session_, weights, 0);
  }

  void Step() {
    std::vector<EvidenceEvent> events;
    std::vector<uint64_t> live;
    for (int layer = 0; layer < 48; ++layer) {
      events.push_back(Alloc((40 + (layer * 37 + step_ * 11) % 90) * kMiB));
      live.push_back(events.back().id);
      events.push_back(Alloc(4096 + 512 * (layer % 7)));
      live.push_back(events.back().id);
    }
    for (auto it = live.rbegin(); it != live.rend(); ++it) {
      events.push_back({TraceOp::kFreeCompleted, kStream, *it, 0});
    }
    if (step_ == 0) {
      for (int i = 0; i < 20; ++i) events.push_back(Alloc(96 * kMiB));
    }
    if (marks_) events.push_back({kStepMark, 0, 0, 0});
    tuner_.Events(session_, events, 0);
    ++step_;
  }

 private:
  static constexpr uint64_t kStream = 7;
  EvidenceEvent Alloc(uint64_t size) { return {TraceOp::kAlloc, kStream, next_id_++, size}; }

  Autotuner& tuner_;
  const SessionId session_;
  const bool marks_;
  int step_ = 0;
  uint64_t next_id_ = 1;
};

// Steps until the job's first decision (at most `most`); returns how many.
int StepsUntilDecided(Autotuner& tuner, TrainingJob& job, const std::string& name, int most) {
  for (int steps = 1; steps <= most; ++steps) {
    job.Step();
    tuner.WaitIdle();
    if (!tuner.History(name, 1).empty()) return steps;
  }
  return most + 1;
}

// The issue's jobs waited for a full 1 Mi-event window ("no repeating step
// found"). A job that marks its steps is decided on once it has marked
// three: its first step (a warm-up: the optimizer's state comes then) and
// two whole steps after it, within three steps of its first full one.
TEST(AutotunerTest, AJobThatMarksItsStepsIsDecidedOnWithinThreeSteps) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "marked", "", 1);
  TrainingJob job(tuner, 1, /*marks=*/true);
  EXPECT_EQ(StepsUntilDecided(tuner, job, "marked", 10), 3);
  const AutotuneDecision d = tuner.History("marked", 1)[0];
  EXPECT_EQ(d.trigger, AutotuneTrigger::kFirstPass);
  EXPECT_NE(d.result, AutotuneResult::kSkipped) << d.why;
  EXPECT_NE(d.why.find("the job marked 3 steps"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("2 whole steps the job marked"), std::string::npos) << d.why;
}

// A push to a job that marks its steps is judged once two steps ran under
// it: a realised peak that reaches the daemon right after the ACK (the move
// from the old config's memory, or before the events it came from) rolls
// nothing back on its own.
TEST(AutotunerTest, APushIsJudgedOnlyAfterTwoMarkedStepsUnderIt) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const size_t pushed_at = TrainingEvents() * 2 / 3;
  const AutotuneDecision d = PushToCanary(tuner, actions, pushed_at);
  const std::vector<EvidenceEvent> mark = {{kStepMark, 0, 0, 0}};
  tuner.Events(1, mark, 0);  // the job marks its steps
  tuner.Acked(1, d.version, true, "");
  // What staying was predicted to cost, reported at once.
  const auto report_staying = [&] {
    tuner.Stats(1, Reserved(d.predicted_peak_current, d.predicted_peak_allocated), d.version);
    tuner.WaitIdle();
  };
  report_staying();
  EXPECT_EQ(actions.pushes().size(), 1u);
  const size_t half = (pushed_at + TrainingEvents()) / 2;
  Feed(tuner, 1, LlamaLora(), pushed_at, half);
  tuner.Events(1, mark, 0);
  report_staying();
  EXPECT_EQ(actions.pushes().size(), 1u);
  EXPECT_EQ(tuner.History("llama", 1)[0].judged_events, 0u);
  // Two steps under it: judged on their events.
  Feed(tuner, 1, LlamaLora(), half, TrainingEvents());
  tuner.Events(1, mark, 0);
  report_staying();
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_GT(after.judged_events, 0u) << after.why;
}

// A start config known to be harmful is decided on after the job's first
// whole step.
TEST(AutotunerTest, AHarmfulStartConfigIsDecidedOnAfterTheFirstWholeStep) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "harmful", "max_split_size_mb:64", 1);
  TrainingJob job(tuner, 1, /*marks=*/true);
  EXPECT_EQ(StepsUntilDecided(tuner, job, "harmful", 10), 2);
  const AutotuneDecision d = tuner.History("harmful", 1)[0];
  EXPECT_EQ(d.trigger, AutotuneTrigger::kBadStartConfig);
  EXPECT_NE(d.why.find("1 whole steps the job marked"), std::string::npos) << d.why;
}

// The client releases the cache again at a job's first step mark after a
// push (what was live at the switch is freed by then): a replay of the
// pushed config on the canary's events does too. A job that marks no steps
// is released at lows its stream does not show: its replay makes none.
TEST(AutotunerTest, AReplayAfterAPushReleasesTheCacheAgainAtTheJobsFirstMarkAfterIt) {
  for (const bool marks : {true, false}) {
    SCOPED_TRACE(marks ? "marks its steps" : "marks none");
    FakeClock clock;
    FakeActions actions;
    Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
    const AutotuneDecision d = PushToCanary(tuner, actions);
    tuner.Acked(1, d.version, true, "");
    AskOnce(tuner, d.predicted_peak_requested / 10);  // the rest of the step
    if (marks) tuner.Events(1, {{kStepMark, 0, 0, 0}}, 0);
    AskOnce(tuner, 2 * d.predicted_peak_requested);
    tuner.WaitIdle();
    const AutotuneDecision after = tuner.History("llama", 1)[0];
    ASSERT_NE(after.at_need_basis.find("replayed on the"), std::string::npos)
        << after.at_need_basis;
    EXPECT_EQ(after.at_need_basis.find("released again at the job's first step mark") !=
                  std::string::npos,
              marks)
        << after.at_need_basis;
  }
}

// Batched generation: no optimizer, so no marks, and a KV cache that grows
// token by token. Each request ends by freeing what it allocated.
class GenerationJob {
 public:
  GenerationJob(Autotuner& tuner, SessionId session) : tuner_(tuner), session_(session) {
    std::vector<EvidenceEvent> weights;
    for (int i = 0; i < 10; ++i) weights.push_back(Alloc(100 * kMiB));
    tuner_.Events(session_, weights, 0);
  }

  // A request of `batch` sequences generating 30 tokens.
  void Request(int batch) {
    std::vector<EvidenceEvent> events;
    uint64_t kv = 0;
    for (int token = 1; token <= 30; ++token) {
      events.push_back(Alloc(static_cast<uint64_t>(batch) * (64 + 8 * token) * kMiB));
      const uint64_t grown = events.back().id;
      if (kv != 0) events.push_back({TraceOp::kFreeCompleted, kStream, kv, 0});
      kv = grown;
      std::vector<uint64_t> temps;
      for (int layer = 0; layer < 12; ++layer) {
        events.push_back(Alloc(static_cast<uint64_t>(batch) * (3 + layer % 5) * kMiB));
        temps.push_back(events.back().id);
      }
      for (uint64_t t : temps) events.push_back({TraceOp::kFreeCompleted, kStream, t, 0});
    }
    events.push_back({TraceOp::kFreeCompleted, kStream, kv, 0});
    tuner_.Events(session_, events, 0);
  }

  // Requests of batches 1, 2, 4, 2, 1, 2, 1, 2, each waited on, until the
  // job named `job` has a decision; how many were made.
  int RequestUntilDecided(const std::string& job) {
    int requests = 0;
    for (const int batch : {1, 2, 4, 2, 1, 2, 1, 2}) {
      Request(batch);
      tuner_.WaitIdle();
      ++requests;
      if (!tuner_.History(job, 1).empty()) break;
    }
    return requests;
  }

 private:
  static constexpr uint64_t kStream = 9;
  EvidenceEvent Alloc(uint64_t size) { return {TraceOp::kAlloc, kStream, next_id_++, size}; }

  Autotuner& tuner_;
  const SessionId session_;
  uint64_t next_id_ = 1;
};

// The generation job was decided on its first few small requests
// (a decoded token taken for a step). An aperiodic job is decided on a
// window that holds its largest request so far, and again when a larger
// one has come.
TEST(AutotunerTest, AnAperiodicJobIsDecidedOnItsLargestRequestAndAgainOnALargerOne) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "generate", "", 1);
  GenerationJob job(tuner, 1);
  const int requests = job.RequestUntilDecided("generate");
  const std::vector<AutotuneDecision> first = tuner.History("generate", 10);
  ASSERT_EQ(first.size(), 1u) << "no decision after " << requests << " requests";
  EXPECT_EQ(first[0].trigger, AutotuneTrigger::kFirstPass);
  EXPECT_GE(first[0].window_events, 4000u);
  EXPECT_NE(first[0].why.find("aperiodic"), std::string::npos) << first[0].why;
  EXPECT_NE(first[0].why.find("the job's largest request so far"), std::string::npos)
      << first[0].why;
  // The prediction covers the batch-4 request: it needs more than any other.
  EXPECT_GE(first[0].predicted_peak_requested, int64_t{10} * 100 * kMiB + 4 * 304 * kMiB);

  // Requests no larger than the largest so far decide nothing (within the
  // cooldown or not); a larger one does once it has peaked.
  job.Request(2);
  tuner.WaitIdle();
  EXPECT_EQ(tuner.History("generate", 10).size(), 1u);
  job.Request(8);
  job.Request(1);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> again = tuner.History("generate", 10);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].trigger, AutotuneTrigger::kLargerRequest);
  EXPECT_GE(again[0].predicted_peak_requested, int64_t{10} * 100 * kMiB + 8 * 304 * kMiB)
      << again[0].why;
}

// `count` decoded tokens on `stream`: each allocates twelve temporaries of
// 3-7 MiB and frees them, a repeat of 24 events. Ids from `next_id` on.
std::vector<EvidenceEvent> DecodedTokens(int count, uint64_t stream, uint64_t& next_id) {
  std::vector<EvidenceEvent> tokens;
  for (int token = 0; token < count; ++token) {
    const uint64_t first = next_id;
    for (int layer = 0; layer < 12; ++layer) {
      tokens.push_back({TraceOp::kAlloc, stream, next_id++, (3 + layer % 5) * kMiB});
    }
    for (uint64_t id = first; id < next_id; ++id) {
      tokens.push_back({TraceOp::kFreeCompleted, stream, id, 0});
    }
  }
  return tokens;
}

// Feeds session 1 of `job` what `next` makes, a call at a time, until the
// job's first decision or `most` events (counted on in `fed`); returns its
// decisions.
std::vector<AutotuneDecision> FeedUntilDecided(
    Autotuner& tuner, const std::string& job, size_t most, size_t& fed,
    const std::function<std::vector<EvidenceEvent>()>& next) {
  while (tuner.History(job, 1).empty() && fed < most) {
    const std::vector<EvidenceEvent> events = next();
    tuner.Events(1, events, 0);
    fed += events.size();
    tuner.WaitIdle();
  }
  return tuner.History(job, 1);
}

// Decoding into a cache allocated once (a static KV cache, a diffusion
// sampler's latents): every token allocates and frees the same
// temporaries, a repeat the stream's step finder takes for a step. Under
// `allocd run` the stream began mid-call on the H200, a 75-event token
// passed for a generation job's step, and the job was decided on 1,078
// events. A client that marks its optimizer steps and has marked none runs
// no optimizer: it is aperiodic, whatever repeats in its stream.
TEST(AutotunerTest, AJobWhoseClientMarksStepsButMarkedNoneIsNeverDecidedOnARepeat) {
  for (const bool marks_steps : {false, true}) {
    SCOPED_TRACE(marks_steps ? "the client marks steps" : "a client that cannot mark");
    FakeClock clock;
    FakeActions actions;
    const AutotuneOptions options = SmallJobOptions(clock, AutotuneMode::kRecommend);
    Autotuner tuner(options, &actions);
    tuner.SessionStarted(1, "decode", "", 1, "", marks_steps);
    constexpr uint64_t kStream = 9;
    uint64_t next_id = 1;
    tuner.Events(1, {{TraceOp::kAlloc, kStream, next_id++, 900 * kMiB}}, 0);  // the cache
    size_t events = 1;
    const std::vector<AutotuneDecision> d =
        FeedUntilDecided(tuner, "decode", 3 * options.aperiodic_after_events, events,
                         [&] { return DecodedTokens(10, kStream, next_id); });
    ASSERT_EQ(d.size(), 1u) << "no decision after " << events << " events";
    if (marks_steps) {
      EXPECT_GE(d[0].window_events, options.aperiodic_after_events);
      EXPECT_NE(d[0].why.find("marks optimizer steps and it marked none"), std::string::npos)
          << d[0].why;
    } else {
      EXPECT_LT(d[0].window_events, options.aperiodic_after_events) << d[0].why;
      EXPECT_NE(d[0].why.find("a step found in the stream"), std::string::npos) << d[0].why;
    }
  }
}

// The same holds for the decisions other triggers start before the first
// pass: a decoding job whose cache stays reserved after a larger call looks
// fragmented, and the fragmentation trigger's decision found a 9-event
// "step" in the repeat of python_advise's generating job (its client marks
// steps), when the suite ran beside heavier tests and that trigger came
// before the aperiodic first pass.
TEST(AutotunerTest, NoTriggerDecidesOnARepeatOfAJobWhoseClientMarksStepsButMarkedNone) {
  FakeClock clock;
  FakeActions actions;
  const AutotuneOptions options = SmallJobOptions(clock, AutotuneMode::kRecommend);
  Autotuner tuner(options, &actions);
  tuner.SessionStarted(1, "decode", "", 1, "", /*marks_steps=*/true);
  constexpr uint64_t kStream = 9;
  uint64_t next_id = 1;
  tuner.Events(1, {{TraceOp::kAlloc, kStream, next_id++, 900 * kMiB}}, 0);  // the cache
  const std::vector<EvidenceEvent> tokens = DecodedTokens(60, kStream, next_id);  // 1,440 events
  ASSERT_LT(tokens.size() + 1, options.aperiodic_after_events);
  tuner.Events(1, tokens, 0);
  tuner.WaitIdle();
  ASSERT_TRUE(tuner.History("decode", 1).empty());
  const std::map<std::string, int64_t> fragmented = {
      {"reserved_bytes.all.current", int64_t{3} << 30},
      {"allocated_bytes.all.current", int64_t{1} << 30}};
  tuner.Stats(1, fragmented, 1);
  clock.Advance(options.fragmentation_for + absl::Seconds(5));
  tuner.Stats(1, fragmented, 1);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> d = tuner.History("decode", 1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].trigger, AutotuneTrigger::kFragmentation);
  EXPECT_NE(d[0].why.find("marks optimizer steps and it marked none"), std::string::npos)
      << d[0].why;
  EXPECT_EQ(d[0].why.find("a step found in the stream"), std::string::npos) << d[0].why;
  // Its prediction covers the cache, the largest request.
  EXPECT_GE(d[0].predicted_peak_requested, int64_t{900} * kMiB) << d[0].why;
}

// Decoding batches of growing length, on PyTorch's guide's
// max_split_size_mb:64: each batch's KV cache is larger than the last one's,
// and its tokens' temporaries come and go. Returns the events.
std::vector<EvidenceEvent> GrowingBatches(int batches, uint64_t stream, uint64_t& next_id) {
  std::vector<EvidenceEvent> events;
  for (int batch = 0; batch < batches; ++batch) {
    const uint64_t cache = next_id++;
    events.push_back({TraceOp::kAlloc, stream, cache, (96 + 24 * (batch % 4)) * kMiB});
    for (const EvidenceEvent& e : DecodedTokens(6, stream, next_id)) events.push_back(e);
    events.push_back({TraceOp::kFreeCompleted, stream, cache, 0});
  }
  return events;
}

// With --autotune-prior off a job started on a harmful config is pushed
// early, before it has a whole step. On a DDP rank's first 3,428 events
// PyTorch's defaults peaked lowest of 22 candidates and were pushed; over
// the whole run they peaked 37-66% above expandable segments. Such a window
// cannot tell configs apart within a few percent: the safe config is
// pushed unless another peaks at least min_saving below it.
TEST(AutotunerTest, AHarmfulStartDecidedBeforeAWholeStepIsPushedItsSafeConfig) {
  FakeClock clock;
  FakeActions actions;
  const AutotuneOptions options = SmallJobOptions(clock, AutotuneMode::kRecommend);
  Autotuner tuner(options, &actions);
  tuner.SessionStarted(1, "decode", "max_split_size_mb:64", 1, "", /*marks_steps=*/true);
  constexpr uint64_t kStream = 9;
  uint64_t next_id = 1;
  size_t events = 0;
  const std::vector<AutotuneDecision> d =
      FeedUntilDecided(tuner, "decode", 3 * options.aperiodic_after_events, events,
                       [&] { return GrowingBatches(2, kStream, next_id); });
  ASSERT_EQ(d.size(), 1u) << "no decision after " << events << " events";
  EXPECT_EQ(d[0].trigger, AutotuneTrigger::kBadStartConfig);
  EXPECT_EQ(d[0].result, AutotuneResult::kRecommended) << d[0].why;
  EXPECT_EQ(d[0].to_config, "expandable_segments:True") << d[0].why;
  // The defaults peaked as low on this window, and were ranked first.
  EXPECT_NE(d[0].why.find("chosen over (defaults), which peaks as low"), std::string::npos)
      << d[0].why;
  EXPECT_NE(d[0].why.find("the safe one for the job's harmful start"), std::string::npos)
      << d[0].why;
}

// A job whose client lost most of its events early (a history ring
// overrun before the first pass): every pass is skipped while the gap is in
// the window, which a generation job's stream took minutes to push out on
// the H200. The client's next allocator state, taken after the gap, ends
// the wait: the window restarts there and the first pass replays from it.
TEST(AutotunerTest, AStateAfterAGapEndsTheWaitForTheGapToLeaveTheWindow) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "generate", "", 1);
  GenerationJob job(tuner, 1);  // its weights: ids 1-10, 100 MiB each
  tuner.Events(1, {}, 100000);
  job.RequestUntilDecided("generate");
  ASSERT_TRUE(tuner.History("generate", 1).empty()) << tuner.History("generate", 1)[0].why;
  const uint64_t with_gap = tuner.Status()[0].window_events;

  // Between requests only the weights are held.
  AllocatorSnapshot weights;
  for (uint64_t i = 0; i < 10; ++i) {
    const uint64_t address = 0x7F0000000000 + i * 100 * kMiB;
    weights.segments.push_back({address, 100 * kMiB, 9, false, false});
    weights.blocks.push_back({i + 1, address, 100 * kMiB, 100 * kMiB, false});
  }
  tuner.Events(1, {}, 0, &weights);
  EXPECT_EQ(tuner.Status()[0].window_events, 0u) << "of " << with_gap;
  const int requests = job.RequestUntilDecided("generate");
  const std::vector<AutotuneDecision> d = tuner.History("generate", 1);
  ASSERT_EQ(d.size(), 1u) << "no decision after " << requests << " requests";
  EXPECT_EQ(d[0].trigger, AutotuneTrigger::kFirstPass);
  EXPECT_NE(d[0].result, AutotuneResult::kSkipped) << d[0].why;
  EXPECT_EQ(d[0].why.find("dropped"), std::string::npos) << d[0].why;
  // Replayed from the state: the weights are held from the start.
  EXPECT_GE(d[0].predicted_peak_requested, int64_t{10} * 100 * kMiB + 4 * 304 * kMiB);
}

// A generation job whose stream began after its weights were allocated
// (`allocd run` attaches once PyTorch first asked for memory; advise()
// after the model was built): the client's state where the stream began
// holds them, the prediction is replayed from it, and what the job
// requests after the push is measured with them, as the prediction is.
TEST(AutotunerTest, WhatAStatesBlocksHoldOutsideTheStreamCountsInTheJobsNeed) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kApply), &actions);
  tuner.SessionStarted(1, "generate", "max_split_size_mb:64", 1, "", /*marks_steps=*/true);
  constexpr uint64_t kWeights = 0x7F0000000000;
  AllocatorSnapshot before;
  before.segments.push_back({kWeights, 512 * kMiB, 9, false, false});
  before.blocks.push_back({kWeights, kWeights, 500 * kMiB, 500 * kMiB, false});
  tuner.Events(1, {}, 0, &before);
  GenerationJob job(tuner, 1);
  job.RequestUntilDecided("generate");
  const std::vector<AutotuneDecision> d = tuner.History("generate", 1);
  ASSERT_EQ(d.size(), 1u);
  ASSERT_EQ(d[0].result, AutotuneResult::kPushed) << d[0].why;
  EXPECT_NE(d[0].why.find("(1 segments, 1 blocks held)"), std::string::npos) << d[0].why;
  EXPECT_GE(d[0].predicted_peak_requested, int64_t{500} * kMiB + 10 * 100 * kMiB);
  tuner.Acked(1, d[0].version, true, "");
  job.Request(8);  // twice the largest before: the need grows by its cache
  tuner.WaitIdle();
  const AutotuneDecision after = tuner.History("generate", 10).back();
  ASSERT_EQ(after.id, d[0].id);
  ASSERT_TRUE(after.realized_peak_requested.has_value());
  // The weights outside the stream, the stream's own, and the batch-8
  // request's peak: its last two caches live at once (8 x (296 + 304) MiB).
  const int64_t held = int64_t{500} * kMiB + 10 * 100 * kMiB + 8 * (296 + 304) * kMiB;
  EXPECT_EQ(*after.realized_peak_requested, held);
  // Predicted again on the events after the push, replayed from the same
  // state: the replay holds the weights too.
  EXPECT_NE(after.at_need_basis.find(absl::StrFormat(
                "(requesting at most %.2f GiB)", static_cast<double>(held) / (1 << 30))),
            std::string::npos)
      << after.at_need_basis;
  EXPECT_GE(*after.predicted_peak_at_need, held);
}

// A generation job (session 1) started on max_split_size_mb:64, rounding
// pinned (a larger request's best is then the same config), fed requests
// until its first push: that push (`job` is the job).
AutotuneDecision PushToGeneration(Autotuner& tuner, FakeActions& actions,
                                  std::optional<GenerationJob>& job) {
  tuner.SetPolicy({"", "generate"}, {.mode = AutotuneMode::kApply,
                                     .pinned_keys = {"roundup_power2_divisions"}});
  tuner.SessionStarted(1, "generate", "max_split_size_mb:64", 1);
  job.emplace(tuner, 1);
  for (const int batch : {1, 2, 4, 2, 1, 2, 1, 2}) {
    job->Request(batch);
    tuner.WaitIdle();
    if (!actions.pushes().empty()) break;
  }
  EXPECT_EQ(actions.pushes().size(), 1u);
  const std::vector<AutotuneDecision> history = tuner.History("generate", 1);
  return history.empty() ? AutotuneDecision{} : history[0];
}

// A push rolled back on what the job realised was judged on the requests
// the job had made by then. On the H200 a generation job was rolled back on
// its first small request, every later decision then refused the config
// (50-57% predicted savings), and the job ended 34% above staying. Once a
// request larger by the growth margin comes, the config may be pushed
// again; before, it is not. (A NACK's rollback stays for good:
// ANackRollsBackAndTheConfigIsNotProposedAgain.)
TEST(AutotunerTest, AConfigRolledBackOnSmallerRequestsIsPushedAgainOnALargerOne) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kApply), &actions);
  std::optional<GenerationJob> job;
  const AutotuneDecision d = PushToGeneration(tuner, actions, job);
  ASSERT_EQ(d.result, AutotuneResult::kPushed) << d.why;
  tuner.Acked(1, d.version, true, "");
  // Far above what staying was predicted to cost, before any event after
  // the push: rolled back on the prediction alone.
  tuner.Stats(1, Reserved(d.predicted_peak_current * 2, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  ASSERT_EQ(tuner.History("generate", 1)[0].result, AutotuneResult::kRolledBack);

  // On the same requests an admin's run finds it again, and keeps.
  ASSERT_TRUE(tuner.RunNow("generate").ok());
  tuner.WaitIdle();
  const AutotuneDecision same = tuner.History("generate", 1)[0];
  EXPECT_EQ(same.result, AutotuneResult::kKept) << same.why;
  EXPECT_NE(same.why.find("pushed again only once the job requests more than"),
            std::string::npos) << same.why;
  EXPECT_EQ(actions.pushes().size(), 2u);

  // A request twice the largest: decided on again, and pushed again.
  job->Request(8);
  job->Request(1);
  tuner.WaitIdle();
  const AutotuneDecision larger = tuner.History("generate", 1)[0];
  EXPECT_EQ(larger.trigger, AutotuneTrigger::kLargerRequest);
  EXPECT_EQ(larger.result, AutotuneResult::kPushed) << larger.why;
  EXPECT_EQ(larger.to_config, d.to_config);
  EXPECT_NE(larger.why.find("pushed again now that the job requests"), std::string::npos)
      << larger.why;
  ASSERT_EQ(actions.pushes().size(), 3u);
  EXPECT_EQ(actions.pushes()[2].kind, "session");
}

// Once the push is set for the whole job, a larger request decides again;
// a decision on the canary's stream that keeps the pushed config is the
// newest prediction for it, and what the push's realised peak is judged
// against from then on.
TEST(AutotunerTest, ADecisionThatKeepsThePushedConfigStandsForItsPrediction) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(SmallJobOptions(clock, AutotuneMode::kApply), &actions);
  std::optional<GenerationJob> job;
  const AutotuneDecision d = PushToGeneration(tuner, actions, job);
  ASSERT_EQ(d.result, AutotuneResult::kPushed) << d.why;
  tuner.Acked(1, d.version, true, "");
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  clock.Advance(absl::Seconds(11));
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(tuner.Status()[0].state, AutotuneJobState::kApplied);

  job->Request(8);
  job->Request(1);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> history = tuner.History("generate", 10);
  ASSERT_EQ(history.size(), 2u);
  const AutotuneDecision& kept = history[0];
  ASSERT_EQ(kept.trigger, AutotuneTrigger::kLargerRequest);
  ASSERT_EQ(kept.result, AutotuneResult::kKept) << kept.why;
  const AutotuneDecision& pushed = history[1];
  ASSERT_EQ(pushed.id, d.id);
  EXPECT_EQ(pushed.at_need_basis, absl::StrFormat("decision %d, which kept it", kept.id));
  ASSERT_TRUE(pushed.realized_peak_requested.has_value());
  ASSERT_TRUE(pushed.predicted_peak_at_need.has_value());
  EXPECT_NEAR(static_cast<double>(*pushed.predicted_peak_at_need),
              static_cast<double>(kept.predicted_peak_current) *
                  std::max(1.0, static_cast<double>(*pushed.realized_peak_requested) /
                                    static_cast<double>(kept.predicted_peak_requested)),
              1.0);
}

// After a first decision, reserved memory past what the job's config was
// predicted to need decides again at once, not after the cooldown; a
// little over it, or the same growth reported again, does not.
TEST(AutotunerTest, ReservedGrowingPastTheBestConfigsNeedDecidesAgainAtOnce) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  ASSERT_EQ(actions.runs(), 1);
  // Recommended only: the job still runs its own config, so staying's
  // prediction is what it needs.
  const int64_t need = tuner.History("llama", 1)[0].predicted_peak_current;
  ASSERT_GT(need, 0);
  tuner.Stats(1, Reserved(need * 105 / 100), 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 1);
  tuner.Stats(1, Reserved(need * 13 / 10), 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 2);
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, AutotuneTrigger::kGrowth);
  tuner.Stats(1, Reserved(need * 13 / 10), 1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.runs(), 2);
}

// Pushed after 60% of llama_lora's training, ACKed, then the rest of its
// training steps: what a judgement replays staying on.
AutotuneDecision PushedWithEventsAfter(Autotuner& tuner, FakeActions& actions) {
  const size_t pushed_at = TrainingEvents() * 2 / 3;
  const AutotuneDecision d = PushToCanary(tuner, actions, pushed_at);
  tuner.Acked(1, d.version, true, "");
  Feed(tuner, 1, LlamaLora(), pushed_at, TrainingEvents());
  return d;
}

// The "defaults, advisor, rolled back (35.89) vs staying 55-63": a
// realised peak above the prediction made from earlier steps, but below
// what staying reaches on the same events, keeps the push.
TEST(AutotunerTest, APushBetterThanStayingOnTheSameEventsIsKeptThoughAbovePrediction) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  // Above the prediction by far, and nearer to staying's prediction.
  const int64_t realized = d.predicted_peak_switched / 4 + d.predicted_peak_current * 3 / 4;
  tuner.Stats(1, Reserved(realized, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kPushed) << after.why;
  ASSERT_TRUE(after.staying_after_push.has_value()) << after.why;
  EXPECT_GT(*after.staying_after_push, realized);
  EXPECT_GT(after.judged_events, 0u);
  EXPECT_NE(after.why.find("no worse than not pushing"), std::string::npos) << after.why;
  // Judged once: the same peak again is not judged again; the watch goes on
  // and the push is set for the whole job.
  clock.Advance(absl::Seconds(11));
  tuner.Stats(1, Reserved(realized, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "job");
}

// Decisions take turns by tenant: a tenant with many jobs queued delays
// another's next decision by one of its own at most, not by its queue.
TEST(AutotunerTest, TenantsTakeTurnsOnTheDecisionWorker) {
  // Holds the worker in its first run until released; records the jobs run.
  class GatedActions : public FakeActions {
   public:
    void OnRun(const std::string& job) override {
      absl::MutexLock lock(&gate_);
      ran_.push_back(job);
      if (ran_.size() == 1) gate_.Await(absl::Condition(&open_));
    }
    void Open() {
      absl::MutexLock lock(&gate_);
      open_ = true;
    }
    std::vector<std::string> ran() const {
      absl::MutexLock lock(&gate_);
      return ran_;
    }

   private:
    mutable absl::Mutex gate_;
    bool open_ ABSL_GUARDED_BY(gate_) = false;
    std::vector<std::string> ran_ ABSL_GUARDED_BY(gate_);
  };
  FakeClock clock;
  GatedActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  for (SessionId id = 1; id <= 5; ++id) {
    tuner.SessionStarted(id, absl::StrCat("a", id), "", 0, "uid:1");
  }
  tuner.SessionStarted(10, "b", "", 0, "uid:2");
  tuner.SessionStarted(11, "c", "", 0, "uid:3");
  ASSERT_TRUE(tuner.RunNow("a1", "uid:1").ok());
  while (actions.ran().empty()) absl::SleepFor(absl::Milliseconds(1));
  for (const char* job : {"a2", "a3", "a4", "a5"}) ASSERT_TRUE(tuner.RunNow(job, "uid:1").ok());
  ASSERT_TRUE(tuner.RunNow("b", "uid:2").ok());
  ASSERT_TRUE(tuner.RunNow("c", "uid:3").ok());
  actions.Open();
  tuner.WaitIdle();
  EXPECT_EQ(actions.ran(),
            (std::vector<std::string>{"a1", "b", "c", "a2", "a3", "a4", "a5"}));
}

// The jobs the autotuner keeps, by label.
std::set<std::string> JobNames(const Autotuner& tuner) {
  std::set<std::string> names;
  for (const AutotuneJobStatus& s : tuner.Status()) names.insert(s.job);
  return names;
}

// A flood of short jobs, each its own label: the ended ones kept are the
// most recent few, so the daemon's state does not grow with the labels.
TEST(AutotunerTest, OnlyTheMostRecentlyEndedJobsAreKept) {
  FakeClock clock;
  FakeActions actions;
  AutotuneOptions options = Options(clock, AutotuneMode::kRecommend);
  options.ended_jobs_kept = 8;
  Autotuner tuner(options, &actions);
  tuner.SessionStarted(1000, "live", "", 0);
  for (SessionId id = 1; id <= 100; ++id) {
    tuner.SessionStarted(id, absl::StrCat("job-", id), "", 0);
    tuner.Events(id, {{TraceOp::kAlloc, 7, 1, 512}, {TraceOp::kFreeCompleted, 7, 1, 0}}, 0);
    tuner.SessionEnded(id);
  }
  tuner.WaitIdle();
  const std::set<std::string> jobs = JobNames(tuner);
  EXPECT_EQ(jobs.size(), 9u);
  EXPECT_TRUE(jobs.contains("live"));
  EXPECT_TRUE(jobs.contains("job-100"));
  EXPECT_TRUE(jobs.contains("job-93"));
  EXPECT_FALSE(jobs.contains("job-92"));
  // A job that comes back is a job again.
  tuner.SessionStarted(200, "job-1", "", 0);
  EXPECT_EQ(tuner.Status().size(), 10u);
}

// A job whose push was set for it is history once ended, like any other:
// a flood of labels that each got a push cannot grow the daemon either.
TEST(AutotunerTest, AnEndedJobWhosePushWasAppliedIsDroppedLikeAnyOther) {
  FakeClock clock;
  FakeActions actions;
  AutotuneOptions options = Options(clock, AutotuneMode::kApply);
  options.ended_jobs_kept = 4;
  Autotuner tuner(options, &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  tuner.SessionEnded(1);
  tuner.SessionEnded(2);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "job");
  for (const AutotuneJobStatus& s : tuner.Status()) {
    if (s.job == "llama") {
      EXPECT_EQ(s.state, AutotuneJobState::kApplied);
    }
  }
  EXPECT_TRUE(JobNames(tuner).contains("llama"));
  for (SessionId id = 10; id < 15; ++id) {
    tuner.SessionStarted(id, absl::StrCat("job-", id), "", 0);
    tuner.SessionEnded(id);
  }
  tuner.WaitIdle();
  const std::set<std::string> kept = JobNames(tuner);
  EXPECT_FALSE(kept.contains("llama"));
  EXPECT_EQ(kept.size(), 4u);
}

// Ends the canary session of `d`, expecting its push set for the job:
// the decision then.
AutotuneDecision EndTheCanary(Autotuner& tuner, FakeActions& actions,
                              const AutotuneDecision& d) {
  tuner.SessionEnded(1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 2u);
  if (actions.pushes().size() == 2) {
    EXPECT_EQ(actions.pushes()[1].kind, "job");
    EXPECT_EQ(actions.pushes()[1].config, d.to_config);
  }
  return tuner.History("llama", 1)[0];
}

// A job of one session ends before its canary's watch does (the most
// common case: a short fine-tune). A push its judgement kept on the same
// events is then set for the job, so its next run starts with it.
TEST(AutotunerTest, APushKeptByItsJudgementIsSetForTheJobWhenTheCanaryEndsFirst) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  const int64_t realized = d.predicted_peak_switched / 4 + d.predicted_peak_current * 3 / 4;
  tuner.Stats(1, Reserved(realized, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 1u);
  ASSERT_TRUE(tuner.History("llama", 1)[0].staying_after_push.has_value());
  const AutotuneDecision after = EndTheCanary(tuner, actions, d);
  EXPECT_NE(after.version, d.version) << after.why;
  EXPECT_NE(after.why.find("after its judgement kept the push"), std::string::npos) << after.why;
}

// A job shorter than the canary's watch: a push its watch saw within the
// margin is set for the job when the canary ends (and so is learned).
TEST(AutotunerTest, APushWatchedWithinTheMarginIsSetForTheJobWhenTheCanaryEndsFirst) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 1u);
  EXPECT_FALSE(tuner.History("llama", 1)[0].staying_after_push.has_value());  // not judged
  const AutotuneDecision after = EndTheCanary(tuner, actions, d);
  EXPECT_NE(after.why.find("its watch having found it within the margin"), std::string::npos)
      << after.why;
  // Checked as the job's next runs use it, from their first allocation:
  // expandable segments peak lower than max_split_size_mb:64 from the
  // start too, so the push is what they start on.
  ASSERT_TRUE(after.learned.has_value()) << after.why;
  EXPECT_EQ(after.learned->config, d.to_config) << after.learned->why;
  EXPECT_GT(after.learned->pushed_peak, 0);
  EXPECT_EQ(after.learned->peak, after.learned->pushed_peak);
  EXPECT_NE(after.why.find(after.learned->why), std::string::npos) << after.why;
}

// A push is decided, watched and judged as a switch in the middle of a
// run, over the segments cut before it; the job's next runs start on what
// it learned from their first allocation (issue 40: a growth push, kept
// over the run's last steps, peaked 30.9% above the config it replaced
// from step 0 of the next run). Started on roundup_power2_divisions:2,
// llama_lora's first 30% of events push a config that, switched there,
// peaks 25% below staying, and keeps its gain when the sizes grow;
// replayed from the start it peaks above what it replaced. (From
// roundup_power2_divisions:4 they pushed
// max_split_size_mb:128,max_non_split_rounding_mb:256 with expandable
// segments, whose gain did not hold on grown sizes: expandable segments
// alone are pushed now, which peak below roundup_power2_divisions:4 from
// the start.) Its canary's watch finds it within the margin and ends: the
// push is set for the run's other session, but the job learns the config
// it replaced.
TEST(AutotunerTest, APushWorseFromTheRunsStartThanWhatItReplacedIsNotLearned) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const Trace& trace = LlamaLora();
  const size_t pushed_at = trace.events.size() * 3 / 10;
  const size_t fed = pushed_at + 10000;
  tuner.SessionStarted(1, "llama", "roundup_power2_divisions:2", 1);
  tuner.SessionStarted(2, "llama", "roundup_power2_divisions:2", 1);
  Feed(tuner, 1, trace, 0, pushed_at, SIZE_MAX);
  tuner.WaitIdle();
  ASSERT_EQ(tuner.History("llama", 1).size(), 1u);
  const AutotuneDecision d = tuner.History("llama", 1)[0];
  ASSERT_EQ(d.result, AutotuneResult::kPushed) << d.why;
  ASSERT_EQ(d.from_config, "roundup_power2_divisions:2");
  ASSERT_LT(d.predicted_peak_switched, d.predicted_peak_current * 95 / 100);
  // What the test is about: from the start, over the events the window
  // holds when the canary ends, the push peaks above the config it
  // replaced by more than min_saving.
  Trace run = trace;
  run.events.resize(fed);
  absl::StatusOr<ReplayResult> pushed = Replay(run, *ParseAllocatorConfig(d.to_config));
  absl::StatusOr<ReplayResult> replaced = Replay(run, *ParseAllocatorConfig(d.from_config));
  ASSERT_TRUE(pushed.ok() && replaced.ok());
  ASSERT_GT(pushed->peak_reserved, replaced->peak_reserved * 105 / 100)
      << GiB(pushed->peak_reserved) << " vs " << GiB(replaced->peak_reserved);

  tuner.Acked(1, d.version, true, "");
  Feed(tuner, 1, trace, pushed_at, fed);
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  const AutotuneDecision after = EndTheCanary(tuner, actions, d);
  EXPECT_EQ(after.result, AutotuneResult::kPushed) << after.why;
  ASSERT_TRUE(after.learned.has_value()) << after.why;
  EXPECT_EQ(after.learned->config, "roundup_power2_divisions:2") << after.learned->why;
  EXPECT_EQ(after.learned->pushed_peak, pushed->peak_reserved) << after.learned->why;
  EXPECT_EQ(after.learned->peak, replaced->peak_reserved) << after.learned->why;
  EXPECT_NE(after.why.find("learned roundup_power2_divisions:2 instead of the push's"),
            std::string::npos)
      << after.why;
}

// A canary that ends before anything judged or watched its push sets
// nothing.
TEST(AutotunerTest, APushNotYetJudgedIsNotSetForTheJobWhenTheCanaryEnds) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  tuner.SessionEnded(1);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  EXPECT_NE(tuner.History("llama", 1)[0].why.find("the job's other sessions were left alone"),
            std::string::npos);
  (void)d;
}

// A push that did worse than staying is still not rolled back when the
// rollback would leave the job higher than keeping it: the segments made
// under expandable segments stay reserved under max_split_size_mb:64.
TEST(AutotunerTest, ARollbackThatWouldLeaveTheJobWorseIsNotMade) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushedWithEventsAfter(tuner, actions);
  ASSERT_TRUE(d.predicted_peak_rolled_back.has_value()) << d.why;
  const int64_t realized = d.predicted_peak_current * 2;
  tuner.Stats(1, Reserved(realized, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  const AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kPushed) << after.why;
  ASSERT_TRUE(after.staying_after_push.has_value()) << after.why;
  EXPECT_LT(*after.staying_after_push, realized);
  ASSERT_TRUE(after.rollback_after_push.has_value());
  ASSERT_TRUE(after.keeping_after_push.has_value());
  EXPECT_GE(*after.rollback_after_push, *after.keeping_after_push);
  EXPECT_NE(after.why.find("a rollback would leave it at"), std::string::npos) << after.why;
}

// The two ranks of run "ddp" (rank 1 registered first, the canary), on
// the harmful max_split_size_mb:64, decided on the canary's `events` first
// events and pushed to it.
AutotuneDecision PushToRanks(Autotuner& tuner, FakeActions& actions, size_t events) {
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1, "", false,
                       {.run = "ddp", .rank = 1, .world_size = 2});
  tuner.SessionStarted(2, "llama", "max_split_size_mb:64", 1, "", false,
                       {.run = "ddp", .rank = 0, .world_size = 2});
  Feed(tuner, 1, LlamaLora(), 0, events, SIZE_MAX);
  tuner.WaitIdle();
  const std::vector<AutotuneDecision> history = tuner.History("llama", 1);
  EXPECT_EQ(history.size(), 1u);  // one decision for the job, not one per rank
  if (history.empty()) return {};
  EXPECT_EQ(history[0].result, AutotuneResult::kPushed) << history[0].why;
  EXPECT_EQ(history[0].run, "ddp");
  EXPECT_EQ(actions.pushes().size(), 1u);
  EXPECT_EQ(tuner.Status().size(), 1u);
  return history[0];
}

// A DDP job's push went to its canary rank and, still watched when the job
// ended 30 steps later, never to the other (issue 40). The ranks of a run
// are one job: the push reaches every rank once the canary has run the
// step the push landed in (its first mark after its ACK), long before the
// canary_window; and a NACK, an OOM or a realised peak past the margin on
// any rank rolls every rank back.
TEST(AutotunerTest, ARunsPushReachesEveryRankAfterTheCanarysFirstStepAndRollsBackOnEvery) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const size_t pushed_at = TrainingEvents() * 2 / 3;
  const AutotuneDecision d = PushToRanks(tuner, actions, pushed_at);
  ASSERT_EQ(actions.pushes()[0].kind, "session");
  ASSERT_EQ(actions.pushes()[0].target, 1u);
  const std::vector<EvidenceEvent> mark = {{kStepMark, 0, 0, 0}};
  tuner.Events(1, mark, 0);
  tuner.Acked(1, d.version, true, "");
  tuner.Stats(1, Reserved(d.predicted_peak_switched, d.predicted_peak_allocated), d.version);
  tuner.WaitIdle();
  // The step the push landed in, under way: the other rank waits.
  Feed(tuner, 1, LlamaLora(), pushed_at, TrainingEvents());
  tuner.WaitIdle();
  EXPECT_EQ(actions.pushes().size(), 1u);
  // That step ends within the margin: every rank, at once.
  clock.Advance(absl::Seconds(1));
  tuner.Events(1, mark, 0);
  tuner.WaitIdle();
  std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].kind, "job");
  EXPECT_EQ(pushes[1].run, "ddp");
  EXPECT_EQ(pushes[1].config, d.to_config);
  AutotuneDecision after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.sessions, (std::vector<uint64_t>{1, 2}));
  EXPECT_NE(after.why.find("first step"), std::string::npos) << after.why;
  // Set for the ranks mid-run, it is checked from the window's first event
  // before the job learns it.
  ASSERT_TRUE(after.learned.has_value()) << after.why;
  EXPECT_EQ(after.learned->config, d.to_config) << after.learned->why;
  tuner.Acked(2, pushes[1].version, true, "");
  // Each rank's config, by rank.
  const std::vector<AutotuneJobStatus> status = tuner.Status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].state, AutotuneJobState::kApplied);
  ASSERT_EQ(status[0].ranks.size(), 2u);
  EXPECT_EQ(status[0].ranks[0].rank, 0u);
  EXPECT_EQ(status[0].ranks[0].session, 2u);
  EXPECT_EQ(status[0].ranks[0].config, d.to_config);
  EXPECT_EQ(status[0].ranks[1].session, 1u);
  EXPECT_TRUE(status[0].ranks[1].canary);
  EXPECT_EQ(status[0].ranks[1].config, d.to_config);

  // An OOM on the other rank rolls back every rank.
  tuner.Oom(2, pushes[1].version);
  tuner.WaitIdle();
  pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[2].kind, "job");
  EXPECT_EQ(pushes[2].run, "ddp");
  EXPECT_EQ(*ParseAllocatorConfig(pushes[2].config), *ParseAllocatorConfig("max_split_size_mb:64"));
  after = tuner.History("llama", 1)[0];
  EXPECT_EQ(after.result, AutotuneResult::kRolledBack);
  const std::vector<AutotuneJobStatus> rolled_back = tuner.Status();
  for (const AutotuneRankStatus& rank : rolled_back[0].ranks) {
    EXPECT_EQ(*ParseAllocatorConfig(rank.config), *ParseAllocatorConfig("max_split_size_mb:64"))
        << rank.session;
  }
}

// Before it reaches the other ranks, a push that fails on the canary rolls
// back the canary only (the others never ran it).
TEST(AutotunerTest, ARunsPushRefusedByItsCanaryRollsBackTheCanaryOnly) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kApply), &actions);
  const AutotuneDecision d = PushToRanks(tuner, actions, TrainingEvents());
  tuner.Acked(1, d.version, false, "PyTorch rejected it");
  tuner.WaitIdle();
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].kind, "rollback");
  EXPECT_EQ(pushes[1].target, 1u);
  EXPECT_EQ(tuner.History("llama", 1)[0].result, AutotuneResult::kRolledBack);
}

// Two runs of one label are two jobs: each decided on its own canary's
// stream and pushed to its own ranks.
TEST(AutotunerTest, TwoRunsOfOneLabelAreTwoJobs) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "", 1, "", false, {.run = "a", .rank = 0, .world_size = 2});
  tuner.SessionStarted(2, "llama", "", 1, "", false, {.run = "b", .rank = 0, .world_size = 2});
  tuner.SessionStarted(3, "llama", "", 1, "", false, {.run = "a", .rank = 1, .world_size = 2});
  const std::vector<AutotuneJobStatus> status = tuner.Status();
  ASSERT_EQ(status.size(), 2u);
  EXPECT_EQ(status[0].run, "a");
  EXPECT_EQ(status[0].sessions, 2u);
  EXPECT_EQ(status[1].run, "b");
  EXPECT_EQ(status[1].sessions, 1u);
  FeedAll(tuner, 2);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].run, "b");
}

}  // namespace
}  // namespace allocd
