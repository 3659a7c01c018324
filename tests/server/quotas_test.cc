#include "server/quotas.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/device_pools.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kUid = 1000;

class QuotasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pools_.AddBorrowed(SimDeviceUuid(0), "memfd", &pool0_).ok());
    ASSERT_TRUE(pools_.AddBorrowed(SimDeviceUuid(1), "memfd", &pool1_).ok());
  }

  // A session of kUid on node device `device`, in its pool.
  SessionId Start(int device) {
    std::shared_ptr<Session> s =
        sessions_.Create({.pid = 4242, .uid = kUid, .node_device = device});
    EXPECT_TRUE(pools_.at(device).pool->AddSession(s->id(), kUid, 4242, "node").ok());
    return s->id();
  }

  MemfdChunkSource source0_;
  MemfdChunkSource source1_;
  NodePool pool0_{&source0_, uint64_t{1} << 30};
  NodePool pool1_{&source1_, uint64_t{1} << 30};
  DevicePools pools_;
  SessionRegistry sessions_;
  // Tenancy node: the sessions above are tenant "node"'s.
  Quotas quotas_{&pools_, &sessions_, Tenancy::kNode};
};

TEST_F(QuotasTest, ASessionsQuotaIsSetOnItsDevicesPool) {
  const SessionId id = Start(1);
  v1::SetQuotaRequest r;
  r.set_session_id(id);
  r.set_bytes(4 * kMiB);
  ASSERT_TRUE(quotas_.Set(r).ok());
  EXPECT_EQ(pool1_.Stats().sessions.at(id).quota, 4 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(pool1_.Acquire(id, 6 * kMiB).status()));
  r.clear_bytes();
  ASSERT_TRUE(quotas_.Set(r).ok());
  EXPECT_FALSE(pool1_.Stats().sessions.at(id).quota.has_value());

  r.set_session_id(id + 1);
  EXPECT_TRUE(absl::IsNotFound(quotas_.Set(r)));
  EXPECT_TRUE(absl::IsInvalidArgument(quotas_.Set(v1::SetQuotaRequest())));
}

TEST_F(QuotasTest, AUidsQuotaHoldsOnEveryDevice) {
  const SessionId on0 = Start(0);
  const SessionId on1 = Start(1);
  v1::SetQuotaRequest r;
  r.set_uid(kUid);
  r.set_bytes(4 * kMiB);
  ASSERT_TRUE(quotas_.Set(r).ok());
  EXPECT_TRUE(
      absl::IsResourceExhausted(pool0_.Acquire(on0, 6 * kMiB).status()));
  EXPECT_TRUE(
      absl::IsResourceExhausted(pool1_.Acquire(on1, 6 * kMiB).status()));
  quotas_.SetUid(kUid, std::nullopt);
  EXPECT_TRUE(pool0_.Acquire(on0, 6 * kMiB).ok());
  EXPECT_TRUE(pool1_.Acquire(on1, 6 * kMiB).ok());
}

TEST_F(QuotasTest, ATenantsQuotaHoldsOnEveryDevice) {
  const SessionId on0 = Start(0);
  const SessionId on1 = Start(1);
  v1::SetQuotaRequest r;
  r.set_tenant("node");
  r.set_bytes(4 * kMiB);
  ASSERT_TRUE(quotas_.Set(r).ok());
  absl::Status s = pool0_.Acquire(on0, 6 * kMiB).status();
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("tenant node quota exceeded"));
  EXPECT_TRUE(
      absl::IsResourceExhausted(pool1_.Acquire(on1, 6 * kMiB).status()));
  r.clear_bytes();
  ASSERT_TRUE(quotas_.Set(r).ok());
  EXPECT_TRUE(pool0_.Acquire(on0, 6 * kMiB).ok());
  EXPECT_TRUE(pool1_.Acquire(on1, 6 * kMiB).ok());

  r.set_tenant("");
  EXPECT_TRUE(absl::IsInvalidArgument(quotas_.Set(r)));
}

// A tenant no peer can have under the daemon's tenancy is refused, saying
// which ones there are, and binds nothing.
TEST_F(QuotasTest, ATenantNoPeerOfTheTenancyCanHaveIsRefused) {
  Quotas by_uid{&pools_, &sessions_, Tenancy::kUid};
  v1::SetQuotaRequest r;
  r.set_tenant("x;y");
  r.set_bytes(4 * kMiB);
  const absl::Status s = by_uid.Set(r);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("under --tenancy uid"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("uid:1001"));
  r.set_tenant("uid:1000");
  EXPECT_TRUE(by_uid.Set(r).ok());
  r.set_tenant("uid:1000");
  EXPECT_TRUE(absl::IsInvalidArgument(quotas_.Set(r)));  // tenancy node
}

}  // namespace
}  // namespace allocd
