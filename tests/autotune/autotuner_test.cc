#include "server/autotune/autotuner.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
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
  };

  absl::StatusOr<uint64_t> PushToSession(SessionId session, const std::string& config,
                                         const std::string&, uint64_t) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back({"session", session, config, next_version_});
    return next_version_++;
  }
  absl::StatusOr<uint64_t> SetJobConfig(const std::string&, const std::string& config,
                                        const std::string&, uint64_t) override {
    absl::MutexLock lock(&mu_);
    pushes_.push_back({"job", 0, config, next_version_});
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

TEST(AutotunerTest, RecommendComputesButPushesNothing) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kRecommend), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 10);
  ASSERT_EQ(history.size(), 1u);
  const AutotuneDecision& d = history[0];
  EXPECT_EQ(d.result, "recommended") << d.why;
  EXPECT_EQ(d.trigger, "bad_start_config");
  EXPECT_EQ(d.from_config, "max_split_size_mb:64");
  EXPECT_FALSE(d.to_config.empty());
  EXPECT_LT(d.predicted_peak_switched, d.predicted_peak_current);
  EXPECT_EQ(d.version, 0u);
  EXPECT_TRUE(actions.pushes().empty());
  EXPECT_EQ(actions.runs(), 1);
  const std::vector<AutotuneJobStatus> status = tuner.Status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].state, "watching");
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
  EXPECT_EQ(history[0].trigger, "first_pass");
  // llama_lora's step is 1/20 of the trace; two of them were needed.
  EXPECT_GE(history[0].window_events, trace.events.size() / 10);
  EXPECT_LT(fed, trace.events.size());
  // Nothing more comes from the first pass.
  Feed(tuner, 1, trace, fed, trace.events.size());
  tuner.WaitIdle();
  EXPECT_EQ(tuner.History("llama", 10).size(), 1u);
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
  EXPECT_EQ(history[0].result, "recommended") << history[0].why;
  EXPECT_LT(fed, LlamaLora().events.size() / 2);
}

// Apply mode up to the canary's push; returns the decision.
AutotuneDecision PushToCanary(Autotuner& tuner, FakeActions& actions) {
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  tuner.SessionStarted(2, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  const std::vector<AutotuneDecision> history = tuner.History("llama", 1);
  EXPECT_EQ(history.size(), 1u);
  if (history.empty()) return {};
  EXPECT_EQ(history[0].result, "pushed") << history[0].why;
  const std::vector<FakeActions::Push> pushes = actions.pushes();
  EXPECT_EQ(pushes.size(), 1u);
  if (pushes.empty()) return {};
  EXPECT_EQ(pushes[0].kind, "session");
  EXPECT_EQ(pushes[0].target, 1u);  // the oldest session
  EXPECT_EQ(pushes[0].config, history[0].to_config);
  EXPECT_EQ(history[0].version, pushes[0].version);
  EXPECT_EQ(tuner.Status()[0].state, "canary");
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
  EXPECT_EQ(after.result, "pushed");
  EXPECT_EQ(after.version, pushes[1].version);
  EXPECT_EQ(after.sessions, (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(after.realized_peak.has_value());
  EXPECT_EQ(*after.realized_peak, realized);
  EXPECT_EQ(*after.realized_saving, d.predicted_peak_current - realized);
  EXPECT_EQ(tuner.Status()[0].state, "applied");
  // The rest of the job reports under the job's version: realised values
  // keep coming in.
  tuner.Stats(2, Reserved(realized + 5), pushes[1].version);
  EXPECT_EQ(*tuner.History("llama", 1)[0].realized_peak, realized + 5);
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
  EXPECT_EQ(after.result, "rolled_back");
  EXPECT_NE(after.why.find("PyTorch rejected it"), std::string::npos) << after.why;
  // An admin's run finds the same best config, and keeps.
  absl::StatusOr<uint64_t> id = tuner.RunNow("llama");
  ASSERT_TRUE(id.ok()) << id.status();
  tuner.WaitIdle();
  const AutotuneDecision again = tuner.History("llama", 1)[0];
  EXPECT_EQ(again.id, *id);
  EXPECT_EQ(again.trigger, "admin");
  EXPECT_EQ(again.result, "kept") << again.why;
  EXPECT_EQ(actions.pushes().size(), 2u);
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
  EXPECT_EQ(tuner.History("llama", 1)[0].result, "rolled_back");
  EXPECT_EQ(tuner.Status()[0].state, "watching");
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
  EXPECT_EQ(after.result, "rolled_back");
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
  EXPECT_EQ(tuner.History("llama", 1)[0].result, "pushed");
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
  EXPECT_EQ(tuner.History("llama", 1)[0].result, "pushed");
  // The same job losing most of the saving on what it allocates is.
  tuner.Stats(1, Reserved(d.predicted_peak_current * 13 / 10 * 8 / 10,
                          d.predicted_peak_allocated * 13 / 10),
              d.version);
  tuner.WaitIdle();
  ASSERT_EQ(actions.pushes().size(), 2u);
  EXPECT_EQ(actions.pushes()[1].kind, "rollback");
  EXPECT_NE(tuner.History("llama", 1)[0].why.find("scaled by the job"), std::string::npos);
}

// The growth that excuses a realised peak is measured on the canary's own
// stream once it sends events after the push: a job that resets PyTorch's
// peak every step (as ddp_train.py does) reports the window's need however
// much more its later steps ask for; and a report of growth the stream
// does not show excuses nothing.
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
    const int64_t asked = grew ? 2 * d.predicted_peak_requested : d.predicted_peak_requested / 10;
    tuner.Events(1, {{TraceOp::kAlloc, LlamaLora().streams[0], 0xA110C, static_cast<uint64_t>(asked)},
                     {TraceOp::kFreeRequested, LlamaLora().streams[0], 0xA110C, 0}},
                 0);
    // 90% of what staying was predicted to cost: with the job's growth
    // (2x) well under what staying costs it, without it nearer to staying.
    const int64_t allocated_report = grew ? d.predicted_peak_allocated : 3 * d.predicted_peak_allocated;
    tuner.Stats(1, Reserved(d.predicted_peak_current * 9 / 10, allocated_report), d.version);
    tuner.WaitIdle();
    EXPECT_EQ(tuner.History("llama", 1)[0].result, grew ? "pushed" : "rolled_back")
        << tuner.History("llama", 1)[0].why;
  }
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
  EXPECT_EQ(history[0].result, "kept") << history[0].why;
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
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, "alloc_retry");
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
  EXPECT_EQ(tuner.History("llama", 1)[0].trigger, "fragmentation");
}

TEST(AutotunerTest, OffKeepsNoWindowAndRunsNothing) {
  FakeClock clock;
  FakeActions actions;
  Autotuner tuner(Options(clock, AutotuneMode::kOff), &actions);
  tuner.SessionStarted(1, "llama", "max_split_size_mb:64", 1);
  FeedAll(tuner, 1);
  EXPECT_EQ(actions.runs(), 0);
  EXPECT_EQ(tuner.Status()[0].state, "off");
  EXPECT_EQ(tuner.Status()[0].window_events, 0u);
  EXPECT_EQ(tuner.RunNow("llama").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tuner.RunNow("nobody").status().code(), absl::StatusCode::kNotFound);
  // A per-job policy turns it on.
  JobPolicy recommend;
  recommend.mode = AutotuneMode::kRecommend;
  tuner.SetPolicy("llama", recommend);
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
  EXPECT_EQ(history[0].result, "skipped");
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
  EXPECT_EQ(d.result, "skipped");
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

}  // namespace
}  // namespace allocd
