#include "client/live_session.h"

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_backend.h"
#include "allocd.grpc.pb.h"
#include "allocator/trace/trace.h"
#include "client/daemon_client.h"
#include "client/event_recorder.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/client/fake_allocator_target.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// The control loop against a real daemon (`allocd serve --backend sim`),
// on an allocator a test sets.
class LiveSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = dir_.path() + "/allocd.sock";
    daemon_ = std::make_unique<harness::Child>(std::vector<std::string>{
        ALLOCD_BINARY, "serve", "--backend", "sim", "--socket", socket_,
        "--metrics-addr", "", "--capacity", "64MiB", "--autotune", "recommend"});
    ASSERT_TRUE(harness::WaitForDaemon(socket_));
    admin_ = v1::Admin::NewStub(harness::DialAdmin(socket_));
    absl::StatusOr<std::unique_ptr<DaemonClient>> client =
        DaemonClient::Connect({.socket = socket_, .job = "live"});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    session_ = std::make_unique<LiveSession>(*client_, AllocatorConfig{},
                                             absl::ZeroDuration());
  }

  void Push(const std::string& config, const std::string& job = "live") {
    grpc::ClientContext context;
    v1::SetConfigRequest request;
    request.set_job(job);
    request.set_config(config);
    v1::SetConfigResponse response;
    ASSERT_TRUE(admin_->SetConfig(&context, request, &response).ok());
  }

  // Polls `target` until `done` or 10 s have passed; whether it is done.
  template <typename Done>
  bool PollUntil(Done done, AllocatorTarget& target) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done() && absl::Now() < deadline) {
      client_->AwaitControl(absl::Milliseconds(100));
      session_->Poll(target);
    }
    return done();
  }
  template <typename Done>
  bool PollUntil(Done done) {
    return PollUntil(done, target_);
  }

  // Waits until the daemon lists stats for session `id`: the telemetry
  // report they came in (with its working set) was read.
  void AwaitStatsRead(uint64_t id) {
    for (int i = 0; i < 500; ++i) {
      grpc::ClientContext context;
      v1::ListSessionsResponse sessions;
      ASSERT_TRUE(admin_->ListSessions(&context, {}, &sessions).ok());
      for (const v1::SessionInfo& s : sessions.sessions()) {
        if (s.session_id() == id && !s.stats().empty()) return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    FAIL() << "the daemon never listed session " << id << "'s stats";
  }

  ScopedTempDir dir_{"allocd_live_session_"};
  std::string socket_;
  std::unique_ptr<harness::Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<DaemonClient> client_;
  std::unique_ptr<LiveSession> session_;
  FakeAllocatorTarget target_;
};

TEST_F(LiveSessionTest, APushIsAppliedThenTheCacheIsReleasedAndAgainLater) {
  target_.allocated = 3 * kGiB;  // live at the switch
  Push("garbage_collection_threshold:0.6");
  ASSERT_TRUE(PollUntil([&] { return session_->configs_applied() == 1; }));
  ASSERT_EQ(target_.configs.size(), 1u);
  EXPECT_THAT(target_.configs[0], HasSubstr("garbage_collection_threshold:0.6"));
  EXPECT_EQ(target_.empty_cache_calls, 1);  // at the switch
  EXPECT_THAT(FormatAllocatorConfig(session_->config()),
              HasSubstr("garbage_collection_threshold:0.6"));
  EXPECT_GT(session_->config_version(), 0u);
  EXPECT_THAT(session_->config_reason(), HasSubstr("set by"));

  // The job marks no steps: what was live at the switch has gone.
  session_->Poll(target_);
  EXPECT_EQ(target_.empty_cache_calls, 1);
  target_.allocated = kGiB;
  session_->Poll(target_);
  EXPECT_EQ(target_.empty_cache_calls, 2);
  EXPECT_EQ(session_->second_releases(), 1);
}

TEST_F(LiveSessionTest, AJobThatMarksStepsIsReleasedAgainAtItsNextMark) {
  session_->AtStepMark(target_);  // nothing pending: no release
  EXPECT_EQ(target_.empty_cache_calls, 0);
  target_.allocated = 3 * kGiB;
  Push("garbage_collection_threshold:0.6");
  ASSERT_TRUE(PollUntil([&] { return session_->configs_applied() == 1; }));
  target_.allocated = 0;
  session_->Poll(target_);  // the rounds leave it to the mark
  EXPECT_EQ(target_.empty_cache_calls, 1);
  session_->AtStepMark(target_);
  EXPECT_EQ(target_.empty_cache_calls, 2);
}

// The daemon watches a push from where the job switched: the events the
// job recorded before it reach the daemon with the ACK, not a telemetry
// period later (with them, the step the push landed in is the first mark
// after the ACK, which a job's other ranks wait for).
TEST_F(LiveSessionTest, TheEventsBeforeAPushAreSentBeforeItsAck) {
  absl::StatusOr<std::unique_ptr<DaemonClient>> client = DaemonClient::Connect(
      {.socket = socket_, .job = "flushed", .telemetry_period = absl::Hours(1)});
  ASSERT_TRUE(client.ok()) << client.status();
  LiveSession session(**client, AllocatorConfig{}, absl::Hours(1));
  constexpr uint64_t kEvents = 100;
  for (uint64_t id = 1; id <= kEvents; ++id) {
    (*client)->events()->Record(TraceOp::kAlloc, 0, id, 512);
  }
  Push("garbage_collection_threshold:0.6", "flushed");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (session.configs_applied() == 0 && absl::Now() < deadline) {
    (*client)->AwaitControl(absl::Milliseconds(100));
    session.Poll(target_);
  }
  ASSERT_EQ(session.configs_applied(), 1);
  uint64_t window_events = 0;
  while (window_events < kEvents && absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::AutotuneStatusResponse status;
    ASSERT_TRUE(admin_->AutotuneStatus(&context, {}, &status).ok());
    for (const v1::AutotuneJob& job : status.jobs()) {
      if (job.job() == "flushed") window_events = job.window_events();
    }
    if (window_events < kEvents) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(window_events, kEvents);
}

TEST_F(LiveSessionTest, APushTheAllocatorRefusesIsCountedAndNotReleased) {
  target_.refuse = "the allocator refused it";
  Push("max_split_size_mb:256");
  ASSERT_TRUE(PollUntil([&] { return session_->configs_rejected() == 1; }));
  EXPECT_EQ(session_->configs_applied(), 0);
  EXPECT_EQ(target_.empty_cache_calls, 0);
  EXPECT_EQ(session_->config_version(), 0u);
}

// A reclaim asks the engine for what the daemon's pool lacks: it gives back
// the fewest cached segments that cover it, and keeps the rest.
TEST_F(LiveSessionTest, AReclaimReleasesWhatTheDaemonAsksAndKeepsTheRest) {
  SimBackend backend(kGiB);
  CachingAllocator allocator(AllocatorConfig{}, &backend);
  std::vector<Allocation> segments;
  for (uint64_t mib : {12, 20, 30}) {
    absl::StatusOr<Allocation> a = allocator.Malloc(mib * kMiB, 0);
    ASSERT_TRUE(a.ok()) << a.status();
    segments.push_back(*a);
  }
  for (const Allocation& a : segments) ASSERT_TRUE(allocator.Free(a).ok());
  const int64_t cached = allocator.Stats().reserved_bytes.all().current;
  ASSERT_EQ(cached, int64_t{62 * kMiB});
  EngineTarget engine(allocator);
  // What the engine caches holds 40 of the daemon's 64 MiB.
  absl::StatusOr<ReceivedChunks> held = client_->Acquire(40 * kMiB);
  ASSERT_TRUE(held.ok()) << held.status();
  session_->Poll(engine);
  ASSERT_TRUE(client_->FlushTelemetry().ok());

  absl::StatusOr<std::unique_ptr<DaemonClient>> needy =
      DaemonClient::Connect({.socket = socket_, .job = "needy"});
  ASSERT_TRUE(needy.ok()) << needy.status();
  // Its peak known, and the pool's free memory all but 16 MiB of it: the
  // daemon asks that much (not all the engine caches).
  (*needy)->PublishWorkingSet({40 * kMiB});
  (*needy)->PublishStats({{"reserved_bytes.all.current", 0}}, 0);
  ASSERT_TRUE((*needy)->FlushTelemetry().ok());
  ASSERT_NO_FATAL_FAILURE(AwaitStatsRead((*needy)->session_id()));
  absl::StatusOr<ReceivedChunks> got;
  std::thread acquire([&] { got = (*needy)->Acquire(40 * kMiB); });
  // Short by 16 MiB: the 20 MiB segment goes, the 12 and 30 stay.
  const bool released = PollUntil(
      [&] { return allocator.Stats().reserved_bytes.all().current < cached; },
      engine);
  EXPECT_TRUE(released);
  EXPECT_EQ(allocator.Stats().reserved_bytes.all().current,
            int64_t{42 * kMiB});
  EXPECT_EQ(session_->reclaims(), 1);
  ASSERT_TRUE(client_->Release(held->epoch, held->ids).ok());
  acquire.join();
  EXPECT_TRUE(got.ok()) << got.status();
}

TEST_F(LiveSessionTest, TheReportNamesTheSessionAsAllocdStatsDoes) {
  session_->ReportOom(kGiB, "CUDA out of memory. Tried to allocate 1.00 GiB");
  const nlohmann::json report = session_->Report();
  EXPECT_EQ(report["session_id"], client_->session_id());
  EXPECT_EQ(report["ooms_reported"], 1);
  EXPECT_EQ(report["configs_applied"], 0);
  EXPECT_EQ(report["configs_rejected"], 0);
  EXPECT_EQ(report["reclaims"], 0);
  EXPECT_EQ(report["events_dropped"], 0);
  // A daemon not in autotune apply mode starts the job on its own config.
  EXPECT_EQ(report["start_config_source"], "own");
  // Nothing learned: the job streams its allocations from the start.
  EXPECT_EQ(report["stream_from_reserved"], 0);
  // Nor has the daemon said since what it reads of the stream.
  EXPECT_EQ(report["stream_demands"], 0);
  EXPECT_EQ(report["stream_demanded_from_reserved"], 0);
  EXPECT_EQ(report["stream_demand_reason"], "");
  for (const char* key : {"reconnects", "config", "config_version",
                          "config_reason"}) {
    EXPECT_TRUE(report.contains(key)) << key;
  }
}

}  // namespace
}  // namespace allocd
