#include "server/daemon_core.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

class DaemonCoreTest : public ::testing::Test {
 protected:
  MemfdChunkSource source_;
  NodePool pool_{&source_, uint64_t{1} << 30};
  Metrics metrics_;
  DaemonCore core_{{}, &pool_, &metrics_};
};

// Remembers what the core reported.
class RecordingObserver : public SessionObserver {
 public:
  std::optional<ConfigPusher::Learned> LearnedConfigFor(const SessionIdentity&,
                                                        const v1::AutotunePreferences&,
                                                        const v1::JobFeatures&) override {
    return std::nullopt;
  }
  void SessionStarted(const SessionIdentity& identity, const AppliedConfig& running,
                      const std::optional<AppliedConfig>&,
                      const std::optional<AppliedConfig>&,
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
  void Features(SessionId id, const v1::JobFeatures& f) override {
    features.push_back({id, f.SerializeAsString()});
  }
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
  std::vector<std::pair<SessionId, std::string>> features;  // serialized
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
  const v1::RegisterResponse registered = Register();
  const SessionId id = registered.session_id();
  ASSERT_EQ(observer_.started.size(), 1u);
  EXPECT_EQ(observer_.started[0].config, "max_split_size_mb:64");
  EXPECT_EQ(observer_.started[0].pinned, 1);

  v1::TelemetryReport events;
  events.set_session_id(id);
  events.set_session_secret(registered.session_secret());
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
  ack.set_session_secret(registered.session_secret());
  ack.set_version(*pushed);
  ack.set_applied(true);
  ASSERT_TRUE(core_.AckConfig(kPeer, ack).ok());
  EXPECT_EQ(observer_.acks, (std::vector<std::pair<uint64_t, bool>>{{*pushed, true}}));

  v1::OomReport oom;
  oom.set_session_id(id);
  oom.set_session_secret(registered.session_secret());
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

// A client says what its process does with its CUDA memory at registration
// and again when it starts doing more; a report of features alone leaves
// the stats be.
TEST_F(DaemonCoreObserverTest, FeaturesReachTheObserverAtRegistrationAndLater) {
  v1::RegisterRequest r;
  r.set_protocol_version(1);
  r.set_job("llama");
  r.mutable_features()->set_nccl_registration(true);
  absl::StatusOr<v1::RegisterResponse> registered = core_.Register(kPeer, r);
  ASSERT_TRUE(registered.ok()) << registered.status();
  const SessionId id = registered->session_id();
  ASSERT_EQ(observer_.features.size(), 1u);
  v1::JobFeatures first;
  ASSERT_TRUE(first.ParseFromString(observer_.features[0].second));
  EXPECT_EQ(observer_.features[0].first, id);
  EXPECT_TRUE(first.nccl_registration());
  EXPECT_FALSE(first.cuda_ipc());

  v1::TelemetryReport report;
  report.set_session_id(id);
  report.set_session_secret(registered->session_secret());
  report.mutable_features()->set_cuda_ipc(true);
  ASSERT_TRUE(core_.Telemetry(kPeer, report).ok());
  ASSERT_EQ(observer_.features.size(), 2u);
  v1::JobFeatures later;
  ASSERT_TRUE(later.ParseFromString(observer_.features[1].second));
  EXPECT_TRUE(later.cuda_ipc());
  EXPECT_EQ(observer_.stats, 0u);

  // A client that reports none is not said to.
  Register();
  EXPECT_EQ(observer_.features.size(), 2u);
}

TEST_F(DaemonCoreObserverTest, AReconnectingClientsConfigIsAdoptedNotPushedAgain) {
  // A restarted daemon whose config for the job is what the client runs.
  ASSERT_TRUE(core_.SetConfig("llama", "expandable_segments:True", "test").ok());
  v1::RegisterResponse r = Register("expandable_segments:True", 17);
  ASSERT_EQ(observer_.started.size(), 1u);
  EXPECT_EQ(observer_.started[0].config, "expandable_segments:True");
  EXPECT_NE(r.current_config_version(), 0u);
  EXPECT_EQ(observer_.started[0].version, r.current_config_version());
  std::shared_ptr<Session> session =
      core_.Watch(kPeer, r.session_id(), r.session_secret()).value();
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
  std::deque<v1::RegisterResponse> open;
  auto check_and_end = [&](const v1::RegisterResponse& registered) {
    const SessionId id = registered.session_id();
    std::shared_ptr<Session> session =
        core_.Watch(peer, id, registered.session_secret()).value();
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
    open.push_back(*r);
    if (open.size() > 4) {
      check_and_end(open.front());
      open.pop_front();
    }
  }
  registering = false;
  setter.join();
  for (const v1::RegisterResponse& r : open) check_and_end(r);
}

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
  r.set_session_secret(holder->session_secret());
  r.set_bytes(uint64_t{768} << 20);
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> now =
      core_.AcquireChunksNow(peer, r);
  ASSERT_TRUE(now.ok()) << now.status();
  ASSERT_TRUE(now->has_value());
  EXPECT_EQ((*now)->bytes(), uint64_t{768} << 20);

  // 512 MiB more is short by 256: another session would have to give back.
  r.set_session_id(asker->session_id());
  r.set_session_secret(asker->session_secret());
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
  r.set_session_secret(session->session_secret());
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
  release.set_session_secret(session->session_secret());
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

}  // namespace
}  // namespace allocd
