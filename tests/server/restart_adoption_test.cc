#include "server/restart_adoption.h"

#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/device_pools.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

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

constexpr uint64_t kChunk = uint64_t{2} << 20;

// A chunk of `bytes` from `source`, declared as `id` and proven by its FD.
DeclaredChunk Proven(MemfdChunkSource& source, uint64_t id, uint64_t bytes) {
  absl::StatusOr<ChunkMemory> memory = source.CreateChunk(bytes);
  EXPECT_TRUE(memory.ok()) << memory.status();
  return {.id = id,
          .bytes = bytes,
          .fd = memory.ok() ? UniqueFd(dup(memory->file->get())) : UniqueFd()};
}

// A core restarted after a daemon that left `file`: the window stays open
// (an hour) until the processes in it declared.
DaemonCoreOptions Restarted(const SessionsFile& file,
                            std::vector<DeviceAtStart> devices_at_start) {
  return {.sessions_file = file.path(),
          .adopt_window = absl::Hours(1),
          .devices_at_start = std::move(devices_at_start)};
}

// This process, which the sessions file names, and one it does not.
PeerCredentials Survivor() { return {.pid = getpid(), .uid = 0}; }
PeerCredentials Newcomer() { return {.pid = getpid() + 1, .uid = 0}; }

absl::StatusOr<v1::RegisterResponse> RegisterOn(
    DaemonCore& core, const PeerCredentials& peer,
    const std::string& gpu_uuid = "") {
  v1::RegisterRequest request;
  request.set_protocol_version(1);
  request.set_gpu_uuid(gpu_uuid);
  return core.Register(peer, request);
}

// Without a daemon before, each device's capacity is fitted at once: a
// --capacity clipped to the free memory, a capacity taken from free memory
// left as it is; a late declaration grows each, the first up to the
// --capacity it clipped.
TEST(RestartAdoptionTest, WithNoSurvivorsCapacitiesAreFittedAtOnce) {
  MemfdChunkSource source0;
  MemfdChunkSource source1;
  NodePool pool0(&source0, 64 * kChunk);
  NodePool pool1(&source1, 64 * kChunk);
  DevicePools pools;
  ASSERT_TRUE(pools.AddBorrowed(SimDeviceUuid(0), "memfd", &pool0).ok());
  ASSERT_TRUE(pools.AddBorrowed(SimDeviceUuid(1), "memfd", &pool1).ok());
  SessionRegistry sessions;
  Metrics metrics;
  RestartAdoption adoption(
      {.window = absl::Hours(1),
       .devices_at_start = {{.free_memory = 5 * kChunk},
                            {.free_memory = 5 * kChunk,
                             .capacity_from_free = true}}},
      absl::Now(), &pools, &sessions, &metrics);
  EXPECT_FALSE(adoption.open());
  EXPECT_EQ(pool0.capacity(), 5 * kChunk);
  EXPECT_EQ(pool1.capacity(), 64 * kChunk);
  adoption.Adopted(pools.at(0), 2 * kChunk);
  EXPECT_EQ(pool0.capacity(), 7 * kChunk);
  adoption.Adopted(pools.at(0), 100 * kChunk);
  EXPECT_EQ(pool0.capacity(), 64 * kChunk);
  adoption.Adopted(pools.at(1), 3 * kChunk);
  EXPECT_EQ(pool1.capacity(), 67 * kChunk);
}

// The file lists the live sessions' pids, and a process of the daemon
// before as many times as it had sessions until it has re-declared; a
// shutdown leaves it as it was.
TEST(RestartAdoptionTest, TheSessionsFileListsTheLiveAndTheAwaited) {
  const pid_t self = getpid();
  const SessionsFile sessions_file(SessionsByPid{{self, 2}});
  const std::string& file = sessions_file.path();
  auto listed = [&] {
    return ReadSessionsFile(file, [](pid_t) { return true; });
  };
  MemfdChunkSource source;
  NodePool pool(&source, uint64_t{64} << 20);
  DevicePools pools;
  ASSERT_TRUE(pools.AddBorrowed(SimDeviceUuid(0), "memfd", &pool).ok());
  SessionRegistry sessions;
  Metrics metrics;
  RestartAdoption adoption({.sessions_file = file, .window = absl::Hours(1)},
                           absl::Now(), &pools, &sessions, &metrics);
  EXPECT_TRUE(adoption.open());
  sessions.Create({.pid = self});
  std::shared_ptr<Session> newcomer = sessions.Create({.pid = self + 1});
  adoption.SaveSessions();
  EXPECT_THAT(listed(),
              UnorderedElementsAre(Pair(self, 2), Pair(self + 1, 1)));
  adoption.FinishedDeclaring(self);
  EXPECT_TRUE(adoption.open());
  adoption.FinishedDeclaring(self);
  EXPECT_FALSE(adoption.open());
  EXPECT_THAT(listed(),
              UnorderedElementsAre(Pair(self, 1), Pair(self + 1, 1)));
  adoption.ShutDown();
  sessions.Remove(newcomer->id());
  adoption.SaveSessions();
  EXPECT_THAT(listed(),
              UnorderedElementsAre(Pair(self, 1), Pair(self + 1, 1)));
}

// A restarted core: the sessions file names a live process (this one, pid
// 4242 to the core) and a dead one. New memory waits for the live one to
// re-declare, then the chunks it declared are its own, and the file lists
// the sessions the core has now, for the daemon after it.
TEST(DaemonCoreRestartTest, NewMemoryWaitsUntilTheSurvivorsDeclared) {
  const pid_t self = getpid();
  const SessionsFile sessions_file({{self, 1}, {999999999, 1}});
  const std::string& file = sessions_file.path();
  MemfdChunkSource source;
  NodePool pool(&source, uint64_t{64} << 20);
  Metrics metrics;
  DaemonCore core(Restarted(sessions_file, {}), &pool, &metrics);
  EXPECT_TRUE(core.Status().adopting());

  absl::StatusOr<v1::RegisterResponse> back = RegisterOn(core, Survivor());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->adopts_chunks());
  EXPECT_TRUE(back->declare_fds());  // sim: the memfds prove the chunks
  absl::StatusOr<v1::RegisterResponse> fresh = RegisterOn(core, Newcomer());
  ASSERT_TRUE(fresh.ok());

  v1::AcquireChunksRequest ask;
  ask.set_session_id(fresh->session_id());
  ask.set_session_secret(fresh->session_secret());
  ask.set_bytes(2 << 20);
  absl::Notification served;
  absl::StatusOr<v1::AcquireChunksResponse> granted;
  std::thread acquire([&] {
    granted = core.AcquireChunks(Newcomer(), ask);
    served.Notify();
  });
  EXPECT_FALSE(served.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  // The lease's thread never waits: it is told to ask over gRPC.
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> now =
      core.AcquireChunksNow(Newcomer(), ask);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_FALSE(now->has_value());

  // The survivor's chunk from the daemon before, proven by its memfd.
  std::vector<DeclaredChunk> declared;
  declared.push_back(Proven(source, 77, 2 << 20));
  // Another process cannot declare on the survivor's session, even with
  // its secret.
  EXPECT_EQ(core.DeclareChunks(Newcomer(), back->session_id(),
                               back->session_secret(), {}, true)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<AdoptOutcome> adopted = core.DeclareChunks(
      Survivor(), back->session_id(), back->session_secret(),
      std::move(declared), /*last=*/true);
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
              ElementsAre(Pair(self, 1), Pair(self + 1, 1)));
  core.EndAll();
  // A shutdown leaves them listed: their processes live on.
  EXPECT_EQ(ReadSessionsFile(file, [](pid_t) { return true; }).size(), 2u);
}

// On a device, the capacity is clipped to what was free at start plus what
// the survivors hold (in use, so not free), and grows by what a late
// declaration holds.
TEST(DaemonCoreRestartTest, TheCapacityIsClippedToTheDeviceAfterAdoption) {
  {
    MemfdChunkSource source;
    NodePool pool(&source, 64 * kChunk);
    Metrics metrics;
    DaemonCore core({.devices_at_start = {{.free_memory = 5 * kChunk}}},
                    &pool, &metrics);
    EXPECT_EQ(core.Status().capacity_bytes(), 5 * kChunk);  // no window
  }
  const SessionsFile sessions_file(SessionsByPid{{getpid(), 1}});
  MemfdChunkSource source;
  NodePool pool(&source, 64 * kChunk);
  Metrics metrics;
  DaemonCore core(Restarted(sessions_file, {{.free_memory = 5 * kChunk}}),
                  &pool, &metrics);
  EXPECT_EQ(core.Status().capacity_bytes(), 64 * kChunk);  // not yet
  absl::StatusOr<v1::RegisterResponse> a = RegisterOn(core, Survivor());
  absl::StatusOr<v1::RegisterResponse> b = RegisterOn(core, Newcomer());
  ASSERT_TRUE(a.ok() && b.ok());
  auto chunks = [&](std::vector<uint64_t> ids) {
    std::vector<DeclaredChunk> declared;
    for (uint64_t id : ids) declared.push_back(Proven(source, id, kChunk));
    return declared;
  };
  ASSERT_TRUE(
      core.DeclareChunks(Survivor(), a->session_id(), a->session_secret(),
                         chunks({1, 2}), true)
          .ok());
  EXPECT_EQ(core.Status().capacity_bytes(), 7 * kChunk);
  ASSERT_TRUE(
      core.DeclareChunks(Newcomer(), b->session_id(), b->session_secret(),
                         chunks({3}), true)
          .ok());
  EXPECT_EQ(core.Status().capacity_bytes(), 8 * kChunk);
  EXPECT_EQ(core.Status().in_use_bytes(), 3 * kChunk);
}

// A capacity the daemon derived from the device's free memory (no
// --capacity) grows by what the survivors hold: it was in use at start, so
// not in the free memory the capacity was taken from.
TEST(DaemonCoreRestartTest, ACapacityTakenFromFreeMemoryGrowsByTheAdopted) {
  const SessionsFile sessions_file(SessionsByPid{{getpid(), 1}});
  MemfdChunkSource source;
  // 5 chunks free at start, 1 of headroom.
  NodePool pool(&source, {.capacity = 4 * kChunk,
                          .chunk_classes = DefaultChunkClasses(kChunk)});
  Metrics metrics;
  DaemonCore core(
      Restarted(sessions_file,
                {{.free_memory = 5 * kChunk, .capacity_from_free = true}}),
      &pool, &metrics);
  absl::StatusOr<v1::RegisterResponse> a = RegisterOn(core, Survivor());
  absl::StatusOr<v1::RegisterResponse> b = RegisterOn(core, Newcomer());
  ASSERT_TRUE(a.ok() && b.ok());
  auto declare = [&](const PeerCredentials& peer,
                     const v1::RegisterResponse& session, uint64_t id,
                     uint64_t bytes) {
    std::vector<DeclaredChunk> declared;
    declared.push_back(Proven(source, id, bytes));
    absl::StatusOr<AdoptOutcome> outcome =
        core.DeclareChunks(peer, session.session_id(),
                           session.session_secret(), std::move(declared), true);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->adopted.size(), 1u);
  };
  declare(Survivor(), *a, 1, 8 * kChunk);  // a 16 MiB class
  EXPECT_EQ(core.Status().capacity_bytes(), 12 * kChunk);
  declare(Newcomer(), *b, 2, kChunk);
  EXPECT_EQ(core.Status().capacity_bytes(), 13 * kChunk);
  EXPECT_EQ(core.Status().in_use_bytes(), 9 * kChunk);
}

// With a pool per GPU, a session's declaration goes to its own device's
// pool, and each device's capacity is fitted to its own free memory.
TEST(DaemonCoreRestartTest, ChunksAreAdoptedIntoTheSessionsDevicePool) {
  const SessionsFile sessions_file(SessionsByPid{{getpid(), 1}});
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
  DaemonCore core(Restarted(sessions_file, {{.free_memory = 10 * kChunk},
                                            {.free_memory = 20 * kChunk}}),
                  &pools, &metrics);
  absl::StatusOr<v1::RegisterResponse> session =
      RegisterOn(core, Survivor(), SimDeviceUuid(1));
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->node_device(), 1);
  std::vector<DeclaredChunk> declared;
  declared.push_back(Proven(source1, 5, 64 * kChunk));
  // Not a size the pools' chunks come in.
  declared.push_back({.id = 6, .bytes = 3 * kChunk});
  absl::StatusOr<AdoptOutcome> outcome =
      core.DeclareChunks(Survivor(), session->session_id(),
                         session->session_secret(), std::move(declared), true);
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
  EXPECT_THAT(
      metrics.Render(),
      HasSubstr("allocd_pool_adopted_bytes_total{device=\"1\",gpu_uuid=\"" +
                SimDeviceUuid(1) + "\"} 134217728"));
}

}  // namespace
}  // namespace allocd
