#include "server/working_set_store.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kMiB = uint64_t{1} << 20;

v1::WorkingSet SetOf(const std::vector<uint64_t>& segments) {
  v1::WorkingSet set;
  for (uint64_t bytes : segments) set.add_segment_bytes(bytes);
  return set;
}

// The last session of a job to end on a device hands its working set to
// the job's next session there: not another job's, another device's,
// another tenant's under the same label, or a job without a label.
TEST(WorkingSetStoreTest, KeepsTheLastEndedSessionsSetByTenantJobAndDevice) {
  WorkingSetStore store(uint64_t{1} << 30);
  SessionRegistry sessions;
  auto ended = [&](const std::string& job, int device,
                   std::vector<uint64_t> segments,
                   const TenantId& tenant = "uid:1001") {
    std::shared_ptr<Session> s = sessions.Create(
        {.tenant = tenant, .job = job, .node_device = device});
    EXPECT_TRUE(store.Report(*s, SetOf(segments), 2 * kMiB).ok());
    store.Remember(*s);
  };
  ended("trainer", 0, {20 * kMiB});
  ended("trainer", 0, {2 * kMiB, 4 * kMiB});
  ended("trainer", 1, {8 * kMiB});
  ended("", 0, {2 * kMiB});
  // Another tenant's session under the same label: its report is its own.
  ended("trainer", 0, {uint64_t{1} << 30}, "uid:1002");
  EXPECT_THAT(store.Last("uid:1001", "trainer", 0),
              ElementsAre(2 * kMiB, 4 * kMiB));
  EXPECT_THAT(store.Last("uid:1001", "trainer", 1), ElementsAre(8 * kMiB));
  EXPECT_THAT(store.Last("uid:1002", "trainer", 0),
              ElementsAre(uint64_t{1} << 30));
  EXPECT_TRUE(store.Last("uid:1003", "trainer", 0).empty());
  EXPECT_TRUE(store.Last("uid:1001", "evaluator", 0).empty());
  EXPECT_TRUE(store.Last("uid:1001", "", 0).empty());
  // A session that reported nothing leaves the last set as it was.
  std::shared_ptr<Session> quiet =
      sessions.Create({.tenant = "uid:1001", .job = "trainer"});
  store.Remember(*quiet);
  EXPECT_THAT(store.Last("uid:1001", "trainer", 0),
              ElementsAre(2 * kMiB, 4 * kMiB));
}

// A flood of labels, each a job that ended with a working set, keeps at
// most the tenant's share, its least recently remembered going first, and
// drops nothing of another tenant's until all of them pass the bound.
TEST(WorkingSetStoreTest, AFloodOfLabelsKeepsAtMostItsTenantsShare) {
  constexpr uint64_t kTotal = 64 * 1024, kPerTenant = 16 * 1024;
  WorkingSetStore store(uint64_t{1} << 30, kTotal, kPerTenant);
  SessionRegistry sessions;
  auto ended = [&](const TenantId& tenant, const std::string& job) {
    std::shared_ptr<Session> s = sessions.Create({.tenant = tenant, .job = job});
    EXPECT_TRUE(store.Report(*s, SetOf(std::vector<uint64_t>(100, 2 * kMiB)), 2 * kMiB).ok());
    store.Remember(*s);
  };
  ended("uid:1001", "victim");
  for (int i = 0; i < 1000; ++i) ended("uid:1002", "flood-" + std::to_string(i));
  EXPECT_LE(store.bytes("uid:1002"), kPerTenant);
  EXPECT_GT(store.bytes("uid:1002"), kPerTenant / 2);
  EXPECT_EQ(store.Last("uid:1001", "victim", 0).size(), 100u);
  EXPECT_EQ(store.Last("uid:1002", "flood-999", 0).size(), 100u);
  EXPECT_TRUE(store.Last("uid:1002", "flood-0", 0).empty());
  // Remembered again, a job is the most recent: the next to go is another.
  ended("uid:1002", "flood-990");
  ended("uid:1002", "flood-1000");
  EXPECT_EQ(store.Last("uid:1002", "flood-990", 0).size(), 100u);
  // Many tenants, each within its share: the bound holds for all, the
  // least recently remembered (the victim's) going first.
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 20; ++i) ended("uid:" + std::to_string(2000 + t), "j" + std::to_string(i));
  }
  EXPECT_LE(store.bytes(), kTotal);
  EXPECT_TRUE(store.Last("uid:1001", "victim", 0).empty());
  EXPECT_EQ(store.bytes("uid:1001"), 0u);
  EXPECT_EQ(store.Last("uid:2007", "j19", 0).size(), 100u);
}

TEST(WorkingSetStoreTest, ASetThatCannotBeOneIsRefusedAndTheLastKept) {
  WorkingSetStore store(64 * kMiB);
  SessionRegistry sessions;
  std::shared_ptr<Session> s = sessions.Create({.job = "trainer"});
  ASSERT_TRUE(store.Report(*s, SetOf({2 * kMiB, 64 * kMiB}), 2 * kMiB).ok());
  for (const std::vector<uint64_t>& bad :
       {std::vector<uint64_t>{kMiB}, std::vector<uint64_t>{0},
        std::vector<uint64_t>{66 * kMiB},
        std::vector<uint64_t>(kMaxWorkingSetSegments + 1, 2 * kMiB)}) {
    EXPECT_TRUE(
        absl::IsInvalidArgument(store.Report(*s, SetOf(bad), 2 * kMiB)));
  }
  EXPECT_THAT(s->WorkingSet(), ElementsAre(2 * kMiB, 64 * kMiB));
}

// Through the daemon: a session's working set (its segments at its peak,
// from its telemetry) is handed to the next session of the same job on the
// device when it ends; a job without a label, or another job, is handed
// nothing, and a working set that cannot be one is refused.
TEST(DaemonCoreWorkingSetTest,
     AnEndedSessionsWorkingSetIsHandedToItsJobsNextSession) {
  MemfdChunkSource source;
  NodePool pool(&source, uint64_t{1} << 30);
  Metrics metrics;
  DaemonCore core({}, &pool, &metrics);
  const PeerCredentials peer{.pid = getpid(), .uid = 0};
  auto hello = [&](const std::string& job) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job(job);
    absl::StatusOr<v1::RegisterResponse> response = core.Register(peer, r);
    EXPECT_TRUE(response.ok()) << response.status();
    return *response;
  };
  auto report = [&](const v1::RegisterResponse& session,
                    std::vector<uint64_t> segments) {
    v1::TelemetryReport r;
    r.set_session_id(session.session_id());
    r.set_session_secret(session.session_secret());
    *r.mutable_working_set() = SetOf(segments);
    return core.Telemetry(peer, r);
  };
  const v1::RegisterResponse first = hello("trainer");
  EXPECT_EQ(first.working_set().segment_bytes_size(), 0);
  ASSERT_TRUE(report(first, {20 * kMiB, 2 * kMiB}).ok());
  ASSERT_TRUE(
      report(first, {20 * kMiB, 2 * kMiB, 512 * kMiB}).ok());
  // Not a multiple of the chunk, zero, too many: refused, the last kept.
  EXPECT_TRUE(absl::IsInvalidArgument(report(first, {kMiB})));
  EXPECT_TRUE(absl::IsInvalidArgument(report(first, {0})));
  EXPECT_TRUE(absl::IsInvalidArgument(report(
      first,
      std::vector<uint64_t>(kMaxWorkingSetSegments + 1, 2 * kMiB))));
  const v1::RegisterResponse unlabelled = hello("");
  ASSERT_TRUE(report(unlabelled, {2 * kMiB}).ok());
  // Nothing before the session ends.
  EXPECT_EQ(hello("trainer").working_set().segment_bytes_size(), 0);
  core.EndSession(first.session_id(), "test");
  core.EndSession(unlabelled.session_id(), "test");

  EXPECT_THAT(hello("trainer").working_set().segment_bytes(),
              ElementsAre(20 * kMiB, 2 * kMiB, 512 * kMiB));
  EXPECT_EQ(hello("evaluator").working_set().segment_bytes_size(), 0);
  EXPECT_EQ(hello("").working_set().segment_bytes_size(), 0);
}

}  // namespace
}  // namespace allocd
