#include "server/accept_pacer.h"

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

AcceptPacer Pacer(AcceptRate rate) {
  return AcceptPacer("client-socket connection", "--accept-rate-per-uid",
                     rate);
}

TEST(AcceptPacerTest, AUidOpensItsBurstAtOnceThenAtItsRate) {
  AcceptPacer pacer = Pacer({.per_second = 10, .burst = 40});
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(pacer.Take(1000, 1, kStart).ok()) << i;
  }
  const absl::Status refused = pacer.Take(1000, 1, kStart);
  EXPECT_TRUE(absl::IsResourceExhausted(refused));
  EXPECT_THAT(refused.message(), HasSubstr("uid 1000"));
  EXPECT_THAT(refused.message(), HasSubstr("--accept-rate-per-uid=10"));
  // A tenth of a second brings one more, not two.
  const absl::Time later = kStart + absl::Milliseconds(100);
  EXPECT_TRUE(pacer.Take(1000, 1, later).ok());
  EXPECT_FALSE(pacer.Take(1000, 1, later).ok());
  // A quiet while brings the burst back, and no more.
  const absl::Time quiet = later + absl::Hours(1);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(pacer.Take(1000, 1, quiet).ok()) << i;
  }
  EXPECT_FALSE(pacer.Take(1000, 1, quiet).ok());
}

TEST(AcceptPacerTest, OneUidPastItsRateLeavesTheOthersTheirs) {
  AcceptPacer pacer = Pacer({.per_second = 1, .burst = 2});
  while (pacer.Take(1000, 1, kStart).ok()) {
  }
  EXPECT_TRUE(pacer.Take(1001, 2, kStart).ok());
  EXPECT_TRUE(pacer.Take(1001, 2, kStart).ok());
  EXPECT_FALSE(pacer.Take(1001, 2, kStart).ok());
}

TEST(AcceptPacerTest, ManyUidsAreForgottenOnceTheirBucketsRefill) {
  AcceptPacer pacer = Pacer({.per_second = 1, .burst = 1});
  for (uid_t uid = 0; uid < 10'000; ++uid) {
    ASSERT_TRUE(pacer.Take(uid, 1, kStart).ok()) << uid;
  }
  EXPECT_EQ(pacer.tracked_uids(), 10'000u);
  // Long after, every bucket is full again: one more uid drops them all.
  const absl::Time later = kStart + absl::Minutes(1);
  ASSERT_TRUE(pacer.Take(10'000, 1, later).ok());
  EXPECT_EQ(pacer.tracked_uids(), 1u);
  EXPECT_FALSE(pacer.Take(10'000, 1, later).ok());
  EXPECT_TRUE(pacer.Take(0, 1, later).ok());
}

TEST(AcceptPacerTest, ARateOfZeroBoundsNothing) {
  AcceptPacer pacer = Pacer({});
  for (int i = 0; i < 100'000; ++i) {
    ASSERT_TRUE(pacer.Take(1000, 1, kStart).ok());
  }
}

}  // namespace
}  // namespace allocd
