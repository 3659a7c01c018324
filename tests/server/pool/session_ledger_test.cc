// SessionLedger on its own: sessions and their incarnations, held bytes
// summed by uid and tenant, the quotas on them, and the version.
#include "server/pool/session_ledger.h"

#include <cstdint>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// The part alone, under a lock that stands for the pool's.
class SessionLedgerTest : public ::testing::Test {
 protected:
  // Session `id` (which must be live).
  SessionLedger::Session& Get(SessionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<SessionLedger::Session*> s = ledger_.Find(mu_, id);
    EXPECT_TRUE(s.ok()) << s.status();
    return **s;
  }

  absl::Mutex mu_;
  SessionLedger ledger_;
};

TEST_F(SessionLedgerTest, ASessionIdIsOneLiveSessionAndEachHasItsIncarnation) {
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(ledger_.Add(mu_, 0, 10, 100, "t").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Add(mu_, 1, 10, 100, "").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  EXPECT_EQ(ledger_.Add(mu_, 1, 10, 100, "t").code(),
            absl::StatusCode::kAlreadyExists);
  const uint64_t first = Get(1).incarnation;
  EXPECT_EQ(Get(1).pid, 100);
  EXPECT_EQ(ledger_.FindIncarnation(mu_, 1, first), &Get(1));

  ledger_.End(mu_, 1);
  EXPECT_EQ(ledger_.Find(mu_, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ledger_.Find(mu_, 1).status().message(),
              HasSubstr("no session 1"));
  // The same id again is a later session: work the first began outside
  // the lock does not find it.
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 101, "t").ok());
  EXPECT_EQ(ledger_.FindIncarnation(mu_, 1, first), nullptr);
  EXPECT_NE(ledger_.FindIncarnation(mu_, 1, Get(1).incarnation), nullptr);
}

TEST_F(SessionLedgerTest, HeldBytesCountForTheSessionItsUidAndItsTenant) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  ASSERT_TRUE(ledger_.Add(mu_, 2, 10, 200, "u").ok());
  ASSERT_TRUE(ledger_.Add(mu_, 3, 20, 300, "t").ok());
  ledger_.SetUidQuota(mu_, 10, 100 * kMiB);
  ledger_.SetTenantQuota(mu_, "t", 150 * kMiB);
  ledger_.AddHeld(mu_, Get(1), 60 * kMiB);
  ledger_.AddHeld(mu_, Get(2), 30 * kMiB);
  EXPECT_EQ(Get(1).held, 60 * kMiB);
  // uid 10 holds 90 MiB through two tenants.
  const absl::Status uid = ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB);
  EXPECT_EQ(uid.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(uid.message(), HasSubstr("the sessions of uid 10 hold 90.00 MiB"));
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 1, Get(1), 10 * kMiB).ok());
  // Tenant t holds 140 MiB through two uids.
  ledger_.AddHeld(mu_, Get(3), 80 * kMiB);
  const absl::Status tenant = ledger_.CheckQuotas(mu_, 3, Get(3), 20 * kMiB);
  EXPECT_EQ(tenant.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(tenant.message(),
              HasSubstr("tenant t quota exceeded: its sessions hold 140.00 MiB"));

  // What an ended session held no longer counts.
  ledger_.End(mu_, 1);
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 2, Get(2), 70 * kMiB).ok());
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 3, Get(3), 70 * kMiB).ok());
  ledger_.SubtractHeld(mu_, Get(3), 80 * kMiB);
  EXPECT_EQ(Get(3).held, 0u);
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 3, Get(3), 150 * kMiB).ok());
}

TEST_F(SessionLedgerTest, ASessionIsHeldToItsOwnQuotaFirst) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  EXPECT_FALSE(ledger_.SetSessionQuota(mu_, 2, 10 * kMiB));
  ASSERT_TRUE(ledger_.SetSessionQuota(mu_, 1, 10 * kMiB));
  ledger_.SetUidQuota(mu_, 10, 5 * kMiB);
  const absl::Status over = ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB);
  EXPECT_THAT(over.message(), HasSubstr("session quota exceeded: session 1"));
  // Removed, the next quota that covers it speaks.
  ASSERT_TRUE(ledger_.SetSessionQuota(mu_, 1, std::nullopt));
  EXPECT_THAT(ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB).message(),
              HasSubstr("uid quota exceeded"));
  ledger_.SetUidQuota(mu_, 10, std::nullopt);
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB).ok());
}

TEST_F(SessionLedgerTest, TheDefaultTenantQuotaCoversTenantsWithoutTheirOwn) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  ASSERT_TRUE(ledger_.Add(mu_, 2, 10, 200, "u").ok());
  ledger_.SetDefaultTenantQuota(mu_, 10 * kMiB);
  ledger_.SetTenantQuota(mu_, "u", 30 * kMiB);
  EXPECT_FALSE(ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB).ok());
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 2, Get(2), 20 * kMiB).ok());
  // Its own removed, the default covers it again.
  ledger_.SetTenantQuota(mu_, "u", std::nullopt);
  EXPECT_FALSE(ledger_.CheckQuotas(mu_, 2, Get(2), 20 * kMiB).ok());
  ledger_.SetDefaultTenantQuota(mu_, std::nullopt);
  EXPECT_TRUE(ledger_.CheckQuotas(mu_, 1, Get(1), 20 * kMiB).ok());
}

TEST_F(SessionLedgerTest, TheVersionChangesWhenHoldingsDoAndGrantsAreNumbered) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  uint64_t version = ledger_.version();
  ledger_.AddHeld(mu_, Get(1), kMiB);
  EXPECT_GT(ledger_.version(), version);
  version = ledger_.version();
  ledger_.SubtractHeld(mu_, Get(1), 0);  // nothing changed hands
  EXPECT_EQ(ledger_.version(), version);
  ledger_.NoteChange(mu_);
  EXPECT_GT(ledger_.version(), version);

  const uint64_t grant = ledger_.NewGrant(mu_);
  EXPECT_NE(grant, 0u);
  EXPECT_NE(ledger_.NewGrant(mu_), grant);
}

TEST_F(SessionLedgerTest, ForEachVisitsEverySession) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(ledger_.Add(mu_, 1, 10, 100, "t").ok());
  ASSERT_TRUE(ledger_.Add(mu_, 2, 20, 200, "u").ok());
  ledger_.AddHeld(mu_, Get(2), kMiB);
  std::map<SessionId, uint64_t> held;
  ledger_.ForEach(mu_, [&](SessionId id, const SessionLedger::Session& s) {
    held[id] = s.held;
  });
  EXPECT_EQ(held, (std::map<SessionId, uint64_t>{{1, 0}, {2, kMiB}}));
}

}  // namespace
}  // namespace allocd
