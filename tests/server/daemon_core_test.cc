#include "server/daemon_core.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"
#include "server/metrics.h"
#include "server/pool/chunk_source.h"
#include "server/pool/device_pools.h"
#include "tests/server/full_device_source.h"
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

// Remembers what the core reported.
class RecordingObserver : public SessionObserver {
 public:
  void SessionStarted(const SessionIdentity& identity, const AppliedConfig& running,
                      const v1::AutotunePreferences& preferences) override {
    started.push_back({identity.id, running.version, running.config,
                       preferences.pinned_keys_size()});
  }
  void SessionEnded(SessionId id) override { ended.push_back(id); }
  void Events(SessionId, const v1::EventBatch& batch) override {
    events += batch.ops_size();
  }
  void Stats(SessionId, const std::map<std::string, int64_t>& s, uint64_t) override {
    stats += s.size();
  }
  void Oom(SessionId, uint64_t version) override { ooms.push_back(version); }
  void Acked(SessionId, uint64_t version, bool applied, const std::string&) override {
    acks.push_back({version, applied});
  }

  struct Started {
    SessionId id;
    uint64_t version;
    std::string config;
    int pinned;
  };
  std::vector<Started> started;
  std::vector<SessionId> ended;
  int events = 0;
  size_t stats = 0;
  std::vector<uint64_t> ooms;
  std::vector<std::pair<uint64_t, bool>> acks;
};

class DaemonCoreObserverTest : public DaemonCoreTest {
 protected:
  void SetUp() override { core_.SetObserver(&observer_); }

  v1::RegisterResponse Register(const std::string& current = "",
                                uint64_t current_version = 0) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job("llama");
    r.set_initial_config("max_split_size_mb:64");
    r.set_current_config(current);
    r.set_current_config_version(current_version);
    r.mutable_autotune()->add_pinned_keys("expandable_segments");
    absl::StatusOr<v1::RegisterResponse> response = core_.Register(kPeer, r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::RegisterResponse();
  }

  static constexpr PeerCredentials kPeer{.pid = 4242, .uid = 0, .gid = 0};
  RecordingObserver observer_;
};

TEST_F(DaemonCoreObserverTest, ReportsWhatSessionsSayAndNothingElse) {
  const SessionId id = Register().session_id();
  ASSERT_EQ(observer_.started.size(), 1u);
  EXPECT_EQ(observer_.started[0].config, "max_split_size_mb:64");
  EXPECT_EQ(observer_.started[0].pinned, 1);

  v1::TelemetryReport events;
  events.set_session_id(id);
  for (int i = 0; i < 3; ++i) {
    events.mutable_events()->add_ops(i);
    events.mutable_events()->add_sizes(512);
    events.mutable_events()->add_ids(1);
    events.mutable_events()->add_streams(7);
  }
  absl::Status sent = core_.Telemetry(kPeer, events);
  ASSERT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(observer_.events, 3);
  EXPECT_EQ(observer_.stats, 0u);  // events alone leave the stats be

  v1::TelemetryReport bad = events;
  bad.mutable_events()->add_ops(9);
  EXPECT_TRUE(absl::IsInvalidArgument(core_.Telemetry(kPeer, bad)));
  bad = events;
  bad.mutable_events()->set_ops(0, 5);
  bad.mutable_events()->add_sizes(1);
  bad.mutable_events()->add_ids(1);
  bad.mutable_events()->add_streams(1);
  bad.mutable_events()->add_ops(0);
  EXPECT_TRUE(absl::IsInvalidArgument(core_.Telemetry(kPeer, bad)));
  EXPECT_EQ(observer_.events, 3);

  absl::StatusOr<uint64_t> pushed = core_.PushToSession(
      id, "expandable_segments:True", "autotune", "canary", 0);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  // The canary's version is not the job's config.
  EXPECT_EQ(core_.GetConfig("llama").config().version(), 0u);
  v1::ConfigAck ack;
  ack.set_session_id(id);
  ack.set_version(*pushed);
  ack.set_applied(true);
  ASSERT_TRUE(core_.AckConfig(kPeer, ack).ok());
  EXPECT_EQ(observer_.acks, (std::vector<std::pair<uint64_t, bool>>{{*pushed, true}}));

  v1::OomReport oom;
  oom.set_session_id(id);
  oom.set_requested_bytes(1 << 20);
  oom.set_config_version(*pushed);
  absl::StatusOr<v1::OomResponse> oomed = core_.ReportOom(kPeer, oom);
  ASSERT_TRUE(oomed.ok()) << oomed.status();
  EXPECT_TRUE(oomed->rolled_back());
  EXPECT_EQ(observer_.ooms, std::vector<uint64_t>{*pushed});
  // The core rolled back already: the autotuner's rollback adds none.
  ASSERT_TRUE(core_.RollBackSession(id, "max_split_size_mb:64", "again").ok());
  int rollbacks = 0;
  const v1::HistoryResponse history = core_.History("llama", 100);
  for (const v1::HistoryEntry& e : history.entries()) {
    rollbacks += e.event() == "rollback";
  }
  EXPECT_EQ(rollbacks, 1);

  core_.EndSession(id, "test");
  EXPECT_EQ(observer_.ended, std::vector<SessionId>{id});
}

TEST_F(DaemonCoreObserverTest, AReconnectingClientsConfigIsAdoptedNotPushedAgain) {
  // A restarted daemon whose config for the job is what the client runs.
  ASSERT_TRUE(core_.SetConfig("llama", "expandable_segments:True", "test").ok());
  v1::RegisterResponse r = Register("expandable_segments:True", 17);
  ASSERT_EQ(observer_.started.size(), 1u);
  EXPECT_EQ(observer_.started[0].config, "expandable_segments:True");
  EXPECT_NE(r.current_config_version(), 0u);
  EXPECT_EQ(observer_.started[0].version, r.current_config_version());
  std::shared_ptr<Session> session = core_.Watch(kPeer, r.session_id()).value();
  v1::ControlMessage message;
  EXPECT_FALSE(session->WaitNext(&message, absl::ZeroDuration()));
  EXPECT_EQ(session->Current().config, "expandable_segments:True");
  // An OOM under it goes back to the client's initial config.
  EXPECT_EQ(session->RollBackTarget()->config, "max_split_size_mb:64");
}

// A session registering while its job's config is set is pushed that
// version once: by the set's fan-out or by its registration, never both
// (the client would apply it twice and ACK twice).
TEST_F(DaemonCoreTest, ASessionRegisteringDuringASetIsPushedItOnce) {
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  hello.set_job("llama");
  std::atomic<bool> registering{true};
  std::thread setter([&] {
    for (int i = 0; registering; ++i) {
      ASSERT_TRUE(core_.SetConfig("llama",
                                  i % 2 == 0 ? "max_split_size_mb:256"
                                             : "max_split_size_mb:512",
                                  "test")
                      .ok());
      // Registrations get the lock between two sets (it is not fair).
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  // Each session is checked, then ended, a few registrations later (a
  // racing push lands by then): a set pushes to the open sessions only.
  std::deque<SessionId> open;
  auto check_and_end = [&](SessionId id) {
    std::shared_ptr<Session> session = core_.Watch(peer, id).value();
    std::set<uint64_t> versions;
    v1::ControlMessage m;
    while (session->WaitNext(&m, absl::ZeroDuration())) {
      EXPECT_TRUE(versions.insert(m.config().config().version()).second)
          << "session " << id << " was pushed version "
          << m.config().config().version() << " twice";
    }
    core_.EndSession(id, "checked");
  };
  for (int i = 0; i < 400; ++i) {
    absl::StatusOr<v1::RegisterResponse> r = core_.Register(peer, hello);
    ASSERT_TRUE(r.ok()) << r.status();
    open.push_back(r->session_id());
    if (open.size() > 4) {
      check_and_end(open.front());
      open.pop_front();
    }
  }
  registering = false;
  setter.join();
  for (SessionId id : open) check_and_end(id);
}

// The sessions file a daemon before this one left, listing `sessions`;
// removed when the test ends.
class SessionsFile {
 public:
  explicit SessionsFile(const SessionsByPid& sessions) {
    close(mkstemp(path_.data()));
    EXPECT_TRUE(WriteSessionsFile(path_, sessions).ok());
  }
  ~SessionsFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_ = "/tmp/allocd_core_sessions_XXXXXX";
};

// A restarted core: the sessions file names a live process (this one, pid
// 4242 to the core) and a dead one. New memory waits for the live one to
// re-declare, then the chunks it declared are its own, and the file lists
// the sessions the core has now, for the daemon after it.
// What the lease's thread serves: a grant at once, or nullopt with nothing
// taken where AcquireChunks would wait for other sessions to give back.
TEST_F(DaemonCoreTest, AnAcquireThatWouldWaitGrantsNothingAndSaysSo) {
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  absl::StatusOr<v1::RegisterResponse> holder = core_.Register(peer, hello);
  absl::StatusOr<v1::RegisterResponse> asker = core_.Register(peer, hello);
  ASSERT_TRUE(holder.ok() && asker.ok());
  EXPECT_TRUE(holder->lease_acquires());
  v1::AcquireChunksRequest r;
  r.set_session_id(holder->session_id());
  r.set_bytes(uint64_t{768} << 20);
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> now =
      core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(now.ok()) << now.status();
  ASSERT_TRUE(now->has_value());
  EXPECT_EQ((*now)->bytes(), uint64_t{768} << 20);

  // 512 MiB more is short by 256: another session would have to give back.
  r.set_session_id(asker->session_id());
  r.set_bytes(uint64_t{512} << 20);
  now = core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_FALSE(now->has_value());
  EXPECT_EQ(core_.Status().in_use_bytes(), uint64_t{768} << 20);
  // What no wait would change is refused as AcquireChunks refuses it.
  r.set_bytes(uint64_t{2} << 30);
  EXPECT_EQ(core_.AcquireChunksNow(peer, r).status().code(),
            absl::StatusCode::kResourceExhausted);
  r.set_session_id(12345);
  EXPECT_EQ(core_.AcquireChunksNow(peer, r).status().code(),
            absl::StatusCode::kNotFound);
}

// A grant read ahead (GrantReadAhead) comes from the cache only and leaves
// the pool as much again free, or is not made: it never waits, never takes
// what others cache, and never makes the daemon create memory.
TEST_F(DaemonCoreTest, AReadAheadTakesCachedGrantsLeavingThePoolAsMuchAgainFree) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  absl::StatusOr<v1::RegisterResponse> session = core_.Register(peer, hello);
  ASSERT_TRUE(session.ok());
  v1::AcquireChunksRequest r;
  r.set_session_id(session->session_id());
  r.set_read_ahead(true);
  r.set_count(8);
  r.set_bytes(128 * kMiB);
  // A cold pool: nothing is read ahead, and nothing is created for it.
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> ahead =
      core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_FALSE(ahead->has_value());
  EXPECT_EQ(pool_.Stats().chunks_created_total, 0u);

  // 768 MiB cached of the 1 GiB.
  v1::AcquireChunksRequest needed = r;
  needed.set_read_ahead(false);
  needed.set_count(0);
  needed.set_bytes(768 * kMiB);
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> held =
      core_.AcquireChunksNow(peer, needed);
  ASSERT_TRUE(held.ok() && held->has_value());
  v1::ReleaseChunksRequest release;
  release.set_session_id(session->session_id());
  *release.mutable_chunk_ids() = (*held)->chunk_ids();
  ASSERT_TRUE(core_.ReleaseChunks(peer, release).ok());
  const uint64_t created = pool_.Stats().chunks_created_total;

  // Eight grants of 128 MiB asked, six cached: four leave as much again
  // (1 GiB available, 512 MiB after), in one answer, all from the cache.
  ahead = core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(ahead.ok() && ahead->has_value());
  EXPECT_EQ((*ahead)->bytes(), 512 * kMiB);
  EXPECT_EQ((*ahead)->reused_chunks(),
            static_cast<uint32_t>((*ahead)->chunk_ids_size()));
  // Count 0 is one grant; 258 MiB would leave 254 of 512: none.
  r.set_count(0);
  r.set_bytes(258 * kMiB);
  ahead = core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(ahead.ok());
  EXPECT_FALSE(ahead->has_value());
  // Beyond the pool it is not an error either (nothing was needed yet).
  r.set_bytes(uint64_t{2} << 30);
  ahead = core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(ahead.ok());
  EXPECT_FALSE(ahead->has_value());
  EXPECT_EQ(core_.Status().in_use_bytes(), 512 * kMiB);
  EXPECT_EQ(pool_.Stats().chunks_created_total, created);
  // The same request, needed, is granted.
  r.set_read_ahead(false);
  r.set_bytes(258 * kMiB);
  ahead = core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(ahead.ok() && ahead->has_value());
}

// A session's working set (its segments at its peak, from its telemetry)
// is handed to the next session of the same job on the device when it ends;
// a job without a label, or another job, is handed nothing, and a working
// set that cannot be one is refused.
TEST_F(DaemonCoreTest, AnEndedSessionsWorkingSetIsHandedToItsJobsNextSession) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  auto hello = [&](const std::string& job) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job(job);
    absl::StatusOr<v1::RegisterResponse> response = core_.Register(peer, r);
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  };
  auto report = [&](uint64_t session, std::vector<uint64_t> segments) {
    v1::TelemetryReport r;
    r.set_session_id(session);
    for (uint64_t bytes : segments) {
      r.mutable_working_set()->add_segment_bytes(bytes);
    }
    return core_.Telemetry(peer, r);
  };
  const v1::RegisterResponse first = hello("trainer");
  EXPECT_EQ(first.working_set().segment_bytes_size(), 0);
  ASSERT_TRUE(report(first.session_id(), {20 * kMiB, 2 * kMiB}).ok());
  ASSERT_TRUE(
      report(first.session_id(), {20 * kMiB, 2 * kMiB, 512 * kMiB}).ok());
  // Not a multiple of the chunk, zero, too many: refused, the last kept.
  EXPECT_TRUE(absl::IsInvalidArgument(report(first.session_id(), {kMiB})));
  EXPECT_TRUE(absl::IsInvalidArgument(report(first.session_id(), {0})));
  EXPECT_TRUE(absl::IsInvalidArgument(report(
      first.session_id(),
      std::vector<uint64_t>(kMaxWorkingSetSegments + 1, 2 * kMiB))));
  const v1::RegisterResponse unlabelled = hello("");
  ASSERT_TRUE(report(unlabelled.session_id(), {2 * kMiB}).ok());
  // Nothing before the session ends.
  EXPECT_EQ(hello("trainer").working_set().segment_bytes_size(), 0);
  core_.EndSession(first.session_id(), "test");
  core_.EndSession(unlabelled.session_id(), "test");

  EXPECT_THAT(hello("trainer").working_set().segment_bytes(),
              ::testing::ElementsAre(20 * kMiB, 2 * kMiB, 512 * kMiB));
  EXPECT_EQ(hello("evaluator").working_set().segment_bytes_size(), 0);
  EXPECT_EQ(hello("").working_set().segment_bytes_size(), 0);
}

// The pool's capacity has room, the device has not: the other session's
// cache is asked back, as for a shortage of the pool, and serves the grant.
TEST(DaemonCoreReclaimTest, AFullDeviceAsksOtherSessionsCachesBack) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  FullDeviceSource source(16 * kMiB);
  NodePool pool(&source, uint64_t{1} << 30);
  Metrics metrics;
  DaemonCore core({.reclaim_wait = absl::Seconds(10)}, &pool, &metrics);
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  absl::StatusOr<v1::RegisterResponse> cacher = core.Register(peer, hello);
  absl::StatusOr<v1::RegisterResponse> needy = core.Register(peer, hello);
  ASSERT_TRUE(cacher.ok() && needy.ok());
  v1::AcquireChunksRequest ask;
  ask.set_session_id(cacher->session_id());
  ask.set_bytes(12 * kMiB);
  absl::StatusOr<v1::AcquireChunksResponse> cached =
      core.AcquireChunks(peer, ask);
  ASSERT_TRUE(cached.ok()) << cached.status();
  v1::TelemetryReport report;
  report.set_session_id(cacher->session_id());
  (*report.mutable_stats())["reserved_bytes.all.current"] = 12 * kMiB;
  (*report.mutable_stats())["allocated_bytes.all.current"] = 0;
  ASSERT_TRUE(core.Telemetry(peer, report).ok());

  // The cacher answers the reclaim as its allocator would: empty_cache.
  absl::StatusOr<std::shared_ptr<Session>> watched =
      core.Watch(peer, cacher->session_id());
  ASSERT_TRUE(watched.ok());
  std::thread cacher_thread([&] {
    v1::ControlMessage message;
    ASSERT_TRUE((*watched)->WaitNext(&message, absl::Seconds(10)));
    ASSERT_TRUE(message.has_reclaim());
    EXPECT_EQ(message.reclaim().bytes(), 8 * kMiB);  // what the device lacks
    v1::ReleaseChunksRequest release;
    release.set_session_id(cacher->session_id());
    *release.mutable_chunk_ids() = cached->chunk_ids();
    EXPECT_TRUE(core.ReleaseChunks(peer, release).ok());
  });
  ask.set_session_id(needy->session_id());
  // Not on the lease's thread, which never waits...
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> now =
      core.AcquireChunksNow(peer, ask);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_FALSE(now->has_value());
  // ...but over gRPC: the cacher's chunks come back and serve it.
  absl::StatusOr<v1::AcquireChunksResponse> granted =
      core.AcquireChunks(peer, ask);
  cacher_thread.join();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_GE(granted->reused_chunks(), 1u);
  EXPECT_EQ(core.Status().in_use_bytes(), 12 * kMiB);
}

TEST(DaemonCoreRestartTest, NewMemoryWaitsUntilTheSurvivorsDeclared) {
  const pid_t self = getpid();
  const SessionsFile sessions_file({{self, 1}, {999999999, 1}});
  const std::string& file = sessions_file.path();
  MemfdChunkSource source;
  NodePool pool(&source, uint64_t{64} << 20);
  Metrics metrics;
  DaemonCore core({.sessions_file = file, .adopt_window = absl::Hours(1)},
                  &pool, &metrics);
  EXPECT_TRUE(core.Status().adopting());

  const PeerCredentials survivor{.pid = self, .uid = 0};
  const PeerCredentials newcomer{.pid = self + 1, .uid = 0};
  v1::RegisterRequest request;
  request.set_protocol_version(1);
  absl::StatusOr<v1::RegisterResponse> back = core.Register(survivor, request);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->adopts_chunks());
  EXPECT_TRUE(back->declare_fds());  // sim: the memfds prove the chunks
  absl::StatusOr<v1::RegisterResponse> fresh = core.Register(newcomer, request);
  ASSERT_TRUE(fresh.ok());

  absl::Notification served;
  absl::StatusOr<v1::AcquireChunksResponse> granted;
  std::thread acquire([&] {
    v1::AcquireChunksRequest r;
    r.set_session_id(fresh->session_id());
    r.set_bytes(2 << 20);
    granted = core.AcquireChunks(newcomer, r);
    served.Notify();
  });
  EXPECT_FALSE(served.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  // The lease's thread never waits: it is told to ask over gRPC.
  {
    v1::AcquireChunksRequest r;
    r.set_session_id(fresh->session_id());
    r.set_bytes(2 << 20);
    absl::StatusOr<std::optional<v1::AcquireChunksResponse>> now =
        core.AcquireChunksNow(newcomer, r);
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_FALSE(now->has_value());
  }

  // The survivor's chunk from the daemon before, proven by its memfd.
  absl::StatusOr<ChunkMemory> old = source.CreateChunk(2 << 20);
  ASSERT_TRUE(old.ok());
  std::vector<DeclaredChunk> declared;
  declared.push_back({.id = 77,
                      .bytes = 2 << 20,
                      .fd = UniqueFd(dup(old->file->get()))});
  // Another process cannot declare on the survivor's session.
  EXPECT_EQ(core.DeclareChunks(newcomer, back->session_id(), {}, true)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<AdoptOutcome> adopted =
      core.DeclareChunks(survivor, back->session_id(), std::move(declared),
                         /*last=*/true);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->adopted, std::vector<uint64_t>{77});
  acquire.join();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_NE(granted->chunk_ids(0), 77u);
  const v1::StatusResponse status = core.Status();
  EXPECT_FALSE(status.adopting());
  EXPECT_EQ(status.in_use_bytes(), uint64_t{4} << 20);
  EXPECT_EQ(status.adopted_bytes_total(), uint64_t{2} << 20);
  // The file: this process's two sessions; the dead one is forgotten.
  EXPECT_THAT(ReadSessionsFile(file, [](pid_t) { return true; }),
              ::testing::ElementsAre(::testing::Pair(self, 1),
                                     ::testing::Pair(self + 1, 1)));
  core.EndAll();
  // A shutdown leaves them listed: their processes live on.
  EXPECT_EQ(ReadSessionsFile(file, [](pid_t) { return true; }).size(), 2u);
}

// On a device, the capacity is clipped to what was free at start plus what
// the survivors hold (in use, so not free), and grows by what a late
// declaration holds.
TEST(DaemonCoreRestartTest, TheCapacityIsClippedToTheDeviceAfterAdoption) {
  constexpr uint64_t kChunk = uint64_t{2} << 20;
  {
    MemfdChunkSource source;
    NodePool pool(&source, 64 * kChunk);
    Metrics metrics;
    DaemonCore core({.devices_at_start = {{.free_memory = 5 * kChunk}}},
                    &pool, &metrics);
    EXPECT_EQ(core.Status().capacity_bytes(), 5 * kChunk);  // no window
  }
  const pid_t self = getpid();
  const SessionsFile sessions_file(SessionsByPid{{self, 1}});
  MemfdChunkSource source;
  NodePool pool(&source, 64 * kChunk);
  Metrics metrics;
  DaemonCore core({.sessions_file = sessions_file.path(),
                   .adopt_window = absl::Hours(1),
                   .devices_at_start = {{.free_memory = 5 * kChunk}}},
                  &pool, &metrics);
  EXPECT_EQ(core.Status().capacity_bytes(), 64 * kChunk);  // not yet
  v1::RegisterRequest request;
  request.set_protocol_version(1);
  const PeerCredentials survivor{.pid = self, .uid = 0};
  const PeerCredentials late{.pid = self + 1, .uid = 0};
  absl::StatusOr<v1::RegisterResponse> a = core.Register(survivor, request);
  absl::StatusOr<v1::RegisterResponse> b = core.Register(late, request);
  ASSERT_TRUE(a.ok() && b.ok());
  auto chunks = [&](std::vector<uint64_t> ids) {
    std::vector<DeclaredChunk> declared;
    for (uint64_t id : ids) {
      absl::StatusOr<ChunkMemory> memory = source.CreateChunk(kChunk);
      EXPECT_TRUE(memory.ok());
      declared.push_back({.id = id,
                          .bytes = kChunk,
                          .fd = UniqueFd(dup(memory->file->get()))});
    }
    return declared;
  };
  ASSERT_TRUE(core.DeclareChunks(survivor, a->session_id(), chunks({1, 2}), true).ok());
  EXPECT_EQ(core.Status().capacity_bytes(), 7 * kChunk);
  ASSERT_TRUE(core.DeclareChunks(late, b->session_id(), chunks({3}), true).ok());
  EXPECT_EQ(core.Status().capacity_bytes(), 8 * kChunk);
  EXPECT_EQ(core.Status().in_use_bytes(), 3 * kChunk);
}

// A capacity the daemon derived from the device's free memory (no
// --capacity) grows by what the survivors hold: it was in use at start, so
// not in the free memory the capacity was taken from.
TEST(DaemonCoreRestartTest, ACapacityTakenFromFreeMemoryGrowsByTheAdopted) {
  constexpr uint64_t kChunk = uint64_t{2} << 20;
  const pid_t self = getpid();
  const SessionsFile sessions_file(SessionsByPid{{self, 1}});
  MemfdChunkSource source;
  // 5 chunks free at start, 1 of headroom.
  NodePool pool(&source, {.capacity = 4 * kChunk,
                          .chunk_classes = DefaultChunkClasses(kChunk)});
  Metrics metrics;
  DaemonCore core(
      {.sessions_file = sessions_file.path(),
       .adopt_window = absl::Hours(1),
       .devices_at_start = {{.free_memory = 5 * kChunk,
                             .capacity_from_free = true}}},
      &pool, &metrics);
  v1::RegisterRequest request;
  request.set_protocol_version(1);
  const PeerCredentials survivor{.pid = self, .uid = 0};
  const PeerCredentials late{.pid = self + 1, .uid = 0};
  absl::StatusOr<v1::RegisterResponse> a = core.Register(survivor, request);
  absl::StatusOr<v1::RegisterResponse> b = core.Register(late, request);
  ASSERT_TRUE(a.ok() && b.ok());
  auto declare = [&](const PeerCredentials& peer, SessionId session,
                     uint64_t id, uint64_t bytes) {
    absl::StatusOr<ChunkMemory> memory = source.CreateChunk(bytes);
    ASSERT_TRUE(memory.ok());
    std::vector<DeclaredChunk> declared;
    declared.push_back(
        {.id = id, .bytes = bytes, .fd = UniqueFd(dup(memory->file->get()))});
    absl::StatusOr<AdoptOutcome> outcome =
        core.DeclareChunks(peer, session, std::move(declared), true);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->adopted.size(), 1u);
  };
  declare(survivor, a->session_id(), 1, 8 * kChunk);  // a 16 MiB class chunk
  EXPECT_EQ(core.Status().capacity_bytes(), 12 * kChunk);
  declare(late, b->session_id(), 2, kChunk);
  EXPECT_EQ(core.Status().capacity_bytes(), 13 * kChunk);
  EXPECT_EQ(core.Status().in_use_bytes(), 9 * kChunk);
}

// With a pool per GPU, a session's declaration goes to its own device's
// pool, and each device's capacity is fitted to its own free memory.
TEST(DaemonCoreRestartTest, ChunksAreAdoptedIntoTheSessionsDevicePool) {
  constexpr uint64_t kChunk = uint64_t{2} << 20;
  const pid_t self = getpid();
  const SessionsFile sessions_file(SessionsByPid{{self, 1}});
  MemfdChunkSource source0;
  MemfdChunkSource source1;
  const NodePool::Options options{
      .capacity = 64 * kChunk, .chunk_classes = DefaultChunkClasses(kChunk)};
  NodePool pool0(&source0, options);
  NodePool pool1(&source1, options);
  DevicePools pools;
  ASSERT_TRUE(pools.AddBorrowed(SimDeviceUuid(0), "memfd", &pool0).ok());
  ASSERT_TRUE(pools.AddBorrowed(SimDeviceUuid(1), "memfd", &pool1).ok());
  Metrics metrics;
  DaemonCore core({.sessions_file = sessions_file.path(),
                   .adopt_window = absl::Hours(1),
                   .devices_at_start = {{.free_memory = 10 * kChunk},
                                        {.free_memory = 20 * kChunk}}},
                  &pools, &metrics);
  v1::RegisterRequest request;
  request.set_protocol_version(1);
  request.set_gpu_uuid(SimDeviceUuid(1));
  const PeerCredentials survivor{.pid = self, .uid = 0};
  absl::StatusOr<v1::RegisterResponse> session =
      core.Register(survivor, request);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->node_device(), 1);
  absl::StatusOr<ChunkMemory> memory = source1.CreateChunk(64 * kChunk);
  ASSERT_TRUE(memory.ok());
  std::vector<DeclaredChunk> declared;
  declared.push_back({.id = 5,
                      .bytes = 64 * kChunk,
                      .fd = UniqueFd(dup(memory->file->get()))});
  // Not a size the pools' chunks come in.
  declared.push_back({.id = 6, .bytes = 3 * kChunk});
  absl::StatusOr<AdoptOutcome> outcome = core.DeclareChunks(
      survivor, session->session_id(), std::move(declared), true);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->adopted, std::vector<uint64_t>{5});
  ASSERT_EQ(outcome->refused.size(), 1u);
  EXPECT_EQ(outcome->refused[0].first, 6u);
  EXPECT_EQ(pool0.Stats().in_use_bytes, 0u);
  EXPECT_EQ(pool1.Stats().in_use_bytes, 64 * kChunk);
  // Clipped to each device's free memory plus what it adopted.
  EXPECT_EQ(pool0.capacity(), 10 * kChunk);
  EXPECT_EQ(pool1.capacity(), 64 * kChunk);
  const v1::StatusResponse status = core.Status();
  EXPECT_EQ(status.adopted_bytes_total(), 64 * kChunk);
  ASSERT_EQ(status.devices_size(), 2);
  EXPECT_EQ(status.devices(0).adopted_bytes_total(), 0u);
  EXPECT_EQ(status.devices(1).adopted_bytes_total(), 64 * kChunk);
  EXPECT_THAT(metrics.Render(),
              HasSubstr("allocd_pool_adopted_bytes_total{device=\"1\",gpu_uuid=\"" +
                        SimDeviceUuid(1) + "\"} 134217728"));
}

}  // namespace
}  // namespace allocd
