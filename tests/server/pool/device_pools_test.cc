// DevicePools, and DaemonCore serving several devices from it: a session's
// chunks come from its own device's pool only.
#include "server/pool/device_pools.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// `count` sim devices of `capacity` bytes each, SIM-GPU-0...
void AddSimDevices(DevicePools& pools, int count, uint64_t capacity) {
  for (int i = 0; i < count; ++i) {
    ASSERT_TRUE(pools
                    .Add(SimDeviceUuid(i), "memfd",
                         std::make_unique<MemfdChunkSource>(),
                         {.capacity = capacity})
                    .ok());
  }
}

TEST(DevicePoolsTest, DevicesAreNumberedInOrderAndFoundByUuid) {
  DevicePools pools;
  AddSimDevices(pools, 3, 64 * kMiB);
  ASSERT_EQ(pools.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(pools.at(i).index, i);
    EXPECT_EQ(pools.at(i).uuid, "SIM-GPU-" + std::to_string(i));
  }
  absl::StatusOr<const DevicePool*> second = pools.ForClient("SIM-GPU-1");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->index, 1);
  // nvidia-smi prints lowercase hex; a client may not.
  ASSERT_TRUE(pools.ForClient("sim-gpu-2").ok());
  EXPECT_EQ((*pools.ForClient("sim-gpu-2"))->index, 2);
}

TEST(DevicePoolsTest, AClientWithoutAUuidGetsTheFirstDevice) {
  DevicePools pools;
  AddSimDevices(pools, 2, 64 * kMiB);
  absl::StatusOr<const DevicePool*> device = pools.ForClient("");
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*device)->index, 0);
}

TEST(DevicePoolsTest, AnUnknownUuidIsRefusedNamingTheDevicesServed) {
  DevicePools pools;
  AddSimDevices(pools, 2, 64 * kMiB);
  absl::StatusOr<const DevicePool*> device = pools.ForClient("GPU-1234");
  ASSERT_TRUE(absl::IsNotFound(device.status())) << device.status();
  EXPECT_THAT(device.status().message(), HasSubstr("GPU-1234"));
  EXPECT_THAT(device.status().message(),
              HasSubstr("SIM-GPU-0 (device 0), SIM-GPU-1 (device 1)"));
}

TEST(DevicePoolsTest, AUuidCanBeAddedOnlyOnce) {
  DevicePools pools;
  AddSimDevices(pools, 1, 64 * kMiB);
  EXPECT_TRUE(absl::IsAlreadyExists(
      pools.Add("sim-gpu-0", "memfd", std::make_unique<MemfdChunkSource>(),
                {.capacity = kMiB})));
  EXPECT_TRUE(absl::IsInvalidArgument(
      pools.Add("", "memfd", std::make_unique<MemfdChunkSource>(),
                {.capacity = kMiB})));
  EXPECT_EQ(pools.size(), 1u);
}

TEST(DevicePoolsTest, AdminsNameADeviceByIndexOrUuid) {
  DevicePools pools;
  AddSimDevices(pools, 2, 64 * kMiB);
  ASSERT_TRUE(pools.ForAdmin("1").ok());
  EXPECT_EQ((*pools.ForAdmin("1"))->uuid, "SIM-GPU-1");
  EXPECT_EQ((*pools.ForAdmin("SIM-GPU-0"))->index, 0);
  EXPECT_TRUE(absl::IsNotFound(pools.ForAdmin("2").status()));
  EXPECT_TRUE(absl::IsNotFound(pools.ForAdmin("-1").status()));
  EXPECT_THAT(pools.ForAdmin("GPU-x").status().message(),
              HasSubstr("give a UUID or an index"));
}

TEST(DevicePoolsTest, MinCapacityIsTheSmallestDevices) {
  DevicePools pools;
  EXPECT_EQ(pools.min_capacity(), 0u);
  ASSERT_TRUE(pools
                  .Add("GPU-a", "big", std::make_unique<MemfdChunkSource>(),
                       {.capacity = 80 * kMiB})
                  .ok());
  ASSERT_TRUE(pools
                  .Add("GPU-b", "small", std::make_unique<MemfdChunkSource>(),
                       {.capacity = 40 * kMiB})
                  .ok());
  EXPECT_EQ(pools.min_capacity(), 40 * kMiB);
}

// DaemonCore over 3 sim devices of 64 MiB each.
class DaemonCoreDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AddSimDevices(pools_, 3, 64 * kMiB);
    core_ = std::make_unique<DaemonCore>(DaemonCoreOptions{}, &pools_,
                                         &metrics_);
  }

  absl::StatusOr<v1::RegisterResponse> Register(const std::string& uuid,
                                                pid_t pid = kPid) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job("ddp");
    r.set_gpu_uuid(uuid);
    return core_->Register({.pid = pid, .uid = 1000, .gid = 1000}, r);
  }

  absl::StatusOr<v1::AcquireChunksResponse> Acquire(
      const v1::RegisterResponse& session, uint64_t bytes, pid_t pid = kPid) {
    v1::AcquireChunksRequest r;
    r.set_session_id(session.session_id());
    r.set_session_secret(session.session_secret());
    r.set_bytes(bytes);
    return core_->AcquireChunks({.pid = pid, .uid = 1000, .gid = 1000}, r);
  }

  uint64_t InUse(int device) {
    return pools_.at(device).pool->Stats().in_use_bytes;
  }

  static constexpr pid_t kPid = 4242;
  DevicePools pools_;
  Metrics metrics_;
  std::unique_ptr<DaemonCore> core_;
};

TEST_F(DaemonCoreDevicesTest, ASessionsChunksComeFromItsOwnDevicesPool) {
  absl::StatusOr<v1::RegisterResponse> on1 = Register("SIM-GPU-1");
  ASSERT_TRUE(on1.ok()) << on1.status();
  EXPECT_EQ(on1->gpu_uuid(), "SIM-GPU-1");
  EXPECT_EQ(on1->node_device(), 1);
  EXPECT_EQ(on1->capacity_bytes(), 64 * kMiB);
  ASSERT_TRUE(Acquire(*on1, 10 * kMiB).ok());
  EXPECT_EQ(InUse(0), 0u);
  EXPECT_EQ(InUse(1), 10 * kMiB);
  EXPECT_EQ(InUse(2), 0u);
  core_->EndSession(on1->session_id(), "test");
  EXPECT_EQ(InUse(1), 0u);
  EXPECT_EQ(pools_.at(1).pool->Stats().free_bytes, 10 * kMiB);
}

TEST_F(DaemonCoreDevicesTest, OneProcessHasASessionPerDevice) {
  absl::StatusOr<v1::RegisterResponse> on0 = Register("SIM-GPU-0");
  absl::StatusOr<v1::RegisterResponse> on2 = Register("SIM-GPU-2");
  ASSERT_TRUE(on0.ok() && on2.ok());
  EXPECT_NE(on0->session_id(), on2->session_id());
  ASSERT_TRUE(Acquire(*on0, 4 * kMiB).ok());
  ASSERT_TRUE(Acquire(*on2, 6 * kMiB).ok());
  EXPECT_EQ(InUse(0), 4 * kMiB);
  EXPECT_EQ(InUse(2), 6 * kMiB);
  const v1::ListSessionsResponse sessions = core_->ListSessions();
  ASSERT_EQ(sessions.sessions_size(), 2);
  for (const v1::SessionInfo& s : sessions.sessions()) {
    const bool first = s.session_id() == on0->session_id();
    EXPECT_EQ(s.gpu_uuid(), first ? "SIM-GPU-0" : "SIM-GPU-2");
    EXPECT_EQ(s.node_device(), first ? 0 : 2);
    EXPECT_EQ(s.held_bytes(), first ? 4 * kMiB : 6 * kMiB);
  }
}

TEST_F(DaemonCoreDevicesTest, AFullDeviceDoesNotBorrowFromAnother) {
  absl::StatusOr<v1::RegisterResponse> on0 = Register("SIM-GPU-0");
  ASSERT_TRUE(on0.ok());
  ASSERT_TRUE(Acquire(*on0, 64 * kMiB).ok());
  absl::StatusOr<v1::AcquireChunksResponse> more =
      Acquire(*on0, 2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(InUse(1) + InUse(2), 0u);
  // Device 1 still has all of its memory.
  absl::StatusOr<v1::RegisterResponse> on1 = Register("SIM-GPU-1", 4343);
  ASSERT_TRUE(on1.ok());
  EXPECT_TRUE(Acquire(*on1, 64 * kMiB, 4343).ok());
}

TEST_F(DaemonCoreDevicesTest, UnknownGpuIsRefusedAndNoUuidMeansTheFirst) {
  absl::StatusOr<v1::RegisterResponse> unknown = Register("GPU-not-here");
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  EXPECT_EQ(core_->session_count(), 0u);
  absl::StatusOr<v1::RegisterResponse> old_client = Register("");
  ASSERT_TRUE(old_client.ok());
  EXPECT_EQ(old_client->gpu_uuid(), "SIM-GPU-0");
  EXPECT_EQ(old_client->node_device(), 0);
}

TEST_F(DaemonCoreDevicesTest, AClaimTokenOfAnyDeviceIsClaimed) {
  absl::StatusOr<v1::RegisterResponse> on2 = Register("SIM-GPU-2");
  ASSERT_TRUE(on2.ok());
  absl::StatusOr<v1::AcquireChunksResponse> grant =
      Acquire(*on2, 4 * kMiB);
  ASSERT_TRUE(grant.ok());
  size_t fds = 0;
  absl::Status claimed = core_->Claim(
      {.pid = kPid, .uid = 1000, .gid = 1000}, grant->claim_token(), 64,
      [&](std::vector<ChunkFd>& batch, bool) {
        fds += batch.size();
        return absl::OkStatus();
      });
  ASSERT_TRUE(claimed.ok()) << claimed;
  EXPECT_EQ(fds, 2u);
  EXPECT_TRUE(absl::IsNotFound(core_->Claim(
      {.pid = kPid, .uid = 1000, .gid = 1000}, grant->claim_token(), 64,
      [](std::vector<ChunkFd>&, bool) { return absl::OkStatus(); })));
}

TEST_F(DaemonCoreDevicesTest, StatusHasARowPerDeviceAndTheirSums) {
  absl::StatusOr<v1::RegisterResponse> on1 = Register("SIM-GPU-1");
  ASSERT_TRUE(on1.ok());
  ASSERT_TRUE(Acquire(*on1, 8 * kMiB).ok());
  const v1::StatusResponse status = core_->Status();
  ASSERT_EQ(status.devices_size(), 3);
  EXPECT_EQ(status.capacity_bytes(), 3 * 64 * kMiB);
  EXPECT_EQ(status.in_use_bytes(), 8 * kMiB);
  EXPECT_EQ(status.devices(1).gpu_uuid(), "SIM-GPU-1");
  EXPECT_EQ(status.devices(1).in_use_bytes(), 8 * kMiB);
  EXPECT_EQ(status.devices(1).sessions(), 1u);
  EXPECT_EQ(status.devices(0).in_use_bytes(), 0u);
  EXPECT_EQ(status.devices(2).capacity_bytes(), 64 * kMiB);
}

TEST_F(DaemonCoreDevicesTest, TrimOfOneDeviceLeavesTheOthersCaches) {
  for (int device = 0; device < 2; ++device) {
    absl::StatusOr<v1::RegisterResponse> s =
        Register(SimDeviceUuid(device), 5000 + device);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(Acquire(*s, 6 * kMiB, 5000 + device).ok());
    core_->EndSession(s->session_id(), "test");
  }
  absl::StatusOr<v1::TrimPoolResponse> trimmed = core_->TrimPool("1");
  ASSERT_TRUE(trimmed.ok());
  EXPECT_EQ(trimmed->trimmed_bytes(), 6 * kMiB);
  EXPECT_EQ(pools_.at(0).pool->Stats().free_bytes, 6 * kMiB);
  EXPECT_EQ(pools_.at(1).pool->Stats().free_bytes, 0u);
  EXPECT_TRUE(absl::IsNotFound(core_->TrimPool("GPU-x").status()));
  ASSERT_TRUE(core_->TrimPool("").ok());
  EXPECT_EQ(pools_.at(0).pool->Stats().free_bytes, 0u);
}

TEST_F(DaemonCoreDevicesTest, AUidQuotaHoldsOnEachDevice) {
  core_->SetUidQuota(1000, 8 * kMiB);
  absl::StatusOr<v1::RegisterResponse> on0 = Register("SIM-GPU-0");
  absl::StatusOr<v1::RegisterResponse> on1 = Register("SIM-GPU-1");
  ASSERT_TRUE(on0.ok() && on1.ok());
  EXPECT_TRUE(Acquire(*on0, 8 * kMiB).ok());
  EXPECT_TRUE(Acquire(*on1, 8 * kMiB).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(
      Acquire(*on1, 2 * kMiB).status()));
}

TEST_F(DaemonCoreDevicesTest, PoolAndSessionMetricsCarryTheDevice) {
  absl::StatusOr<v1::RegisterResponse> on2 = Register("SIM-GPU-2");
  ASSERT_TRUE(on2.ok());
  ASSERT_TRUE(Acquire(*on2, 4 * kMiB).ok());
  const std::string text = metrics_.Render();
  EXPECT_THAT(text, HasSubstr("allocd_pool_bytes{device=\"2\",gpu_uuid="
                              "\"SIM-GPU-2\",state=\"in_use\"} 4194304"));
  EXPECT_THAT(text, HasSubstr("allocd_pool_bytes{device=\"0\",gpu_uuid="
                              "\"SIM-GPU-0\",state=\"capacity\"} 67108864"));
  EXPECT_THAT(text, HasSubstr("allocd_pool_trimmed_bytes_total{device=\"1\","
                              "gpu_uuid=\"SIM-GPU-1\"} 0"));
  EXPECT_THAT(text, HasSubstr("allocd_session_held_bytes{device=\"2\","
                              "gpu_uuid=\"SIM-GPU-2\",job=\"ddp\""));
}

}  // namespace
}  // namespace allocd
