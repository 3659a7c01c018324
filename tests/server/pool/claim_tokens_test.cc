#include "server/pool/claim_tokens.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

// The part alone, under a lock that stands for the pool's, on a clock the
// tests move.
class ClaimTokensTest : public ::testing::Test {
 protected:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  ClaimTokens claims_{absl::Seconds(30), [this] { return now_; }};
};

TEST(NewTokenTest, ThirtyTwoHexDigitsNeverTheSame) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> token = NewToken();
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_THAT(*token, ::testing::MatchesRegex("[0-9a-f]{32}"));
    EXPECT_TRUE(seen.insert(*token).second);
  }
}

TEST_F(ClaimTokensTest, OnlyTheClaimsPidTakesItAndOnlyOnce) {
  absl::MutexLock lock(&mu_);
  claims_.Add(mu_, "t", PendingClaim{.session = 1, .pid = 11, .chunk_ids = {5}});
  absl::StatusOr<PendingClaim> other = claims_.TakeFor(mu_, "t", 22);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  // It names no other process (issue 41).
  EXPECT_THAT(other.status().message(), ::testing::HasSubstr("pid 22"));
  EXPECT_THAT(other.status().message(),
              ::testing::Not(::testing::HasSubstr("11")));
  absl::StatusOr<PendingClaim> mine = claims_.TakeFor(mu_, "t", 11);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_THAT(mine->chunk_ids, ::testing::ElementsAre(5));
  EXPECT_EQ(mine->expires, now_ + absl::Seconds(30));
  EXPECT_EQ(claims_.TakeFor(mu_, "t", 11).status().code(),
            absl::StatusCode::kNotFound);
  // Put back (nothing went out), it is pending again, expiry unchanged.
  claims_.PutBack(mu_, "t", *std::move(mine));
  std::optional<PendingClaim> again = claims_.Take(mu_, "t");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->expires, now_ + absl::Seconds(30));
  EXPECT_FALSE(claims_.Take(mu_, "t").has_value());
}

TEST_F(ClaimTokensTest, ExpiredClaimsAreTakenOnceAndEndedSessionsForgotten) {
  absl::MutexLock lock(&mu_);
  claims_.Add(mu_, "old", PendingClaim{.session = 1, .pid = 11});
  now_ += absl::Seconds(20);
  claims_.Add(mu_, "new", PendingClaim{.session = 2, .pid = 22});
  claims_.Add(mu_, "ended", PendingClaim{.session = 3, .pid = 33});
  EXPECT_TRUE(claims_.TakeExpired(mu_).empty());
  now_ += absl::Seconds(10);  // "old" is 30 s old
  std::vector<PendingClaim> expired = claims_.TakeExpired(mu_);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].session, 1u);
  EXPECT_TRUE(claims_.TakeExpired(mu_).empty());
  claims_.EndSession(mu_, 3);
  EXPECT_FALSE(claims_.Take(mu_, "ended").has_value());
  EXPECT_TRUE(claims_.Take(mu_, "new").has_value());
}

}  // namespace
}  // namespace allocd
