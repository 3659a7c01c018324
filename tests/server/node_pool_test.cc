#include "server/pool/node_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr uint64_t kChunk = uint64_t{2} << 20;

class NodePoolTest : public ::testing::Test {
 protected:
  NodePool MakePool(uint64_t chunks) {
    return NodePool(&source_, NodePool::Options{.capacity = chunks * kChunk,
                                                .now = [this] { return now_; }});
  }
  MemfdChunkSource source_{kChunk, /*chunks_per_slab=*/4};
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

// Maps a claimed chunk and returns its first byte's address.
char* Map(const ChunkFd& chunk) {
  void* p = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_SHARED,
                 chunk.fd.get(), static_cast<off_t>(chunk.offset));
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char*>(p);
}

TEST_F(NodePoolTest, ReleasedChunksServeTheNextSessionWithTheSameMemory) {
  NodePool pool = MakePool(8);
  ASSERT_TRUE(pool.AddSession(1, 1000, 11).ok());
  ASSERT_TRUE(pool.AddSession(2, 1001, 22).ok());
  absl::StatusOr<Grant> a = pool.Acquire(1, 3 * kChunk - 1);  // rounds up
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->chunk_ids.size(), 3u);
  EXPECT_EQ(a->bytes, 3 * kChunk);
  EXPECT_EQ(a->reused_chunks, 0u);
  absl::StatusOr<std::vector<ChunkFd>> fds = pool.Claim(a->token, 11);
  ASSERT_TRUE(fds.ok()) << fds.status();
  char* mem = Map((*fds)[0]);
  std::strcpy(mem, "written by session 1");
  munmap(mem, kChunk);
  ASSERT_TRUE(pool.Release(1, {a->chunk_ids[0]}).ok());

  absl::StatusOr<Grant> b = pool.Acquire(2, kChunk);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->reused_chunks, 1u);
  EXPECT_EQ(b->chunk_ids, std::vector<uint64_t>{a->chunk_ids[0]});
  absl::StatusOr<std::vector<ChunkFd>> b_fds = pool.Claim(b->token, 22);
  ASSERT_TRUE(b_fds.ok());
  char* seen = Map((*b_fds)[0]);
  EXPECT_STREQ(seen, "written by session 1");
  munmap(seen, kChunk);
  PoolStats stats = pool.Stats();
  EXPECT_EQ(stats.chunks_created_total, 3u);
  EXPECT_EQ(stats.chunks_reused_total, 1u);
  EXPECT_EQ(stats.in_use_bytes, 3 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 2 * kChunk);
  EXPECT_EQ(stats.sessions.at(2).bytes, kChunk);
}

TEST_F(NodePoolTest, CapacityIsNeverExceededAndAcquireIsAllOrNothing) {
  NodePool pool = MakePool(4);
  ASSERT_TRUE(pool.AddSession(1, 0, 1).ok());
  ASSERT_TRUE(pool.Acquire(1, 3 * kChunk).ok());
  absl::StatusOr<Grant> over = pool.Acquire(1, 2 * kChunk);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(IsNodeShortage(over.status()));
  EXPECT_THAT(over.status().message(), HasSubstr("node pool exhausted"));
  EXPECT_THAT(over.status().message(), HasSubstr("2.00 MiB available"));
  EXPECT_EQ(pool.Stats().in_use_bytes, 3 * kChunk);  // nothing taken
  EXPECT_TRUE(pool.Acquire(1, kChunk).ok());
}

TEST_F(NodePoolTest, QuotasPerSessionAndPerUidNameTheLimit) {
  NodePool pool = MakePool(16);
  ASSERT_TRUE(pool.AddSession(1, 500, 1).ok());
  ASSERT_TRUE(pool.AddSession(2, 500, 2).ok());
  pool.SetSessionQuota(1, 2 * kChunk);
  ASSERT_TRUE(pool.Acquire(1, 2 * kChunk).ok());
  absl::Status s = pool.Acquire(1, kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsNodeShortage(s));
  EXPECT_THAT(s.message(), HasSubstr("session quota exceeded"));

  pool.SetUidQuota(500, 5 * kChunk);
  ASSERT_TRUE(pool.Acquire(2, 3 * kChunk).ok());
  s = pool.Acquire(2, kChunk).status();
  EXPECT_THAT(s.message(), HasSubstr("uid 500 quota exceeded"));
  EXPECT_EQ(pool.Stats().in_use_bytes, 5 * kChunk);
  pool.SetUidQuota(500, std::nullopt);
  pool.SetSessionQuota(1, std::nullopt);
  EXPECT_TRUE(pool.Acquire(1, kChunk).ok());
  EXPECT_TRUE(pool.Acquire(2, kChunk).ok());
}

TEST_F(NodePoolTest, OnlyTheGrantsPidClaimsAndOnlyOnce) {
  NodePool pool = MakePool(4);
  ASSERT_TRUE(pool.AddSession(1, 0, 100).ok());
  absl::StatusOr<Grant> g = pool.Acquire(1, kChunk);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->token.size(), 32u);  // 128 random bits, hex
  EXPECT_EQ(pool.Claim(g->token, 200).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(pool.Claim(g->token, 100).ok());  // survived the wrong pid
  EXPECT_EQ(pool.Claim(g->token, 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.Claim("00000000000000000000000000000000", 100).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, TokensExpire) {
  NodePool pool = MakePool(4);
  ASSERT_TRUE(pool.AddSession(1, 0, 100).ok());
  absl::StatusOr<Grant> g = pool.Acquire(1, kChunk);
  ASSERT_TRUE(g.ok());
  now_ += absl::Seconds(31);
  EXPECT_EQ(pool.Claim(g->token, 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.Stats().sessions.at(1).bytes, kChunk);  // still held
}

TEST_F(NodePoolTest, ReleaseOfAnotherSessionsChunkChangesNothing) {
  NodePool pool = MakePool(4);
  ASSERT_TRUE(pool.AddSession(1, 0, 1).ok());
  ASSERT_TRUE(pool.AddSession(2, 0, 2).ok());
  absl::StatusOr<Grant> mine = pool.Acquire(1, kChunk);
  absl::StatusOr<Grant> theirs = pool.Acquire(2, kChunk);
  absl::Status s = pool.Release(1, {mine->chunk_ids[0], theirs->chunk_ids[0]});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("not held by session 1"));
  EXPECT_EQ(pool.Stats().sessions.at(1).bytes, kChunk);  // all or nothing
  EXPECT_EQ(pool.Release(1, {mine->chunk_ids[0], mine->chunk_ids[0]}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Release(3, {mine->chunk_ids[0]}).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, EndSessionReturnsEverythingAndKillsItsTokens) {
  NodePool pool = MakePool(8);
  ASSERT_TRUE(pool.AddSession(1, 0, 1).ok());
  absl::StatusOr<Grant> g = pool.Acquire(1, 5 * kChunk);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(pool.EndSession(1), 5 * kChunk);
  EXPECT_EQ(pool.EndSession(1), 0u);
  EXPECT_EQ(pool.Claim(g->token, 1).status().code(),
            absl::StatusCode::kNotFound);
  PoolStats stats = pool.Stats();
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_EQ(stats.free_bytes, 5 * kChunk);
  EXPECT_TRUE(stats.sessions.empty());
  EXPECT_EQ(pool.AddSession(2, 0, 2).code(), absl::StatusCode::kOk);
  EXPECT_EQ(pool.AddSession(2, 0, 2).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(NodePoolTest, TrimFreeClosesCachedChunks) {
  NodePool pool = MakePool(8);
  ASSERT_TRUE(pool.AddSession(1, 0, 1).ok());
  ASSERT_TRUE(pool.Acquire(1, 4 * kChunk).ok());
  pool.EndSession(1);
  EXPECT_EQ(pool.TrimFree(3 * kChunk - 1), 3 * kChunk);
  PoolStats stats = pool.Stats();
  EXPECT_EQ(stats.free_bytes, kChunk);
  EXPECT_EQ(stats.in_use_bytes, 0u);
}

TEST_F(NodePoolTest, ConcurrentSessionsNeverShareAChunk) {
  NodePool pool = MakePool(64);
  constexpr int kThreads = 4;
  for (int t = 0; t < kThreads; ++t) ASSERT_TRUE(pool.AddSession(t + 1, 0, t + 1).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, session = uint64_t(t + 1)] {
      for (int i = 0; i < 300; ++i) {
        absl::StatusOr<Grant> g = pool.Acquire(session, (1 + i % 5) * kChunk);
        if (!g.ok()) continue;
        EXPECT_TRUE(pool.Release(session, g->chunk_ids).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  PoolStats stats = pool.Stats();
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_LE(stats.free_bytes, stats.capacity);
  EXPECT_GT(stats.chunks_reused_total, 0u);
}

}  // namespace
}  // namespace allocd
