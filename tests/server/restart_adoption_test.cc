#include "server/restart_adoption.h"

#include <unistd.h>

#include <filesystem>
#include <map>
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

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// The sessions file a daemon before this one left, listing `contents`;
// removed when the test ends.
class SessionsFileOnDisk {
 public:
  explicit SessionsFileOnDisk(const SessionsFile& contents) {
    close(mkstemp(path_.data()));
    EXPECT_TRUE(WriteSessionsFile(path_, contents).ok());
  }
  ~SessionsFileOnDisk() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_ = "/tmp/allocd_core_sessions_XXXXXX";
};

// What the file at `path` lists (every process taken as alive).
SessionsFile Listed(const std::string& path) {
  absl::StatusOr<SessionsFile> read =
      ReadSessionsFile(path, [](pid_t) { return true; });
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? *read : SessionsFile();
}

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
DaemonCoreOptions Restarted(const SessionsFileOnDisk& file,
                            std::vector<DeviceAtStart> devices_at_start) {
  return {.sessions_file = file.path(),
          .adopt_window = absl::Hours(1),
          .devices_at_start = std::move(devices_at_start)};
}

// This process, which the sessions file names, and one it does not, of
// the same tenant.
PeerCredentials Survivor() { return {.pid = getpid(), .uid = 0}; }
PeerCredentials Newcomer() { return {.pid = getpid() + 1, .uid = 0}; }
constexpr char kTenant[] = "uid:0";

// A file of the daemon before: this process had one session, and its
// tenant held `chunks` of device 0 (id, bytes).
SessionsFile Before(std::vector<std::pair<uint64_t, uint64_t>> chunks,
                    const std::string& device = SimDeviceUuid(0)) {
  SessionsFile file{.sessions = {{getpid(), 1}}};
  for (const auto& [id, bytes] : chunks) {
    file.chunks[kTenant].push_back(
        {.device = device, .id = id, .bytes = bytes});
  }
  return file;
}

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
// left as it is.
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
}

// The file lists the live sessions' pids, and a process of the daemon
// before as many times as it had sessions until it has re-declared; a
// shutdown leaves it as it was.
TEST(RestartAdoptionTest, TheSessionsFileListsTheLiveAndTheAwaited) {
  const pid_t self = getpid();
  const SessionsFileOnDisk sessions_file({.sessions = {{self, 2}}});
  const std::string& file = sessions_file.path();
  auto listed = [&] { return Listed(file).sessions; };
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
  SessionsFile before = Before({{77, 2 << 20}});
  before.sessions[999999999] = 1;
  const SessionsFileOnDisk sessions_file(before);
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
  // The grant was listed before it was answered (appended)...
  EXPECT_THAT(Listed(file).chunks.at(kTenant),
              Contains(HandedChunk{SimDeviceUuid(0), granted->chunk_ids(0),
                                   2 << 20}));
  // ... and the file is rewritten whole at the next tick.
  core.ExpireUnleased(absl::Now() + absl::Seconds(1));
  const v1::StatusResponse status = core.Status();
  EXPECT_FALSE(status.adopting());
  EXPECT_EQ(status.in_use_bytes(), uint64_t{4} << 20);
  EXPECT_EQ(status.adopted_bytes_total(), uint64_t{2} << 20);
  // The file: this process's two sessions and what they hold; the dead
  // one is forgotten.
  EXPECT_THAT(Listed(file).sessions,
              ElementsAre(Pair(self, 1), Pair(self + 1, 1)));
  EXPECT_THAT(Listed(file).chunks.at(kTenant),
              UnorderedElementsAre(
                  HandedChunk{SimDeviceUuid(0), 77, 2 << 20},
                  HandedChunk{SimDeviceUuid(0), granted->chunk_ids(0),
                              2 << 20}));
  core.EndAll();
  // A shutdown leaves them listed: their processes live on.
  EXPECT_EQ(Listed(file).sessions.size(), 2u);
  EXPECT_EQ(Listed(file).chunks.at(kTenant).size(), 2u);
}

// On a device, the capacity is clipped to what was free at start plus what
// the survivors hold (in use, so not free); a declaration after the window
// adopts nothing.
TEST(DaemonCoreRestartTest, TheCapacityIsClippedToTheDeviceAfterAdoption) {
  {
    MemfdChunkSource source;
    NodePool pool(&source, 64 * kChunk);
    Metrics metrics;
    DaemonCore core({.devices_at_start = {{.free_memory = 5 * kChunk}}},
                    &pool, &metrics);
    EXPECT_EQ(core.Status().capacity_bytes(), 5 * kChunk);  // no window
  }
  const SessionsFileOnDisk sessions_file(
      Before({{1, kChunk}, {2, kChunk}, {3, kChunk}}));
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
  absl::StatusOr<AdoptOutcome> late =
      core.DeclareChunks(Newcomer(), b->session_id(), b->session_secret(),
                         chunks({3}), true);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->adopted.empty());
  ASSERT_EQ(late->refused.size(), 1u);
  EXPECT_THAT(late->refused[0].second, HasSubstr("outside the adoption window"));
  EXPECT_EQ(core.Status().capacity_bytes(), 7 * kChunk);
  EXPECT_EQ(core.Status().in_use_bytes(), 2 * kChunk);
}

// A capacity the daemon derived from the device's free memory (no
// --capacity) grows by what the survivors hold: it was in use at start, so
// not in the free memory the capacity was taken from. For the window it
// has room for what the file lists.
TEST(DaemonCoreRestartTest, ACapacityTakenFromFreeMemoryGrowsByTheAdopted) {
  const SessionsFileOnDisk sessions_file(
      Before({{1, 8 * kChunk}, {2, kChunk}, {3, kChunk}}));
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
  ASSERT_TRUE(a.ok());
  auto declare = [&](uint64_t id, uint64_t bytes, bool last) {
    std::vector<DeclaredChunk> declared;
    declared.push_back(Proven(source, id, bytes));
    absl::StatusOr<AdoptOutcome> outcome = core.DeclareChunks(
        Survivor(), a->session_id(), a->session_secret(), std::move(declared),
        last);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->adopted.size(), 1u);
  };
  declare(1, 8 * kChunk, false);  // a 16 MiB class
  EXPECT_EQ(core.Status().capacity_bytes(), 14 * kChunk);  // 4 + the file's
  declare(2, kChunk, true);
  EXPECT_EQ(core.Status().capacity_bytes(), 13 * kChunk);  // 4 + adopted
  EXPECT_EQ(core.Status().in_use_bytes(), 9 * kChunk);
}

// With a pool per GPU, a session's declaration goes to its own device's
// pool, and each device's capacity is fitted to its own free memory.
TEST(DaemonCoreRestartTest, ChunksAreAdoptedIntoTheSessionsDevicePool) {
  const SessionsFileOnDisk sessions_file(
      Before({{5, 64 * kChunk}, {6, 3 * kChunk}}, SimDeviceUuid(1)));
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

// --- Forged declarations (issue 41): a client makes memfds itself, sealed
// and sized as the daemon's, and declares them on its lease.

// The FDs this process has open.
int OpenFds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// `count` memfd chunks of `bytes` made as the daemon makes them, by
// whoever declares them, as ids first, first + 1, ...
std::vector<DeclaredChunk> Forged(MemfdChunkSource& forger, uint64_t first,
                                  int count, uint64_t bytes = kChunk) {
  std::vector<DeclaredChunk> chunks;
  for (int i = 0; i < count; ++i) {
    chunks.push_back(Proven(forger, first + static_cast<uint64_t>(i), bytes));
  }
  return chunks;
}

// A core of one 2 GiB pool of 2 MiB chunks restarted after `file`'s daemon
// (or started afresh), with this process's session registered.
class ForgedAdoptionTest : public ::testing::Test {
 protected:
  void Start(const SessionsFileOnDisk* file,
             std::optional<uint64_t> tenant_quota = std::nullopt) {
    pool_.emplace(&source_,
                  NodePool::Options{.capacity = uint64_t{2} << 30,
                                    .chunk_classes = DefaultChunkClasses(kChunk)});
    if (tenant_quota.has_value()) pool_->SetDefaultTenantQuota(*tenant_quota);
    DaemonCoreOptions options;
    if (file != nullptr) options = Restarted(*file, {});
    core_.emplace(std::move(options), &*pool_, &metrics_);
    absl::StatusOr<v1::RegisterResponse> session =
        RegisterOn(*core_, Survivor());
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *session;
  }
  absl::StatusOr<AdoptOutcome> Declare(std::vector<DeclaredChunk> chunks,
                                       bool last = false) {
    return core_->DeclareChunks(Survivor(), session_.session_id(),
                                session_.session_secret(), std::move(chunks),
                                last);
  }

  MemfdChunkSource source_;
  MemfdChunkSource forger_;
  Metrics metrics_;
  std::optional<NodePool> pool_;
  std::optional<DaemonCore> core_;
  v1::RegisterResponse session_;
};

// No restart, no window: 8 forged 1 GiB chunks and 2,000 forged 2 MiB ones
// adopt nothing, and every FD is closed before the call returns.
TEST_F(ForgedAdoptionTest, OutsideTheWindowNothingIsAdoptedAndNoFdKept) {
  Start(nullptr);
  EXPECT_FALSE(core_->Status().adopting());
  std::vector<DeclaredChunk> big = Forged(forger_, 1, 8, uint64_t{1} << 30);
  const int fds_before = OpenFds() - 8;
  absl::StatusOr<AdoptOutcome> outcome = Declare(std::move(big));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->adopted.empty());
  ASSERT_EQ(outcome->refused.size(), 8u);
  EXPECT_THAT(outcome->refused[0].second,
              HasSubstr("outside the adoption window"));
  EXPECT_EQ(OpenFds(), fds_before);
  for (int frame = 0; frame < 8; ++frame) {  // side-socket frames of 250
    ASSERT_TRUE(Declare(Forged(forger_, 100 + 250 * frame, 250)).ok());
  }
  EXPECT_EQ(OpenFds(), fds_before);
  const v1::StatusResponse status = core_->Status();
  EXPECT_EQ(status.in_use_bytes(), 0u);
  EXPECT_EQ(status.adopted_bytes_total(), 0u);
}

// Inside the window only what the file lists for the tenant is adopted,
// each chunk once: unknown ids, another tenant's chunks, another device's,
// a size other than the one handed out are refused, their FDs closed.
TEST_F(ForgedAdoptionTest, InsideTheWindowOnlyTheTenantsListedChunks) {
  SessionsFile before = Before({{10, kChunk}, {11, kChunk}});
  before.chunks["uid:1001"].push_back(
      {.device = SimDeviceUuid(0), .id = 20, .bytes = kChunk});
  before.chunks[kTenant].push_back(
      {.device = SimDeviceUuid(1), .id = 30, .bytes = kChunk});
  const SessionsFileOnDisk file(before);
  Start(&file);
  EXPECT_TRUE(core_->Status().adopting());
  std::vector<DeclaredChunk> chunks = Forged(forger_, 10, 1);
  chunks.push_back(Proven(forger_, 11, 8 * kChunk));  // listed as 2 MiB
  chunks.push_back(Proven(forger_, 12, kChunk));      // never handed out
  chunks.push_back(Proven(forger_, 20, kChunk));      // uid 1001's
  chunks.push_back(Proven(forger_, 30, kChunk));      // another device's
  const int fds_before = OpenFds() - 5;
  absl::StatusOr<AdoptOutcome> outcome = Declare(std::move(chunks));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->adopted, std::vector<uint64_t>{10});
  std::map<uint64_t, std::string> refused(outcome->refused.begin(),
                                          outcome->refused.end());
  EXPECT_THAT(refused[11], HasSubstr("handed it out as 2.00 MiB"));
  EXPECT_THAT(refused[12], HasSubstr("did not hand it to tenant uid:0"));
  EXPECT_THAT(refused[20], HasSubstr("did not hand it to tenant uid:0"));
  EXPECT_THAT(refused[30], HasSubstr("did not hand it to tenant uid:0"));
  EXPECT_EQ(OpenFds(), fds_before + 1);  // the adopted chunk's, in the pool
  // Once adopted, never again (and a chunk listed once is adopted once).
  absl::StatusOr<AdoptOutcome> again = Declare(Forged(forger_, 10, 1), true);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->adopted.empty());
  EXPECT_EQ(core_->Status().in_use_bytes(), kChunk);
  // The window closed with the survivor's last frame: chunk 11, listed and
  // never adopted, is refused now.
  EXPECT_FALSE(core_->Status().adopting());
  absl::StatusOr<AdoptOutcome> late = Declare(Forged(forger_, 11, 1), true);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->adopted.empty());
  EXPECT_EQ(OpenFds(), fds_before + 1);
}

// Listed chunks beyond the capacity are refused, with why: what was
// adopted never passes it, and no FD of a refused one stays open.
TEST_F(ForgedAdoptionTest, AdoptionNeverPassesTheCapacity) {
  std::vector<std::pair<uint64_t, uint64_t>> listed;
  for (uint64_t id = 1; id <= 8; ++id) listed.push_back({id, uint64_t{1} << 30});
  const SessionsFileOnDisk file(Before(listed));
  Start(&file);
  const int fds_before = OpenFds();
  absl::StatusOr<AdoptOutcome> outcome =
      Declare(Forged(forger_, 1, 8, uint64_t{1} << 30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->adopted.size(), 2u);
  ASSERT_EQ(outcome->refused.size(), 6u);
  EXPECT_THAT(outcome->refused[0].second, HasSubstr("capacity"));
  EXPECT_EQ(OpenFds(), fds_before + 2);
  const v1::StatusResponse status = core_->Status();
  EXPECT_EQ(status.in_use_bytes(), uint64_t{2} << 30);
  EXPECT_LE(status.in_use_bytes(), status.capacity_bytes());
}

// ... and beyond the tenant's quota (--default-tenant-quota 512MiB).
TEST_F(ForgedAdoptionTest, AdoptionNeverPassesTheTenantQuota) {
  constexpr uint64_t k128MiB = 64 * kChunk;
  std::vector<std::pair<uint64_t, uint64_t>> listed;
  for (uint64_t id = 1; id <= 8; ++id) listed.push_back({id, k128MiB});
  const SessionsFileOnDisk file(Before(listed));
  Start(&file, uint64_t{512} << 20);
  absl::StatusOr<AdoptOutcome> outcome =
      Declare(Forged(forger_, 1, 8, k128MiB));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->adopted.size(), 4u);
  ASSERT_EQ(outcome->refused.size(), 4u);
  EXPECT_THAT(outcome->refused[0].second,
              HasSubstr("tenant uid:0 quota exceeded"));
  EXPECT_EQ(core_->Status().in_use_bytes(), uint64_t{512} << 20);
}

// A source that takes declarations on the client's word (CUDA: no FD comes
// back), as far as the file goes: a listed chunk of its size on its device
// is adopted, anything else refused.
class WordSource final : public ChunkSource {
 public:
  absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) override {
    return memfd_.CreateChunk(bytes);
  }
  size_t Granularity() const override { return kChunk; }
  std::string Name() const override { return "cuda"; }

 private:
  MemfdChunkSource memfd_;
};

TEST(DaemonCoreRestartTest, ChunksTakenOnTheClientsWordAreCheckedAgainstTheFile) {
  const SessionsFileOnDisk file(Before({{5, kChunk}, {6, kChunk}}));
  WordSource source;
  NodePool pool(&source, 64 * kChunk);
  Metrics metrics;
  DaemonCore core(Restarted(file, {}), &pool, &metrics);
  absl::StatusOr<v1::RegisterResponse> a = RegisterOn(core, Survivor());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->declare_fds());
  std::vector<DeclaredChunk> declared(3);
  declared[0] = {.id = 5, .bytes = kChunk};
  declared[1] = {.id = 6, .bytes = 8 * kChunk};  // listed as 2 MiB
  declared[2] = {.id = 7, .bytes = kChunk};      // never handed out
  absl::StatusOr<AdoptOutcome> outcome =
      core.DeclareChunks(Survivor(), a->session_id(), a->session_secret(),
                         std::move(declared), true);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->adopted, std::vector<uint64_t>{5});
  EXPECT_EQ(outcome->refused.size(), 2u);
  EXPECT_EQ(core.Status().in_use_bytes(), kChunk);
}

}  // namespace
}  // namespace allocd
