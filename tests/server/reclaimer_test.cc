#include "server/reclaimer.h"

#include <unistd.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"
#include "server/session_registry.h"
#include "tests/server/pool/full_device_source.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// The reclaim messages `session` was sent, by the bytes each asks.
std::vector<uint64_t> AskedOf(Session& session) {
  std::vector<uint64_t> asked;
  v1::ControlMessage m;
  while (session.WaitNext(&m, absl::ZeroDuration())) {
    asked.push_back(m.reclaim().bytes());
  }
  return asked;
}

// What an allocator caching `bytes` reports.
std::map<std::string, int64_t> Caching(uint64_t bytes) {
  return {{"reserved_bytes.all.current", static_cast<int64_t>(bytes) + 1},
          {"allocated_bytes.all.current", 1}};
}

// A reclaimer over a 1 GiB pool of device 0, and its sessions.
class ReclaimerTest : public ::testing::Test {
 protected:
  // A new session of `device` whose allocator caches `bytes` (none: no
  // telemetry yet).
  std::shared_ptr<Session> Cacher(std::optional<uint64_t> bytes, int device = 0) {
    std::shared_ptr<Session> s = sessions_.Create({.node_device = device});
    if (bytes.has_value()) s->SetStats(Caching(*bytes));
    return s;
  }
  // A new session of device 0 that reported a peak the pool's free memory
  // covers: each session asked for it is asked for the shortfall, not for
  // all it caches.
  std::shared_ptr<Session> AskerOfKnownPeak() {
    std::shared_ptr<Session> asker = Cacher(std::nullopt);
    asker->SetWorkingSet({2 * kMiB});
    return asker;
  }

  SessionRegistry sessions_;
  Metrics metrics_;
  Reclaimer reclaimer_{&sessions_, &metrics_, absl::Milliseconds(20)};
  MemfdChunkSource source_;
  NodePool pool_{&source_, kGiB};
};

// Only the other sessions of the asker's device that cache memory and are
// not waiting in an acquire of their own are asked, each for at most the
// shortfall; and nobody is asked when what they cache cannot cover it.
TEST_F(ReclaimerTest, AsksTheOtherCachersOfTheDeviceWhenTheyCanCoverIt) {
  std::shared_ptr<Session> asker = AskerOfKnownPeak();
  asker->SetStats(Caching(8 * kMiB));
  std::shared_ptr<Session> cacher = Cacher(8 * kMiB);
  std::shared_ptr<Session> other_gpu = Cacher(8 * kMiB, /*device=*/1);
  std::shared_ptr<Session> acquiring = Cacher(8 * kMiB);
  acquiring->BeginAcquire();

  reclaimer_.Reclaim(*asker, pool_, 16 * kMiB);
  EXPECT_TRUE(AskedOf(*cacher).empty());
  EXPECT_THAT(metrics_.Render(),
              HasSubstr("allocd_reclaim_requests_total 0"));

  reclaimer_.Reclaim(*asker, pool_, 4 * kMiB);
  EXPECT_EQ(AskedOf(*cacher), std::vector<uint64_t>{4 * kMiB});
  EXPECT_TRUE(AskedOf(*asker).empty());
  EXPECT_TRUE(AskedOf(*other_gpu).empty());
  EXPECT_TRUE(AskedOf(*acquiring).empty());
  EXPECT_THAT(metrics_.Render(),
              HasSubstr("allocd_reclaim_requests_total 1"));
}

// Only whom it takes is asked: the largest caches first, each for what is
// still short. A session asked that has not reported since counts as
// caching nothing, so the next reclaim (the job's allocator retrying its
// acquire) asks the next caches.
TEST_F(ReclaimerTest, AsksTheLargestCachesFirstAndOnlyAsManyAsItTakes) {
  std::shared_ptr<Session> asker = AskerOfKnownPeak();
  std::shared_ptr<Session> small = Cacher(1 * kGiB);
  std::shared_ptr<Session> large = Cacher(10 * kGiB);
  std::shared_ptr<Session> middle = Cacher(4 * kGiB);

  reclaimer_.Reclaim(*asker, pool_, 3 * kGiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{3 * kGiB});
  EXPECT_TRUE(AskedOf(*middle).empty());
  EXPECT_TRUE(AskedOf(*small).empty());

  // Nothing came back and the large one has not reported since: the next.
  reclaimer_.Reclaim(*asker, pool_, 3 * kGiB);
  EXPECT_TRUE(AskedOf(*large).empty());
  EXPECT_EQ(AskedOf(*middle), std::vector<uint64_t>{3 * kGiB});
  EXPECT_TRUE(AskedOf(*small).empty());

  // Both report what they cache still.
  large->SetStats(Caching(10 * kGiB));
  middle->SetStats(Caching(4 * kGiB));
  reclaimer_.Reclaim(*asker, pool_, 12 * kGiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{10 * kGiB});
  EXPECT_EQ(AskedOf(*middle), std::vector<uint64_t>{2 * kGiB});
  EXPECT_TRUE(AskedOf(*small).empty());
}

// A job gathering its peak one segment at a time is short once a segment:
// its last reported working set says how far it grows, and the others are
// asked for the rest of its peak beyond what the pool has free at once.
TEST_F(ReclaimerTest, AnAskerGatheringItsPeakIsGivenTheRestOfItInOneReclaim) {
  std::shared_ptr<Session> asker = Cacher(std::nullopt);
  asker->SetWorkingSet(std::vector<uint64_t>(6, 2 * kGiB));  // a 12 GiB peak
  std::shared_ptr<Session> large = Cacher(10 * kGiB);
  std::shared_ptr<Session> middle = Cacher(4 * kGiB);

  reclaimer_.Reclaim(*asker, pool_, 2 * kGiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{10 * kGiB});
  EXPECT_EQ(AskedOf(*middle), std::vector<uint64_t>{1 * kGiB});

  // Never more than the others cache.
  large->SetStats(Caching(3 * kGiB));
  middle->SetStats(Caching(4 * kGiB));
  reclaimer_.Reclaim(*asker, pool_, 2 * kGiB);
  EXPECT_EQ(AskedOf(*middle), std::vector<uint64_t>{4 * kGiB});
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{3 * kGiB});

  // A peak past its session quota: the others are asked for no more than
  // the quota lets it hold (a working set is the asker's word).
  ASSERT_TRUE(pool_.AddSession(asker->id(), 0, 1, "node").ok());
  ASSERT_TRUE(pool_.SetSessionQuota(asker->id(), 5 * kGiB));
  large->SetStats(Caching(10 * kGiB));
  middle->SetStats(Caching(4 * kGiB));
  reclaimer_.Reclaim(*asker, pool_, 2 * kGiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{4 * kGiB});  // 5 - 1 free
  EXPECT_TRUE(AskedOf(*middle).empty());

  // A peak the pool's free memory covers: only the shortfall.
  asker->SetWorkingSet({kGiB / 2});
  large->SetStats(Caching(10 * kGiB));
  middle->SetStats(Caching(4 * kGiB));
  reclaimer_.Reclaim(*asker, pool_, 2 * kGiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{2 * kGiB});
  EXPECT_TRUE(AskedOf(*middle).empty());
}

// An asker whose peak is not known (no working set reported yet, or it
// holds that much already: it grows past it) may ask again for each
// segment it gathers: each session asked is asked for all it caches.
TEST_F(ReclaimerTest, WhereTheAskersPeakIsNotKnownTheAskedGiveAllTheyCache) {
  std::shared_ptr<Session> asker = Cacher(std::nullopt);
  std::shared_ptr<Session> large = Cacher(8 * kMiB);
  std::shared_ptr<Session> small = Cacher(4 * kMiB);
  reclaimer_.Reclaim(*asker, pool_, 10 * kMiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{0});
  EXPECT_EQ(AskedOf(*small), std::vector<uint64_t>{0});

  // Its reported peak held already.
  ASSERT_TRUE(pool_.AddSession(asker->id(), 0, 1, "node").ok());
  ASSERT_TRUE(pool_.Acquire(asker->id(), 4 * kMiB).ok());
  asker->SetWorkingSet({4 * kMiB});
  large->SetStats(Caching(8 * kMiB));
  reclaimer_.Reclaim(*asker, pool_, 2 * kMiB);
  EXPECT_EQ(AskedOf(*large), std::vector<uint64_t>{0});
}

// Of caches alike, the oldest session's is asked.
TEST_F(ReclaimerTest, OfEqualCachesTheOldestSessionIsAsked) {
  std::shared_ptr<Session> asker = AskerOfKnownPeak();
  std::vector<std::shared_ptr<Session>> alike;
  for (int i = 0; i < 4; ++i) {
    alike.push_back(Cacher(8 * kMiB));
  }
  reclaimer_.Reclaim(*asker, pool_, 4 * kMiB);
  EXPECT_EQ(AskedOf(*alike[0]), std::vector<uint64_t>{4 * kMiB});
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(AskedOf(*alike[i]).empty()) << i;
}

// The pool's capacity has room, the device has not: the other session's
// cache is asked back, as for a shortage of the pool, and serves the grant.
TEST(DaemonCoreReclaimTest, AFullDeviceAsksOtherSessionsCachesBack) {
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
  ask.set_session_secret(cacher->session_secret());
  ask.set_bytes(12 * kMiB);
  absl::StatusOr<v1::AcquireChunksResponse> cached =
      core.AcquireChunks(peer, ask);
  ASSERT_TRUE(cached.ok()) << cached.status();
  v1::TelemetryReport report;
  report.set_session_id(cacher->session_id());
  report.set_session_secret(cacher->session_secret());
  (*report.mutable_stats())["reserved_bytes.all.current"] = 12 * kMiB;
  (*report.mutable_stats())["allocated_bytes.all.current"] = 0;
  ASSERT_TRUE(core.Telemetry(peer, report).ok());
  // The needy job's peak is known (KnowPeakWithinFreeMemory).
  v1::TelemetryReport peak;
  peak.set_session_id(needy->session_id());
  peak.set_session_secret(needy->session_secret());
  peak.mutable_working_set()->add_segment_bytes(8 * kMiB);
  ASSERT_TRUE(core.Telemetry(peer, peak).ok());

  // The cacher answers the reclaim as its allocator would: empty_cache.
  absl::StatusOr<std::shared_ptr<Session>> watched =
      core.Watch(peer, cacher->session_id(), cacher->session_secret());
  ASSERT_TRUE(watched.ok());
  std::thread cacher_thread([&] {
    v1::ControlMessage message;
    ASSERT_TRUE((*watched)->WaitNext(&message, absl::Seconds(10)));
    ASSERT_TRUE(message.has_reclaim());
    EXPECT_EQ(message.reclaim().bytes(), 8 * kMiB);  // what the device lacks
    v1::ReleaseChunksRequest release;
    release.set_session_id(cacher->session_id());
    release.set_session_secret(cacher->session_secret());
    *release.mutable_chunk_ids() = cached->chunk_ids();
    EXPECT_TRUE(core.ReleaseChunks(peer, release).ok());
  });
  ask.set_session_id(needy->session_id());
  ask.set_session_secret(needy->session_secret());
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

}  // namespace
}  // namespace allocd
