#include "server/autotune/autotuner.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
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

  absl::StatusOr<uint64_t> PushToSession(SessionIdValue session, const std::string& config,
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
  absl::Status RollBackSession(SessionIdValue session, const std::string& config,
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

// Feeds `events` of the trace in client-sized batches.
void Feed(Autotuner& tuner, SessionIdValue session, const Trace& trace, size_t begin,
          size_t end) {
  std::vector<EvidenceEvent> batch;
  for (size_t i = begin; i < end; ++i) {
    const TraceEvent& e = trace.events[i];
    batch.push_back({e.op, trace.streams[e.stream], e.id, e.size});
    if (batch.size() == 10000 || i + 1 == end) {
      tuner.Events(session, batch, 0);
      batch.clear();
    }
  }
}

void FeedAll(Autotuner& tuner, SessionIdValue session) {
  Feed(tuner, session, LlamaLora(), 0, LlamaLora().events.size());
  tuner.WaitIdle();
}

std::map<std::string, int64_t> Reserved(int64_t bytes) {
  return {{"reserved_bytes.all.current", bytes}, {"allocated_bytes.all.current", bytes}};
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
  ASSERT_TRUE(status[0].last.has_value());
  EXPECT_EQ(status[0].last->id, d.id);
}

}  // namespace
}  // namespace allocd
