// ChunkShares on its own, and sharing through the node pool: what an open
// holds, and when shared chunks go back to the cache.
#include "server/pool/chunk_shares.h"

#include <sys/mman.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/node_pool.h"
#include "tests/server/pool/node_pool_fixture.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Optional;

// The part alone, under a lock that stands for the pool's.
class ChunkSharesTest : public ::testing::Test {
 protected:
  absl::Mutex mu_;
  ChunkShares shares_;
};

TEST_F(ChunkSharesTest, AChunkIsHeldWhileAnyOpenOfAnyShareOfItIs) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(shares_.Add(mu_, 1, "both", {10, 11}).ok());
  ASSERT_TRUE(shares_.Add(mu_, 1, "one", {11}).ok());
  EXPECT_FALSE(shares_.IsOpen(mu_, 11));  // shared, not yet opened
  EXPECT_TRUE(shares_.Open(mu_, 2, "both").ok());
  EXPECT_TRUE(shares_.Open(mu_, 3, "one").ok());
  EXPECT_TRUE(shares_.IsOpen(mu_, 10));
  // Closing one open frees only the chunks no other open holds, in the
  // share's order.
  EXPECT_THAT(shares_.Close(mu_, 2, "both"), Optional(ElementsAre(10)));
  EXPECT_FALSE(shares_.IsOpen(mu_, 10));
  EXPECT_TRUE(shares_.IsOpen(mu_, 11));
  EXPECT_EQ(shares_.Close(mu_, 2, "both"), std::nullopt);  // none left
  EXPECT_THAT(shares_.Close(mu_, 3, "one"), Optional(ElementsAre(11)));
}

TEST_F(ChunkSharesTest, GivingUpAChunkEndsOnlyTheSharesThatIncludeIt) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(shares_.Add(mu_, 1, "ten", {10}).ok());
  ASSERT_TRUE(shares_.Add(mu_, 1, "eleven", {11}).ok());
  ASSERT_TRUE(shares_.Open(mu_, 2, "ten").ok());
  shares_.EndShares(mu_, {10});
  EXPECT_EQ(shares_.Open(mu_, 3, "ten").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(shares_.Open(mu_, 3, "eleven").ok());
  // The ended share's open still closes, and still holds its chunk until
  // then.
  EXPECT_TRUE(shares_.IsOpen(mu_, 10));
  EXPECT_THAT(shares_.Close(mu_, 2, "ten"), Optional(ElementsAre(10)));
}

// One session cannot make the pool keep shares without end: a chunk is in
// at most kMaxSharesPerChunk that take opens, and one that ends (its chunk
// given up) makes room again. Giving a chunk up walks only its shares.
TEST_F(ChunkSharesTest, AChunkIsInAtMostABoundedNumberOfLiveShares) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ChunkShares::kMaxSharesPerChunk; ++i) {
    ASSERT_TRUE(shares_.Add(mu_, 1, absl::StrCat("s", i), {10, 11}).ok());
  }
  const absl::Status refused = shares_.Add(mu_, 1, "one more", {12, 11});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("chunk 11 is already in 16 shares"));
  // Nothing of the refused share was kept: chunk 12 takes shares as before.
  EXPECT_EQ(shares_.OwnerOf(mu_, "one more"), std::nullopt);
  for (size_t i = 0; i < ChunkShares::kMaxSharesPerChunk; ++i) {
    ASSERT_TRUE(shares_.Add(mu_, 1, absl::StrCat("t", i), {12}).ok());
  }
  ASSERT_TRUE(shares_.Open(mu_, 2, "s0").ok());
  shares_.EndShares(mu_, {10});
  for (size_t i = 0; i < ChunkShares::kMaxSharesPerChunk; ++i) {
    EXPECT_EQ(shares_.OwnerOf(mu_, absl::StrCat("s", i)), std::nullopt);
    EXPECT_EQ(shares_.OwnerOf(mu_, absl::StrCat("t", i)), SessionId{1});
  }
  EXPECT_TRUE(shares_.Add(mu_, 1, "again", {11}).ok());
  EXPECT_THAT(shares_.Close(mu_, 2, "s0"), Optional(ElementsAre(10, 11)));
}

TEST_F(ChunkSharesTest, AnEndingSessionEndsItsSharesAndClosesItsOpens) {
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(shares_.Add(mu_, 1, "mine", {10}).ok());
  ASSERT_TRUE(shares_.Add(mu_, 2, "theirs", {20, 21}).ok());
  ASSERT_TRUE(shares_.Open(mu_, 1, "theirs").ok());
  ASSERT_TRUE(shares_.Open(mu_, 1, "theirs").ok());
  ASSERT_TRUE(shares_.Open(mu_, 2, "mine").ok());
  EXPECT_THAT(shares_.EndSession(mu_, 1), ElementsAre(20, 21));
  EXPECT_FALSE(shares_.IsOpen(mu_, 20));
  EXPECT_EQ(shares_.Open(mu_, 2, "mine").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(shares_.Close(mu_, 2, "mine"), Optional(ElementsAre(10)));
  EXPECT_THAT(shares_.EndSession(mu_, 2), IsEmpty());
}

TEST_F(NodePoolTest, ASharedChunkIsMappedByTheOpenerWhileItsOwnerKeepsIt) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 9 * kChunk);  // 8 + 1
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::vector<ChunkFd>> mine = ClaimAll(*pool, a->token, 11);
  ASSERT_TRUE(mine.ok());
  char* written = Map((*mine)[1]);
  std::strcpy(written, "the owner's tensor");

  absl::StatusOr<std::string> share = pool->Share(1, a->chunk_ids);
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->size(), 32u);
  absl::StatusOr<Grant> opened = pool->OpenShare(2, *share);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->chunk_ids, a->chunk_ids);
  EXPECT_EQ(opened->chunk_sizes, a->chunk_sizes);
  EXPECT_EQ(opened->bytes, 9 * kChunk);
  // Only the opener's pid claims the FDs.
  EXPECT_EQ(ClaimAll(*pool, opened->token, 11).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::vector<ChunkFd>> theirs =
      ClaimAll(*pool, opened->token, 22);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  ASSERT_EQ(theirs->size(), 2u);
  EXPECT_EQ((*theirs)[1].bytes, kChunk);
  char* seen = Map((*theirs)[1]);
  EXPECT_STREQ(seen, "the owner's tensor");  // the same memory
  munmap(seen, kChunk);
  munmap(written, kChunk);
  // The chunks stay the owner's: its bytes, not the opener's.
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(1).bytes, 9 * kChunk);
  EXPECT_EQ(stats.sessions.at(2).bytes, 0u);
  // The opener cannot release them.
  EXPECT_EQ(pool->Release(2, a->chunk_ids).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(NodePoolTest, SharedChunksReturnToTheCacheWhenOwnerAndOpenersAreDone) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  ASSERT_TRUE(pool->AddSession(3, 0, 33, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::string> share = pool->Share(1, a->chunk_ids);
  ASSERT_TRUE(share.ok());
  ASSERT_TRUE(pool->OpenShare(2, *share).ok());
  ASSERT_TRUE(pool->OpenShare(2, *share).ok());  // twice: two closes
  ASSERT_TRUE(pool->OpenShare(3, *share).ok());

  // The owner frees its memory: nobody holds it, nothing is cached, and
  // the share takes no new opens.
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(1).bytes, 0u);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.in_use_bytes, 2 * kChunk);
  EXPECT_EQ(pool->OpenShare(3, *share).status().code(),
            absl::StatusCode::kNotFound);
  // Not for an Acquire, and not trimmed.
  absl::StatusOr<Grant> other = pool->Acquire(3, kChunk);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->reused_chunks, 0u);
  EXPECT_EQ(pool->TrimFree(UINT64_MAX), 0u);

  ASSERT_TRUE(pool->CloseShare(2, *share).ok());
  ASSERT_TRUE(pool->CloseShare(2, *share).ok());
  EXPECT_EQ(pool->CloseShare(2, *share).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->Stats().free_bytes, 0u);  // session 3 still has it open
  // The last opener ends: the chunks go back to the cache.
  pool->EndSession(3);
  stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, 3 * kChunk);
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_EQ(pool->CloseShare(2, *share).code(), absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, AnOwnerThatEndsLeavesItsOpenSharesMapped) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 3 * kChunk);
  absl::StatusOr<Grant> kept = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok() && kept.ok());
  absl::StatusOr<std::string> share = pool->Share(1, a->chunk_ids);
  absl::StatusOr<std::string> unopened = pool->Share(1, kept->chunk_ids);
  ASSERT_TRUE(share.ok() && unopened.ok());
  ASSERT_TRUE(pool->OpenShare(2, *share).ok());
  pool->EndSession(1);
  // The shared chunks wait for their opener; the other goes to the cache.
  EXPECT_EQ(pool->Stats().free_bytes, kChunk);
  EXPECT_EQ(pool->OpenShare(2, *unopened).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(pool->CloseShare(2, *share).ok());
  EXPECT_EQ(pool->Stats().free_bytes, 4 * kChunk);
}

TEST_F(NodePoolTest, OnlyAnOwnersHeldChunksAreShared) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool->Share(2, a->chunk_ids).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->Share(1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Share(1, {a->chunk_ids[0], a->chunk_ids[0]}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Share(9, a->chunk_ids).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      pool->OpenShare(2, "00000000000000000000000000000000").status().code(),
      absl::StatusCode::kNotFound);
  // A share of some chunks ends when one of them is released, not when
  // another is.
  absl::StatusOr<std::string> first = pool->Share(1, {a->chunk_ids[0]});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[1]}).ok());
  EXPECT_TRUE(pool->OpenShare(2, *first).ok());
}

TEST_F(NodePoolTest, ASessionSharesAChunkABoundedNumberOfTimesUntilItReleasesIt) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok());
  for (size_t i = 0; i < ChunkShares::kMaxSharesPerChunk; ++i) {
    ASSERT_TRUE(pool->Share(1, a->chunk_ids).ok()) << i;
  }
  EXPECT_EQ(pool->Share(1, a->chunk_ids).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Released and acquired again, the chunk takes shares again.
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  absl::StatusOr<Grant> again = pool->Acquire(1, kChunk);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(pool->Share(1, again->chunk_ids).ok());
}

TEST_F(NodePoolTest, AnOpenWhoseClaimIsNeverMadeCloses) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::string> share = pool->Share(1, a->chunk_ids);
  ASSERT_TRUE(share.ok());
  absl::StatusOr<Grant> abandoned = pool->OpenShare(2, *share);
  absl::StatusOr<Grant> expired = pool->OpenShare(2, *share);
  ASSERT_TRUE(abandoned.ok() && expired.ok());
  EXPECT_EQ(pool->Abandon(abandoned->token), 0u);  // nothing was the opener's
  now_ += absl::Minutes(1);                        // past the token TTL
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  // The expired claim is dropped on the next claim: its open closes too.
  EXPECT_EQ(ClaimAll(*pool, expired->token, 22).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->Stats().free_bytes, kChunk);
  EXPECT_EQ(pool->CloseShare(2, *share).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace allocd
