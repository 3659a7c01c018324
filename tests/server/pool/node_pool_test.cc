#include "server/pool/node_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/memfd_chunk_source.h"
#include "tests/server/pool/full_device_source.h"
#include "tests/server/pool/node_pool_fixture.h"

namespace allocd {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

int OpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count - 3;
}

TEST_F(NodePoolTest, ReleasedChunksServeTheNextSessionWithTheSameMemory) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 1001, 22, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 3 * kChunk - 1);  // rounds up
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->chunk_ids.size(), 3u);
  EXPECT_EQ(a->bytes, 3 * kChunk);
  EXPECT_EQ(a->reused_chunks, 0u);
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, a->token, 11);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 3u);
  EXPECT_EQ((*fds)[0].id, a->chunk_ids[0]);
  EXPECT_EQ((*fds)[0].bytes, kChunk);
  char* mem = Map((*fds)[0]);
  std::strcpy(mem, "written by session 1");
  std::strcpy(mem + kChunk - 8, "tail");
  munmap(mem, kChunk);
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[0]}).ok());

  absl::StatusOr<Grant> b = pool->Acquire(2, kChunk);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->reused_chunks, 1u);
  EXPECT_EQ(b->chunk_ids, std::vector<uint64_t>{a->chunk_ids[0]});
  absl::StatusOr<std::vector<ChunkFd>> b_fds = ClaimAll(*pool, b->token, 22);
  ASSERT_TRUE(b_fds.ok());
  char* seen = Map((*b_fds)[0]);
  EXPECT_STREQ(seen, "written by session 1");
  EXPECT_STREQ(seen + kChunk - 8, "tail");
  munmap(seen, kChunk);

  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.chunks_created_total, 3u);
  EXPECT_EQ(stats.chunks_reused_total, 1u);
  EXPECT_EQ(source_.created.load(), 3);  // no new memory for session 2
  EXPECT_EQ(stats.created_bytes, 3 * kChunk);
  EXPECT_EQ(stats.in_use_bytes, 3 * kChunk);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.sessions.at(1).bytes, 2 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).uid, 1000u);
  EXPECT_EQ(stats.sessions.at(1).pid, 11);
  EXPECT_EQ(stats.sessions.at(2).bytes, kChunk);
}

TEST_F(NodePoolTest, CachedChunksGoFirstAndOnlyTheRestIsCreated) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 3 * kChunk);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[0], a->chunk_ids[2]}).ok());
  absl::StatusOr<Grant> b = pool->Acquire(2, 4 * kChunk);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->reused_chunks, 2u);
  ASSERT_EQ(b->chunk_ids.size(), 4u);
  // The cached ones lead, most recently released first.
  EXPECT_EQ(b->chunk_ids[0], a->chunk_ids[2]);
  EXPECT_EQ(b->chunk_ids[1], a->chunk_ids[0]);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.chunks_created_total, 5u);
  EXPECT_EQ(stats.chunks_reused_total, 2u);
  EXPECT_EQ(stats.created_bytes, 5 * kChunk);
}

// What could be granted with nobody giving back: the cache and what is not
// created yet, and no more than an Acquire then gets.
TEST_F(NodePoolTest, AvailableBytesAreTheCacheAndTheUncreatedCapacity) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  EXPECT_EQ(pool->AvailableBytes(), 8 * kChunk);
  absl::StatusOr<Grant> a = pool->Acquire(1, 3 * kChunk);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool->AvailableBytes(), 5 * kChunk);
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[0]}).ok());  // cached now
  EXPECT_EQ(pool->AvailableBytes(), 6 * kChunk);
  EXPECT_TRUE(pool->Acquire(1, 6 * kChunk).ok());
  EXPECT_EQ(pool->AvailableBytes(), 0u);
  EXPECT_FALSE(pool->Acquire(1, kChunk).ok());
}

TEST_F(NodePoolTest, AClaimArrivesInBatchesWhoseFdsCloseAsTheyGo) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 7 * kChunk);
  ASSERT_TRUE(g.ok()) << g.status();
  const int before = OpenFds();
  std::vector<uint64_t> ids;
  std::vector<size_t> sizes;
  std::vector<bool> lasts;
  int most_open = 0;
  absl::Status s = pool->Claim(g->token, 1, 3,
                               [&](std::vector<ChunkFd>& batch, bool last) {
                                 most_open = std::max(most_open, OpenFds() - before);
                                 sizes.push_back(batch.size());
                                 lasts.push_back(last);
                                 for (const ChunkFd& c : batch) ids.push_back(c.id);
                                 return absl::OkStatus();
                               });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 1}));
  EXPECT_EQ(lasts, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(ids, g->chunk_ids);
  EXPECT_LE(most_open, 3);  // one batch's FDs at a time
  EXPECT_EQ(OpenFds(), before);
}

TEST_F(NodePoolTest, ASinkErrorStopsTheClaim) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 4 * kChunk);
  ASSERT_TRUE(g.ok()) << g.status();
  int batches = 0;
  absl::Status s = pool->Claim(g->token, 1, 2, [&](std::vector<ChunkFd>&, bool) {
    ++batches;
    return absl::UnavailableError("client went away");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(batches, 1);
  // The token was used: the session's chunks come back when it ends.
  EXPECT_EQ(ClaimAll(*pool, g->token, 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, EachChunkIsItsOwnSealedFile) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 2 * kChunk);
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, g->token, 1);
  ASSERT_TRUE(fds.ok());
  struct stat st0, st1;
  ASSERT_EQ(fstat((*fds)[0].fd.get(), &st0), 0);
  ASSERT_EQ(fstat((*fds)[1].fd.get(), &st1), 0);
  // A client can map its chunk and nothing else...
  EXPECT_NE(st0.st_ino, st1.st_ino);
  EXPECT_EQ(static_cast<uint64_t>(st0.st_size), kChunk);
  EXPECT_EQ((*fds)[0].offset, 0u);
  // ...and cannot shrink it under the next process that gets it.
  EXPECT_NE(ftruncate((*fds)[0].fd.get(), 0), 0);
  EXPECT_NE(ftruncate((*fds)[0].fd.get(), 2 * kChunk), 0);
  EXPECT_TRUE(fcntl((*fds)[0].fd.get(), F_GETFD) & FD_CLOEXEC);
}

TEST_F(NodePoolTest, CapacityIsNeverExceededAndAcquireIsAllOrNothing) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> held = pool->Acquire(1, 3 * kChunk);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(pool->Release(1, {held->chunk_ids[0]}).ok());  // 1 cached
  // 1 cached + 0 room: 2 free of 4, short by 1 chunk.
  absl::StatusOr<Grant> over = pool->Acquire(2, 3 * kChunk);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "node pool exhausted: need 6.00 MiB, free 4.00 MiB of capacity "
            "8.00 MiB (short by 2.00 MiB)");
  EXPECT_TRUE(IsNodeShortage(over.status()));
  EXPECT_EQ(ShortfallBytes(over.status()), kChunk);
  absl::Status copy = over.status();  // the payload travels with copies
  EXPECT_EQ(ShortfallBytes(copy), kChunk);
  // Nothing was taken.
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.in_use_bytes, 2 * kChunk);
  EXPECT_EQ(stats.free_bytes, kChunk);
  EXPECT_EQ(stats.sessions.at(2).bytes, 0u);
  // Exactly what fits: the cached chunk and one new one.
  absl::StatusOr<Grant> fits = pool->Acquire(2, 2 * kChunk);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->reused_chunks, 1u);
  stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, stats.capacity);
  EXPECT_EQ(ShortfallBytes(pool->Acquire(2, kChunk).status()), kChunk);

  // More than the whole node: no shortage other sessions could cover.
  absl::Status huge = pool->Acquire(2, 5 * kChunk).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.message(), HasSubstr("more than its capacity of 8.00 MiB"));
  EXPECT_FALSE(IsNodeShortage(huge));
  EXPECT_EQ(ShortfallBytes(absl::OkStatus()), std::nullopt);
  EXPECT_EQ(ShortfallBytes(absl::ResourceExhaustedError("other")),
            std::nullopt);
}

TEST_F(NodePoolTest, BadArgumentsAndUnknownSessions) {
  auto pool = MakePool(4);
  EXPECT_EQ(pool->AddSession(0, 0, 1, "node").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::Status again = pool->AddSession(1, 0, 1, "node");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pool->Acquire(1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status unknown = pool->Acquire(7, kChunk).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("no session 7"));
  EXPECT_EQ(pool->Release(7, {}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(pool->Release(1, {}).ok());
  EXPECT_FALSE(pool->SetSessionQuota(7, kChunk));
  EXPECT_EQ(pool->EndSession(7), 0u);
}

// A read-ahead's grants come from the cache only, as many whole ones as
// it holds: never a creation (it stalls the client's mapping).
TEST_F(NodePoolTest, ACachedAcquireTakesWholeGrantsFromTheCacheOnly) {
  auto pool = MakePool(64, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  // Cached: three 8s and two 1s.
  absl::StatusOr<Grant> a = pool->Acquire(1, 26 * kChunk);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  const int created = source_.created.load();
  ASSERT_EQ(created, 5);

  // Grants of 9 (an 8 and a 1): two are whole in the cache, not four.
  absl::StatusOr<Grant> ahead = pool->AcquireCached(2, 9 * kChunk, UINT64_MAX, 4);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_EQ(ahead->bytes, 18 * kChunk);
  EXPECT_THAT(ahead->chunk_sizes,
              ::testing::ElementsAre(8 * kChunk, kChunk, 8 * kChunk, kChunk));
  EXPECT_EQ(ahead->reused_chunks, 4u);
  EXPECT_FALSE(ahead->token.empty());
  EXPECT_EQ(source_.created.load(), created);
  EXPECT_EQ(pool->Stats().sessions.at(2).bytes, 18 * kChunk);
  // The one 8 left makes no grant of 9: nothing, and nothing created.
  ahead = pool->AcquireCached(2, 9 * kChunk, UINT64_MAX, 4);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_TRUE(ahead->chunk_ids.empty());
  EXPECT_TRUE(ahead->token.empty());
  EXPECT_EQ(source_.created.load(), created);
  // Of 8 it makes one, the count caps, and a quota counts whole grants.
  ASSERT_TRUE(pool->SetSessionQuota(2, 18 * kChunk));
  ahead = pool->AcquireCached(2, 8 * kChunk, UINT64_MAX, 1);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_TRUE(ahead->chunk_ids.empty()) << "over session 2's quota";
  ASSERT_TRUE(pool->SetSessionQuota(2, 26 * kChunk));
  ahead = pool->AcquireCached(2, 8 * kChunk, UINT64_MAX, 1);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_THAT(ahead->chunk_sizes, ::testing::ElementsAre(8 * kChunk));
  // The grant is claimed like any other.
  int fds = 0;
  ASSERT_TRUE(pool->Claim(ahead->token, 2, 16,
                          [&](std::vector<ChunkFd>& batch, bool) {
                            fds += static_cast<int>(batch.size());
                            return absl::OkStatus();
                          })
                  .ok());
  EXPECT_EQ(fds, 1);

  EXPECT_EQ(pool->AcquireCached(2, 0, UINT64_MAX, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->AcquireCached(2, kChunk, UINT64_MAX, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->AcquireCached(9, kChunk, UINT64_MAX, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, QuotasPerSessionAndPerUidNameTheLimit) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 500, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 500, 2, "node").ok());
  ASSERT_TRUE(pool->AddSession(3, 501, 3, "node").ok());
  ASSERT_TRUE(pool->SetSessionQuota(1, 2 * kChunk));
  ASSERT_TRUE(pool->Acquire(1, 2 * kChunk).ok());
  absl::Status s = pool->Acquire(1, kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsNodeShortage(s));
  EXPECT_EQ(s.message(),
            "session quota exceeded: session 1 holds 4.00 MiB, asks 2.00 MiB, "
            "quota 4.00 MiB");
  EXPECT_EQ(pool->Stats().sessions.at(1).quota, 2 * kChunk);

  pool->SetUidQuota(500, 5 * kChunk);
  ASSERT_TRUE(pool->Acquire(2, 3 * kChunk).ok());  // uid 500: 5 chunks
  s = pool->Acquire(2, kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsNodeShortage(s));
  EXPECT_EQ(s.message(),
            "uid quota exceeded: the sessions of uid 500 hold 10.00 MiB, asks "
            "2.00 MiB, quota 10.00 MiB");
  EXPECT_TRUE(pool->Acquire(3, 4 * kChunk).ok());  // another uid
  EXPECT_EQ(pool->Stats().in_use_bytes, 9 * kChunk);

  // Lowering below use revokes nothing; it only refuses more.
  pool->SetUidQuota(500, kChunk);
  ASSERT_TRUE(pool->SetSessionQuota(3, kChunk));
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(1).bytes + stats.sessions.at(2).bytes,
            5 * kChunk);
  EXPECT_EQ(stats.sessions.at(3).bytes, 4 * kChunk);
  EXPECT_FALSE(pool->Acquire(3, kChunk).ok());
  // Releasing makes room under the uid quota again.
  pool->SetUidQuota(500, 5 * kChunk);
  absl::StatusOr<Grant> more = pool->Acquire(2, kChunk);
  EXPECT_FALSE(more.ok());
  EXPECT_EQ(pool->EndSession(1), 2 * kChunk);
  EXPECT_TRUE(pool->Acquire(2, 2 * kChunk).ok());

  pool->SetUidQuota(500, std::nullopt);
  ASSERT_TRUE(pool->SetSessionQuota(3, std::nullopt));
  EXPECT_TRUE(pool->Acquire(2, kChunk).ok());
  EXPECT_TRUE(pool->Acquire(3, kChunk).ok());
}

TEST_F(NodePoolTest, TenantQuotaCountsTheTenantsSessionsTogether) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 500, 1, "pod:a").ok());
  ASSERT_TRUE(pool->AddSession(2, 501, 2, "pod:a").ok());  // another uid
  ASSERT_TRUE(pool->AddSession(3, 500, 3, "pod:b").ok());  // same uid
  pool->SetTenantQuota("pod:a", 5 * kChunk);
  ASSERT_TRUE(pool->Acquire(1, 3 * kChunk).ok());
  ASSERT_TRUE(pool->Acquire(2, 2 * kChunk).ok());
  absl::Status s = pool->Acquire(2, kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsNodeShortage(s));
  EXPECT_EQ(s.message(),
            "tenant pod:a quota exceeded: its sessions hold 10.00 MiB, asks "
            "2.00 MiB, quota 10.00 MiB");
  EXPECT_TRUE(pool->Acquire(3, 6 * kChunk).ok());  // another tenant

  // Releasing makes room again; ending a session forgets what it held.
  EXPECT_EQ(pool->EndSession(1), 3 * kChunk);
  EXPECT_TRUE(pool->Acquire(2, 3 * kChunk).ok());
  EXPECT_FALSE(pool->Acquire(2, kChunk).ok());

  // Cleared: the tenant holds what the pool has room for.
  pool->SetTenantQuota("pod:a", std::nullopt);
  EXPECT_TRUE(pool->Acquire(2, 4 * kChunk).ok());
}

TEST_F(NodePoolTest, DefaultTenantQuotaCoversTenantsWithoutTheirOwn) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 500, 1, "uid:500").ok());
  ASSERT_TRUE(pool->AddSession(2, 501, 2, "uid:501").ok());
  pool->SetDefaultTenantQuota(2 * kChunk);
  pool->SetTenantQuota("uid:501", 6 * kChunk);  // its own overrides it
  ASSERT_TRUE(pool->Acquire(1, 2 * kChunk).ok());
  absl::Status s = pool->Acquire(1, kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "tenant uid:500 quota exceeded: its sessions hold 4.00 MiB, asks "
            "2.00 MiB, quota 4.00 MiB");
  ASSERT_TRUE(pool->Acquire(2, 6 * kChunk).ok());
  EXPECT_FALSE(pool->Acquire(2, kChunk).ok());

  // Its own quota cleared, the default covers the tenant again.
  pool->SetTenantQuota("uid:501", std::nullopt);
  s = pool->Acquire(2, kChunk).status();
  EXPECT_THAT(s.message(), HasSubstr("tenant uid:501 quota exceeded"));
  EXPECT_THAT(s.message(), HasSubstr("quota 4.00 MiB"));
  // No default: nothing caps either.
  pool->SetDefaultTenantQuota(std::nullopt);
  EXPECT_TRUE(pool->Acquire(1, kChunk).ok());
  EXPECT_TRUE(pool->Acquire(2, kChunk).ok());
}

TEST_F(NodePoolTest, UidAndTenantQuotasAreEachChecked) {
  auto pool = MakePool(16);
  ASSERT_TRUE(pool->AddSession(1, 500, 1, "uid:500").ok());
  pool->SetUidQuota(500, 4 * kChunk);
  pool->SetTenantQuota("uid:500", 2 * kChunk);
  ASSERT_TRUE(pool->Acquire(1, 2 * kChunk).ok());
  EXPECT_THAT(pool->Acquire(1, kChunk).status().message(),
              HasSubstr("tenant uid:500 quota exceeded"));
  pool->SetTenantQuota("uid:500", 8 * kChunk);
  ASSERT_TRUE(pool->Acquire(1, 2 * kChunk).ok());
  EXPECT_THAT(pool->Acquire(1, kChunk).status().message(),
              HasSubstr("uid quota exceeded"));
}

TEST_F(NodePoolTest, OnlyTheGrantsPidClaimsAndOnlyOnce) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 100, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, kChunk);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->token.size(), 32u);  // 128 random bits, hex
  EXPECT_EQ(g->token.find_first_not_of("0123456789abcdef"), std::string::npos);
  absl::StatusOr<Grant> g2 = pool->Acquire(1, kChunk);
  ASSERT_TRUE(g2.ok());
  EXPECT_NE(g->token, g2->token);

  absl::Status wrong = ClaimAll(*pool, g->token, 200).status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(wrong.message(),
            "the claim token was granted to another process; pid 200 may "
            "not claim it");
  absl::StatusOr<std::vector<ChunkFd>> mine = ClaimAll(*pool, g->token, 100);
  ASSERT_TRUE(mine.ok()) << mine.status();  // survived the wrong pid
  EXPECT_EQ(mine->size(), 1u);
  absl::Status used = ClaimAll(*pool, g->token, 100).status();
  EXPECT_EQ(used.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(used.message(), HasSubstr("unknown, used or expired"));
  EXPECT_EQ(ClaimAll(*pool, "00000000000000000000000000000000", 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ClaimAll(*pool, "", 100).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, ExpiredTokensGiveTheirChunksBackToTheCache) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 100, "node").ok());
  absl::StatusOr<Grant> early = pool->Acquire(1, kChunk);
  absl::StatusOr<Grant> late = pool->Acquire(1, kChunk);
  ASSERT_TRUE(early.ok() && late.ok());
  now_ += absl::Seconds(29);
  EXPECT_TRUE(ClaimAll(*pool, early->token, 100).ok());
  now_ += absl::Seconds(1);  // 30 s: the default lifetime is over
  EXPECT_EQ(ClaimAll(*pool, late->token, 100).status().code(),
            absl::StatusCode::kNotFound);
  // Nobody can map the unclaimed chunk: it is not the session's any more.
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(1).bytes, kChunk);
  EXPECT_EQ(stats.free_bytes, kChunk);
  EXPECT_EQ(pool->Release(1, late->chunk_ids).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(pool->Release(1, early->chunk_ids).ok());

  NodePool quick(&source_, {.capacity = 4 * kChunk,
                            .token_ttl = absl::Milliseconds(5),
                            .now = [this] { return now_; }});
  ASSERT_TRUE(quick.AddSession(1, 0, 100, "node").ok());
  absl::StatusOr<Grant> g = quick.Acquire(1, kChunk);
  now_ += absl::Milliseconds(5);
  EXPECT_EQ(ClaimAll(quick, g->token, 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(quick.Stats().in_use_bytes, 0u);
}

TEST_F(NodePoolTest, AnAbandonedGrantGoesBackOnce) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 100, "node").ok());
  absl::StatusOr<Grant> kept = pool->Acquire(1, kChunk);
  absl::StatusOr<Grant> given_up = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(kept.ok() && given_up.ok());
  EXPECT_EQ(pool->Abandon(given_up->token), 2 * kChunk);
  EXPECT_EQ(pool->Abandon(given_up->token), 0u);
  EXPECT_EQ(ClaimAll(*pool, given_up->token, 100).status().code(),
            absl::StatusCode::kNotFound);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(1).bytes, kChunk);
  EXPECT_EQ(stats.in_use_bytes, kChunk);
  EXPECT_EQ(stats.free_bytes, 2 * kChunk);
  // A grant whose chunks were released since is abandoned without effect.
  ASSERT_TRUE(pool->Release(1, kept->chunk_ids).ok());
  EXPECT_EQ(pool->Abandon(kept->token), 0u);
  EXPECT_EQ(pool->Abandon("no such token"), 0u);
  EXPECT_EQ(pool->Stats().in_use_bytes, 0u);
}

TEST_F(NodePoolTest, ClaimLeavesOutChunksReleasedSinceTheGrant) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[0]}).ok());
  ASSERT_TRUE(pool->Acquire(2, kChunk).ok());  // takes chunk_ids[0]
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, g->token, 1);
  ASSERT_TRUE(fds.ok());
  ASSERT_EQ(fds->size(), 1u);
  EXPECT_EQ((*fds)[0].id, g->chunk_ids[1]);
}

TEST_F(NodePoolTest, ReleaseOfAnotherSessionsChunkChangesNothing) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> mine = pool->Acquire(1, 2 * kChunk);
  absl::StatusOr<Grant> theirs = pool->Acquire(2, kChunk);
  const PoolStats before = pool->Stats();
  absl::Status s =
      pool->Release(1, {mine->chunk_ids[0], theirs->chunk_ids[0]});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            absl::StrCat("chunk ", theirs->chunk_ids[0],
                         " is not held by session 1; nothing was released"));
  EXPECT_EQ(pool->Release(1, {mine->chunk_ids[0], mine->chunk_ids[0]}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Release(1, {999}).code(), absl::StatusCode::kPermissionDenied);
  const PoolStats after = pool->Stats();
  EXPECT_EQ(after.sessions.at(1).bytes, 2 * kChunk);  // all or nothing
  EXPECT_EQ(after.sessions.at(2).bytes, kChunk);
  EXPECT_EQ(after.free_bytes, before.free_bytes);
  // Session 2 can still release its own; then it is free, not anyone's.
  ASSERT_TRUE(pool->Release(2, theirs->chunk_ids).ok());
  EXPECT_EQ(pool->Release(2, theirs->chunk_ids).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->Release(1, theirs->chunk_ids).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(pool->Release(1, mine->chunk_ids).ok());
}

TEST_F(NodePoolTest, EndSessionReturnsEverythingAndKillsItsTokens) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 7, 1, "node").ok());
  ASSERT_TRUE(pool->SetSessionQuota(1, 6 * kChunk));
  pool->SetUidQuota(7, 5 * kChunk);
  absl::StatusOr<Grant> g = pool->Acquire(1, 5 * kChunk);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(pool->EndSession(1), 5 * kChunk);
  EXPECT_EQ(pool->EndSession(1), 0u);
  EXPECT_EQ(ClaimAll(*pool, g->token, 1).status().code(),
            absl::StatusCode::kNotFound);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_EQ(stats.free_bytes, 5 * kChunk);
  EXPECT_EQ(stats.created_bytes, 5 * kChunk);  // kept, not closed
  EXPECT_THAT(stats.sessions, IsEmpty());
  // The id can start again; the uid's quota counts nothing of the old one.
  ASSERT_TRUE(pool->AddSession(1, 7, 2, "node").ok());
  EXPECT_FALSE(pool->Stats().sessions.at(1).quota.has_value());
  absl::StatusOr<Grant> again = pool->Acquire(1, 5 * kChunk);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->reused_chunks, 5u);
  EXPECT_THAT(again->chunk_ids, UnorderedElementsAreArray(g->chunk_ids));
  EXPECT_EQ(ClaimAll(*pool, again->token, 1).status().code(),
            absl::StatusCode::kPermissionDenied);  // bound to the new pid
}

TEST_F(NodePoolTest, TrimFreeClosesCachedChunksColdestFirst) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  const int fds_before = OpenFds();
  absl::StatusOr<Grant> g = pool->Acquire(1, 4 * kChunk);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(OpenFds(), fds_before + 4);  // one FD per live chunk
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[3]}).ok());  // coldest
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[0]}).ok());
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[1]}).ok());
  EXPECT_EQ(pool->TrimFree(2 * kChunk - 1), 2 * kChunk);  // whole chunks
  EXPECT_EQ(OpenFds(), fds_before + 2);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, kChunk);
  EXPECT_EQ(stats.created_bytes, 2 * kChunk);
  EXPECT_EQ(stats.in_use_bytes, kChunk);
  // The warmest stays cached and is what the next Acquire gets.
  absl::StatusOr<Grant> next = pool->Acquire(1, kChunk);
  EXPECT_EQ(next->chunk_ids, std::vector<uint64_t>{g->chunk_ids[1]});
  EXPECT_EQ(pool->TrimFree(100 * kChunk), 0u);  // nothing cached
  // Trimming makes room for new memory.
  EXPECT_TRUE(pool->Acquire(1, 6 * kChunk).ok());
  EXPECT_EQ(pool->Release(1, {g->chunk_ids[3]}).code(),
            absl::StatusCode::kPermissionDenied);  // gone
}

TEST_F(NodePoolTest, AnExpiredGrantTakesBackOnlyItsOwnChunks) {
  // A grant never claimed whose chunk its session released and then got
  // again through a new grant: when the old token expires, the chunk stays
  // the new grant's (it once went back to the cache, to be handed to a
  // second session while the first mapped it).
  auto pool = MakePool(1);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> old = pool->Acquire(1, kChunk);
  ASSERT_TRUE(pool->Release(1, old->chunk_ids).ok());
  now_ += absl::Minutes(1);  // the old token expires
  absl::StatusOr<Grant> again = pool->Acquire(1, kChunk);
  ASSERT_EQ(again->chunk_ids, old->chunk_ids);
  ASSERT_TRUE(ClaimAll(*pool, again->token, 1).ok());
  EXPECT_EQ(pool->Stats().in_use_bytes, kChunk);
  EXPECT_EQ(pool->Acquire(2, kChunk).status().code(),
            absl::StatusCode::kResourceExhausted);  // nothing to hand out
  EXPECT_TRUE(pool->Release(1, again->chunk_ids).ok());
}

TEST_F(NodePoolTest, TrimIdleGivesBackWhatWasNotReusedForTheDelay) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 4 * kChunk);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(ClaimAll(*pool, g->token, 1).ok());
  const TrimPolicy policy{.idle_after = absl::Minutes(5)};
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[0], g->chunk_ids[1]}).ok());
  now_ += absl::Minutes(3);
  ASSERT_TRUE(pool->Release(1, {g->chunk_ids[2]}).ok());
  EXPECT_EQ(pool->TrimIdle(policy), 0u);  // nothing idle for 5 minutes yet
  now_ += absl::Minutes(2);
  EXPECT_EQ(pool->TrimIdle(policy), 2 * kChunk);  // the two freed first
  EXPECT_EQ(pool->Stats().free_bytes, kChunk);
  now_ += absl::Minutes(3);
  EXPECT_EQ(pool->TrimIdle(policy), kChunk);
  // Held chunks are never trimmed, however long they are held.
  EXPECT_EQ(pool->Stats().in_use_bytes, kChunk);
  EXPECT_EQ(pool->Stats().created_bytes, kChunk);
  EXPECT_EQ(pool->Stats().trimmed_bytes_total, 3 * kChunk);
}

TEST_F(NodePoolTest, ReuseRestartsTheIdleClock) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, kChunk);
  ASSERT_TRUE(pool->Release(1, g->chunk_ids).ok());
  now_ += absl::Minutes(4);
  absl::StatusOr<Grant> again = pool->Acquire(1, kChunk);  // reused
  ASSERT_EQ(again->reused_chunks, 1u);
  ASSERT_TRUE(ClaimAll(*pool, again->token, 1).ok());
  ASSERT_EQ(pool->Release(1, again->chunk_ids), absl::OkStatus());
  now_ += absl::Minutes(4);
  EXPECT_EQ(pool->TrimIdle({.idle_after = absl::Minutes(5)}), 0u);
}

TEST_F(NodePoolTest, TrimIdleKeepsTheCacheUnderTheHighWater) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, 6 * kChunk);
  ASSERT_TRUE(pool->Release(1, g->chunk_ids).ok());
  EXPECT_EQ(pool->TrimIdle({.high_water = 2 * kChunk}), 4 * kChunk);
  EXPECT_EQ(pool->Stats().free_bytes, 2 * kChunk);
  // The warmest stay: the last two released.
  absl::StatusOr<Grant> next = pool->Acquire(1, 2 * kChunk);
  EXPECT_THAT(next->chunk_ids,
              UnorderedElementsAre(g->chunk_ids[4], g->chunk_ids[5]));
  EXPECT_EQ(next->reused_chunks, 2u);
}

TEST_F(NodePoolTest, AClaimedFdOutlivesTheChunk) {
  auto pool = MakePool(2);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> g = pool->Acquire(1, kChunk);
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, g->token, 1);
  ASSERT_TRUE(fds.ok());
  ASSERT_TRUE(pool->Release(1, g->chunk_ids).ok());
  ASSERT_EQ(pool->TrimFree(kChunk), kChunk);
  char* mem = Map((*fds)[0]);  // the caller's dup() still maps
  mem[0] = 'x';
  munmap(mem, kChunk);
}

TEST_F(NodePoolTest, AFailingSourceTakesNothingAndKeepsWhatItCreated) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[0]}).ok());  // 1 cached
  source_.fail_after = 4;  // 2 more chunks, then out of memory
  absl::Status s = pool->Acquire(2, 5 * kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "creating chunk 3 of 4 from the test source: the device is out of "
            "memory");
  // The device is full below the pool's capacity: a shortage of the two
  // chunks it could not make, which other sessions' caches could cover.
  EXPECT_TRUE(IsNodeShortage(s));
  EXPECT_EQ(ShortfallBytes(s), 2 * kChunk);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.sessions.at(2).bytes, 0u);
  EXPECT_EQ(stats.sessions.at(1).bytes, kChunk);
  EXPECT_EQ(stats.free_bytes, 3 * kChunk);  // the cached one + 2 new
  EXPECT_EQ(stats.created_bytes, 4 * kChunk);
  EXPECT_EQ(stats.chunks_reused_total, 0u);
  EXPECT_EQ(stats.creating_bytes, 0u);
  source_.fail_after = -1;
  absl::StatusOr<Grant> b = pool->Acquire(2, 5 * kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->reused_chunks, 3u);
}

// The device fills before the capacity: a chunk of a size the cache does
// not hold is made by giving the cache's chunks of other sizes back to the
// device, as when the capacity is full.
TEST(NodePoolDeviceTest, AFullDeviceTrimsTheCacheOfOtherSizesToCreate) {
  FullDeviceSource source(8 * kChunk);
  NodePool pool(&source, NodePool::Options{.capacity = 64 * kChunk,
                                           .chunk_classes = DefaultChunkClasses(kChunk)});
  ASSERT_TRUE(pool.AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> big = pool.Acquire(1, 8 * kChunk);
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(big->chunk_sizes, (std::vector<uint64_t>{8 * kChunk}));
  ASSERT_TRUE(pool.Release(1, big->chunk_ids).ok());  // cached whole
  absl::StatusOr<Grant> small = pool.Acquire(1, kChunk);
  ASSERT_TRUE(small.ok()) << small.status();
  const PoolStats stats = pool.Stats();
  EXPECT_EQ(stats.trimmed_bytes_total, 8 * kChunk);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.sessions.at(1).bytes, kChunk);
  // What the device cannot hold even with the cache given back is a
  // shortage, as before.
  absl::Status over = pool.Acquire(1, 8 * kChunk).status();
  EXPECT_TRUE(IsNodeShortage(over)) << over;
}

TEST_F(NodePoolTest, CreationRunsOutsideTheLockAndReservesCapacity) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> cached = pool->Acquire(2, kChunk);
  ASSERT_TRUE(pool->Release(2, cached->chunk_ids).ok());
  absl::Notification gate;
  source_.gate = &gate;
  absl::StatusOr<Grant> slow;
  std::thread acquirer([&] { slow = pool->Acquire(1, 3 * kChunk); });
  source_.entered.WaitForNotification();
  // While session 1's chunks are being created, the pool answers...
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.creating_bytes, 2 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 3 * kChunk);
  // ...its reserved chunk is not releasable yet, and the capacity that is
  // being created is not given out twice.
  EXPECT_EQ(pool->Release(1, cached->chunk_ids).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ShortfallBytes(pool->Acquire(2, 2 * kChunk).status()), kChunk);
  source_.gate = nullptr;
  gate.Notify();
  acquirer.join();
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->reused_chunks, 1u);
  EXPECT_EQ(slow->chunk_ids.size(), 3u);
  EXPECT_TRUE(ClaimAll(*pool, slow->token, 1).ok());
  stats = pool->Stats();
  EXPECT_EQ(stats.creating_bytes, 0u);
  EXPECT_EQ(stats.in_use_bytes, 3 * kChunk);
}

TEST_F(NodePoolTest, EndingASessionMidAcquireAbortsItAndCachesTheChunks) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::Notification gate;
  source_.gate = &gate;
  absl::StatusOr<Grant> slow;
  std::thread acquirer([&] { slow = pool->Acquire(1, 2 * kChunk); });
  source_.entered.WaitForNotification();
  EXPECT_EQ(pool->EndSession(1), 0u);  // nothing created yet
  ASSERT_TRUE(pool->AddSession(1, 0, 5, "node").ok());  // a new session, same id
  source_.gate = nullptr;
  gate.Notify();
  acquirer.join();
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kAborted);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, 2 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 0u);
  EXPECT_EQ(stats.creating_bytes, 0u);
}

TEST_F(NodePoolTest, TheSmallestClassIsTheSourcesGranularity) {
  // Sizes that are no multiple of it are dropped, the granularity added.
  auto pool = MakePool(1, {8 * kChunk, kChunk + 4096, 2 * kChunk, 8 * kChunk});
  EXPECT_THAT(pool->chunk_classes(),
              ::testing::ElementsAre(kChunk, 2 * kChunk, 8 * kChunk));
  EXPECT_EQ(pool->chunk_bytes(), kChunk);
  EXPECT_THAT(MakePool(1)->chunk_classes(), ::testing::ElementsAre(kChunk));
}

TEST_F(NodePoolTest, ARequestIsSplitIntoClassesLargestFirst) {
  auto pool = MakePool(256, {kChunk, 8 * kChunk, 64 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  // 64 + 2 x 8 + 3 x 1 chunks' worth, the last one partly.
  absl::StatusOr<Grant> g =
      pool->Acquire(1, 64 * kChunk + 16 * kChunk + 3 * kChunk - 100);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bytes, 83 * kChunk);
  EXPECT_THAT(g->chunk_sizes,
              ::testing::ElementsAre(64 * kChunk, 8 * kChunk, 8 * kChunk,
                                     kChunk, kChunk, kChunk));
  EXPECT_EQ(g->chunk_ids.size(), 6u);
  EXPECT_EQ(source_.created.load(), 6);
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, g->token, 1);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 6u);
  for (size_t i = 0; i < fds->size(); ++i) {
    const ChunkFd& chunk = (*fds)[i];
    EXPECT_EQ(chunk.id, g->chunk_ids[i]);
    EXPECT_EQ(chunk.bytes, g->chunk_sizes[i]);
    // Each chunk is a file of its own size, mapped whole.
    struct stat st;
    ASSERT_EQ(fstat(chunk.fd.get(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), chunk.bytes);
  }
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, 83 * kChunk);
  EXPECT_EQ(stats.in_use_bytes, 83 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 83 * kChunk);
  EXPECT_EQ(stats.chunk_bytes, kChunk);
}

TEST_F(NodePoolTest, MaxChunkBytesCapsTheClasses) {
  auto pool = MakePool(64, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> small = pool->Acquire(1, 16 * kChunk, kChunk);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->chunk_sizes, std::vector<uint64_t>(16, kChunk));
  // Below the smallest class: the smallest.
  absl::StatusOr<Grant> tiny = pool->Acquire(1, 2 * kChunk, 4096);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->chunk_sizes, std::vector<uint64_t>(2, kChunk));
  // Between two classes: the lower one.
  absl::StatusOr<Grant> capped = pool->Acquire(1, 16 * kChunk, 10 * kChunk);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_THAT(capped->chunk_sizes,
              ::testing::ElementsAre(8 * kChunk, 8 * kChunk));
}

TEST_F(NodePoolTest, CachedChunksServeRequestsOfTheirClass) {
  auto pool = MakePool(64, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, 17 * kChunk);  // 8 + 8 + 1
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  // 9 chunks' worth: a cached 8 and the cached 1; nothing new.
  absl::StatusOr<Grant> b = pool->Acquire(2, 9 * kChunk);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->reused_chunks, 2u);
  EXPECT_THAT(b->chunk_sizes, ::testing::ElementsAre(8 * kChunk, kChunk));
  EXPECT_EQ(source_.created.load(), 3);
  // Another 2: one more small chunk is created, the cached 8 stays cached.
  absl::StatusOr<Grant> c = pool->Acquire(2, 2 * kChunk);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->reused_chunks, 0u);
  EXPECT_EQ(source_.created.load(), 5);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, 8 * kChunk);
  EXPECT_EQ(stats.sessions.at(2).bytes, 11 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 0u);
  EXPECT_EQ(stats.chunks_reused_total, 2u);
}

TEST_F(NodePoolTest, ANeedForOneClassTrimsCachedChunksOfAnotherColdestFirst) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  // The whole capacity as small chunks, all cached: cold ones first.
  absl::StatusOr<Grant> cold = pool->Acquire(1, 10 * kChunk, kChunk);
  absl::StatusOr<Grant> warm = pool->Acquire(1, 6 * kChunk, kChunk);
  ASSERT_TRUE(cold.ok() && warm.ok());
  ASSERT_TRUE(pool->Release(1, cold->chunk_ids).ok());
  now_ += absl::Seconds(1);
  ASSERT_TRUE(pool->Release(1, warm->chunk_ids).ok());
  EXPECT_EQ(pool->Stats().free_bytes, 16 * kChunk);

  // One 8-chunk: no room and none cached, so 8 cold small ones go.
  absl::StatusOr<Grant> big = pool->Acquire(2, 8 * kChunk);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_THAT(big->chunk_sizes, ::testing::ElementsAre(8 * kChunk));
  EXPECT_EQ(big->reused_chunks, 0u);
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.trimmed_bytes_total, 8 * kChunk);
  EXPECT_EQ(stats.created_bytes, 16 * kChunk);
  EXPECT_EQ(stats.free_bytes, 8 * kChunk);
  // The warm ones and the 2 coldest-but-spared stay, reused next.
  absl::StatusOr<Grant> again = pool->Acquire(2, 8 * kChunk, kChunk);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->reused_chunks, 8u);
  std::vector<uint64_t> spared(cold->chunk_ids.begin() + 8,
                               cold->chunk_ids.end());
  spared.insert(spared.end(), warm->chunk_ids.begin(), warm->chunk_ids.end());
  EXPECT_THAT(again->chunk_ids, UnorderedElementsAreArray(spared));

  // And back: small chunks trim the cached big one.
  ASSERT_TRUE(pool->Release(2, big->chunk_ids).ok());
  ASSERT_TRUE(pool->Release(2, again->chunk_ids).ok());
  ASSERT_TRUE(pool->Acquire(2, 8 * kChunk, kChunk).ok());  // the cached 8 small
  absl::StatusOr<Grant> small = pool->Acquire(2, 3 * kChunk, kChunk);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->reused_chunks, 0u);
  stats = pool->Stats();
  EXPECT_EQ(stats.trimmed_bytes_total, 16 * kChunk);
  EXPECT_EQ(stats.created_bytes, 11 * kChunk);  // 8 + 3 small live
  EXPECT_EQ(stats.free_bytes, 0u);
}

TEST_F(NodePoolTest, TheNodeIsShortOnlyBeyondRoomPlusEveryCachedByte) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 2, "node").ok());
  absl::StatusOr<Grant> held = pool->Acquire(1, 8 * kChunk);  // one 8
  absl::StatusOr<Grant> cached = pool->Acquire(1, 4 * kChunk);
  ASSERT_TRUE(held.ok() && cached.ok());
  ASSERT_TRUE(pool->Release(1, cached->chunk_ids).ok());
  // Room for 4, 4 cached: 9 is short by 1, whatever the classes.
  absl::Status s = pool->Acquire(2, 9 * kChunk).status();
  EXPECT_TRUE(IsNodeShortage(s)) << s;
  EXPECT_EQ(ShortfallBytes(s), kChunk);
  EXPECT_EQ(pool->Stats().free_bytes, 4 * kChunk);  // nothing trimmed
  EXPECT_EQ(pool->Stats().trimmed_bytes_total, 0u);
  // 8 fits: the 4 cached small ones make room for one 8-chunk.
  absl::StatusOr<Grant> fits = pool->Acquire(2, 8 * kChunk);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_THAT(fits->chunk_sizes, ::testing::ElementsAre(8 * kChunk));
  EXPECT_EQ(pool->Stats().created_bytes, 16 * kChunk);
}

TEST_F(NodePoolTest, TrimsAndReleasesCountEachChunksOwnBytes) {
  auto pool = MakePool(64, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  absl::StatusOr<Grant> big = pool->Acquire(1, 8 * kChunk);
  absl::StatusOr<Grant> small = pool->Acquire(1, 2 * kChunk);
  ASSERT_TRUE(big.ok() && small.ok());
  ASSERT_TRUE(pool->Release(1, big->chunk_ids).ok());
  EXPECT_EQ(pool->Stats().sessions.at(1).bytes, 2 * kChunk);
  now_ += absl::Seconds(10);
  ASSERT_TRUE(pool->Release(1, {small->chunk_ids[0]}).ok());
  // The coldest is the big one: asking for 1 chunk's bytes destroys 8.
  EXPECT_EQ(pool->TrimFree(kChunk), 8 * kChunk);
  EXPECT_EQ(pool->Stats().free_bytes, kChunk);
  // The high water counts bytes.
  absl::StatusOr<Grant> again = pool->Acquire(1, 8 * kChunk);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(pool->Release(1, again->chunk_ids).ok());
  EXPECT_EQ(pool->Stats().free_bytes, 9 * kChunk);
  EXPECT_EQ(pool->TrimIdle({.high_water = 8 * kChunk}), kChunk);  // coldest
  EXPECT_EQ(pool->Stats().free_bytes, 8 * kChunk);
  // EndSession returns the session's bytes, chunk sizes summed.
  EXPECT_EQ(pool->EndSession(1), kChunk);
  EXPECT_EQ(pool->Stats().free_bytes, 9 * kChunk);
  EXPECT_EQ(pool->TrimIdle({.idle_after = absl::ZeroDuration()}), 9 * kChunk);
  EXPECT_EQ(pool->Stats().created_bytes, 0u);
}

TEST_F(NodePoolTest, AFailedCreationCachesWhatWasCreatedAtItsSize) {
  auto pool = MakePool(64, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 1, "node").ok());
  source_.fail_after = 1;  // the 8-chunk, then out of memory
  absl::Status s = pool->Acquire(1, 9 * kChunk).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("creating chunk 2 of 2"));
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, 8 * kChunk);
  EXPECT_EQ(stats.created_bytes, 8 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 0u);
  source_.fail_after = -1;
  absl::StatusOr<Grant> g = pool->Acquire(1, 9 * kChunk);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->reused_chunks, 1u);
  EXPECT_THAT(g->chunk_sizes, ::testing::ElementsAre(8 * kChunk, kChunk));
}

// Sessions acquiring, releasing and ending at once, with chunks of the
// smallest size only and with size classes (where Acquires trim each
// other's cached chunks to make room).
class ConcurrentNodePoolTest
    : public NodePoolTest,
      public ::testing::WithParamInterface<std::vector<uint64_t>> {};

INSTANTIATE_TEST_SUITE_P(
    Classes, ConcurrentNodePoolTest,
    ::testing::Values(std::vector<uint64_t>{},
                      std::vector<uint64_t>{kChunk, 2 * kChunk, 4 * kChunk}));

TEST_P(ConcurrentNodePoolTest, ConcurrentSessionsNeverShareAChunk) {
  constexpr int kThreads = 4;
  constexpr uint64_t kCapacity = 24;
  auto pool = MakePool(kCapacity, GetParam());
  // owner[chunk id]: which session the test thinks holds it.
  std::vector<std::atomic<uint64_t>> owner(1 << 16);
  std::atomic<int> overlaps{0}, shortages{0}, grants{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(t);
      uint64_t session = t + 1;
      const pid_t pid = 100 + t;
      EXPECT_TRUE(pool->AddSession(session, 1000 + t % 2, pid, "node").ok());
      std::vector<uint64_t> held;
      for (int i = 0; i < 400; ++i) {
        const int action = random() % 10;
        if (action < 5) {
          absl::StatusOr<Grant> g =
              pool->Acquire(session, (1 + random() % 7) * kChunk);
          if (!g.ok()) {
            EXPECT_TRUE(IsNodeShortage(g.status())) << g.status();
            ++shortages;
            continue;
          }
          ++grants;
          for (uint64_t id : g->chunk_ids) {
            uint64_t expected = 0;
            if (id >= owner.size() ||
                !owner[id].compare_exchange_strong(expected, session)) {
              ++overlaps;
            }
            held.push_back(id);
          }
          absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, g->token, pid);
          EXPECT_TRUE(fds.ok()) << fds.status();
          if (fds.ok()) {
            EXPECT_EQ(fds->size(), g->chunk_ids.size());
          }
        } else if (action < 9 && !held.empty()) {
          const size_t n = 1 + random() % held.size();
          std::vector<uint64_t> some(held.end() - n, held.end());
          held.resize(held.size() - n);
          for (uint64_t id : some) owner[id] = 0;
          EXPECT_TRUE(pool->Release(session, some).ok());
        } else if (action == 9) {
          for (uint64_t id : held) owner[id] = 0;
          held.clear();
          pool->EndSession(session);
          session += kThreads;  // a new session of this thread
          EXPECT_TRUE(pool->AddSession(session, 1000 + t % 2, pid, "node").ok());
          if (random() % 2) pool->TrimFree(kChunk);
        }
        const PoolStats stats = pool->Stats();
        EXPECT_LE(stats.created_bytes + stats.creating_bytes, stats.capacity);
      }
      for (uint64_t id : held) owner[id] = 0;
      pool->EndSession(session);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(grants.load(), 0);
  const PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_EQ(stats.creating_bytes, 0u);
  EXPECT_EQ(stats.free_bytes, stats.created_bytes);
  EXPECT_LE(stats.created_bytes, stats.capacity);
  EXPECT_GT(stats.chunks_reused_total, 0u);
  EXPECT_THAT(stats.sessions, IsEmpty());
}

// ------------------------------------------------ adoption after a restart

// What a client holds from a daemon: chunk ids with their FDs.
struct Held {
  std::vector<uint64_t> ids;
  std::vector<ChunkFd> fds;
};

Held Take(NodePool& pool, SessionId session, pid_t pid, uint64_t chunks) {
  absl::StatusOr<Grant> grant = pool.Acquire(session, chunks * kChunk);
  EXPECT_TRUE(grant.ok()) << grant.status();
  if (!grant.ok()) return {};
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(pool, grant->token, pid);
  EXPECT_TRUE(fds.ok()) << fds.status();
  return {.ids = grant->chunk_ids, .fds = fds.ok() ? std::move(*fds) : std::vector<ChunkFd>{}};
}

// A client's declaration of `held`, each chunk proven with a dup of its FD.
std::vector<DeclaredChunk> Declare(const Held& held) {
  std::vector<DeclaredChunk> declared;
  for (const ChunkFd& chunk : held.fds) {
    declared.push_back({.id = chunk.id,
                        .bytes = chunk.bytes,
                        .fd = UniqueFd(dup(chunk.fd.get())),
                        .offset = chunk.offset});
  }
  return declared;
}

std::vector<uint64_t> RefusedIds(const AdoptOutcome& outcome) {
  std::vector<uint64_t> ids;
  for (const auto& [id, why] : outcome.refused) ids.push_back(id);
  return ids;
}

TEST_F(NodePoolTest, ARestartedPoolAdoptsWhatSessionsProveTheyHold) {
  Held one, two;
  {
    NodePool before(&source_, {.capacity = 8 * kChunk, .chunk_id_epoch = 1});
    ASSERT_TRUE(before.AddSession(1, 1000, 11, "node").ok());
    ASSERT_TRUE(before.AddSession(2, 1001, 22, "node").ok());
    one = Take(before, 1, 11, 3);
    two = Take(before, 2, 22, 2);
    std::strcpy(Map(one.fds[0]), "kept across the restart");
  }  // the daemon dies; its clients keep their chunks
  NodePool after(&source_, {.capacity = 8 * kChunk, .chunk_id_epoch = 2});
  ASSERT_TRUE(after.AddSession(7, 1000, 11, "node").ok());
  ASSERT_TRUE(after.AddSession(8, 1001, 22, "node").ok());
  absl::StatusOr<AdoptOutcome> a = after.Adopt(7, Declare(one));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->adopted, one.ids);
  EXPECT_EQ(a->adopted_bytes, 3 * kChunk);
  EXPECT_THAT(a->refused, IsEmpty());
  absl::StatusOr<AdoptOutcome> b = after.Adopt(8, Declare(two));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->adopted, two.ids);

  PoolStats stats = after.Stats();
  EXPECT_EQ(stats.in_use_bytes, 5 * kChunk);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.adopted_bytes_total, 5 * kChunk);
  EXPECT_EQ(stats.sessions.at(7).bytes, 3 * kChunk);
  EXPECT_EQ(stats.sessions.at(8).bytes, 2 * kChunk);
  // They count against the capacity: 3 chunks left, not 8.
  ASSERT_TRUE(after.AddSession(9, 1002, 33, "node").ok());
  absl::StatusOr<Grant> too_much = after.Acquire(9, 4 * kChunk);
  EXPECT_TRUE(IsNodeShortage(too_much.status())) << too_much.status();
  absl::StatusOr<Grant> fits = after.Acquire(9, 3 * kChunk);
  ASSERT_TRUE(fits.ok()) << fits.status();
  for (uint64_t id : fits->chunk_ids) {
    EXPECT_THAT(one.ids, Not(Contains(id)));
    EXPECT_THAT(two.ids, Not(Contains(id)));
    EXPECT_EQ(id >> 40, 2u);  // this pool's epoch
  }
  // Released, an adopted chunk is cached memory like any other: the next
  // session gets the same bytes.
  ASSERT_TRUE(after.Release(7, {one.ids[0]}).ok());
  ASSERT_TRUE(after.Release(9, fits->chunk_ids).ok());
  Held next = Take(after, 9, 33, 4);
  EXPECT_THAT(next.ids, Contains(one.ids[0]));
  for (const ChunkFd& chunk : next.fds) {
    if (chunk.id == one.ids[0]) {
      EXPECT_STREQ(Map(chunk), "kept across the restart");
    }
  }
  EXPECT_EQ(after.Stats().chunks_created_total, 3u);
}

TEST_F(NodePoolTest, ConflictingOrUnprovenDeclarationsAreRefused) {
  Held one;
  {
    NodePool before(&source_, {.capacity = 8 * kChunk, .chunk_id_epoch = 1});
    ASSERT_TRUE(before.AddSession(1, 1000, 11, "node").ok());
    one = Take(before, 1, 11, 3);
  }
  NodePool after(&source_, {.capacity = 8 * kChunk, .chunk_id_epoch = 2});
  ASSERT_TRUE(after.AddSession(7, 1000, 11, "node").ok());
  ASSERT_TRUE(after.AddSession(8, 1001, 22, "node").ok());
  ASSERT_TRUE(after.Adopt(7, Declare(one)).ok());

  std::vector<DeclaredChunk> claims;
  // Session 7's chunk, by id and with its very FD.
  claims.push_back(std::move(Declare(one)[0]));
  // Session 7's memory under an id of its own.
  DeclaredChunk alias = std::move(Declare(one)[1]);
  alias.id = 999;
  claims.push_back(std::move(alias));
  // No FD; a file that is no daemon chunk; a wrong size; id 0; twice.
  claims.push_back({.id = 1000, .bytes = kChunk});
  UniqueFd own(memfd_create("not-a-chunk", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(own.get(), kChunk), 0);
  claims.push_back({.id = 1001, .bytes = kChunk, .fd = std::move(own)});
  absl::StatusOr<ChunkMemory> big = MemfdChunkSource(kChunk).CreateChunk(2 * kChunk);
  ASSERT_TRUE(big.ok());
  claims.push_back(
      {.id = 1002, .bytes = kChunk, .fd = UniqueFd(dup(big->file->get()))});
  claims.push_back({.id = 1003, .bytes = 3 * kChunk});
  claims.push_back({.id = 0, .bytes = kChunk});
  absl::StatusOr<ChunkMemory> fresh = source_.memfd.CreateChunk(kChunk);
  ASSERT_TRUE(fresh.ok());
  claims.push_back({.id = 1004, .bytes = kChunk, .fd = UniqueFd(dup(fresh->file->get()))});
  claims.push_back({.id = 1004, .bytes = kChunk, .fd = UniqueFd(dup(fresh->file->get()))});

  absl::StatusOr<AdoptOutcome> got = after.Adopt(8, std::move(claims));
  ASSERT_TRUE(got.ok()) << got.status();
  // Only the one proven chunk nobody has.
  EXPECT_EQ(got->adopted, std::vector<uint64_t>{1004});
  EXPECT_THAT(RefusedIds(*got), UnorderedElementsAre(one.ids[0], 999, 1000, 1001,
                                                    1002, 1003, 0, 1004));
  auto why = [&](uint64_t id) {
    for (const auto& [refused, reason] : got->refused) {
      if (refused == id) return reason;
    }
    return std::string();
  };
  EXPECT_THAT(why(one.ids[0]), HasSubstr("session 7 holds"));
  EXPECT_THAT(why(999), HasSubstr(absl::StrCat("chunk ", one.ids[1])));
  EXPECT_THAT(why(1000), HasSubstr("no FD"));
  EXPECT_THAT(why(1001), HasSubstr("not a memfd the allocd daemon made"));
  EXPECT_THAT(why(1002), HasSubstr("bytes"));
  EXPECT_THAT(why(1003), HasSubstr("this pool's chunks are"));
  EXPECT_THAT(why(0), HasSubstr("id 0"));
  EXPECT_THAT(why(1004), HasSubstr("twice"));
  PoolStats stats = after.Stats();
  EXPECT_EQ(stats.sessions.at(7).bytes, 3 * kChunk);
  EXPECT_EQ(stats.sessions.at(8).bytes, kChunk);
  EXPECT_EQ(stats.in_use_bytes, 4 * kChunk);
  // Session 7 cannot release what it did not get, nor 8 what 7 holds.
  EXPECT_EQ(after.Release(8, {one.ids[0]}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(after.Adopt(42, {}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodePoolTest, ChunksTakenOnTheClientsWordLeaveThePoolWhenReleased) {
  source_.proves = false;  // as on a GPU
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "node").ok());
  ASSERT_TRUE(pool->SetSessionQuota(1, 4 * kChunk));
  std::vector<DeclaredChunk> declared;
  for (uint64_t id : {5, 6, 7}) declared.push_back({.id = id, .bytes = kChunk});
  absl::StatusOr<AdoptOutcome> got = pool->Adopt(1, std::move(declared));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->adopted, (std::vector<uint64_t>{5, 6, 7}));
  EXPECT_EQ(pool->Stats().sessions.at(1).bytes, 3 * kChunk);
  // They count against the session's quota.
  EXPECT_FALSE(pool->Acquire(1, 2 * kChunk).ok());
  ASSERT_TRUE(pool->Release(1, {5, 6}).ok());
  // Nothing cached: the pool never had their memory to give again.
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.created_bytes, kChunk);
  EXPECT_EQ(pool->EndSession(1), kChunk);
  EXPECT_EQ(pool->Stats().created_bytes, 0u);
  ASSERT_TRUE(pool->AddSession(2, 1000, 22, "node").ok());
  absl::StatusOr<Grant> grant = pool->Acquire(2, kChunk);
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->reused_chunks, 0u);
}

TEST_F(NodePoolTest, AdoptedChunksCountAgainstTheCapacityAndNoIdIsReused) {
  source_.proves = false;
  auto pool = MakePool(2);  // epoch 0: ids 1, 2, ...
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "node").ok());
  std::vector<DeclaredChunk> declared;
  for (uint64_t id : {1, 2, 3}) declared.push_back({.id = id, .bytes = kChunk});
  absl::StatusOr<AdoptOutcome> got = pool->Adopt(1, std::move(declared));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->adopted_bytes, 2 * kChunk);  // as far as the capacity goes
  ASSERT_EQ(got->refused.size(), 1u);
  EXPECT_EQ(got->refused[0].first, 3u);
  EXPECT_THAT(got->refused[0].second, HasSubstr("of its capacity 4.00 MiB"));
  EXPECT_EQ(pool->Stats().in_use_bytes, 2 * kChunk);
  ASSERT_TRUE(pool->AddSession(2, 1000, 22, "node").ok());
  EXPECT_TRUE(IsNodeShortage(pool->Acquire(2, kChunk).status()));
  ASSERT_TRUE(pool->Release(1, {2}).ok());
  absl::StatusOr<Grant> grant = pool->Acquire(2, kChunk);
  ASSERT_TRUE(grant.ok()) << grant.status();
  // The pool's first id is 1, which session 1 still holds: never handed out.
  EXPECT_NE(grant->chunk_ids[0], 1u);
  EXPECT_EQ(pool->Stats().sessions.at(1).bytes, kChunk);
}

// ... and against every quota, as an Acquire does.
TEST_F(NodePoolTest, AdoptedChunksCountAgainstTheQuotas) {
  source_.proves = false;
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "uid:1000").ok());
  pool->SetTenantQuota("uid:1000", 2 * kChunk);
  std::vector<DeclaredChunk> declared;
  for (uint64_t id : {1, 2, 3}) declared.push_back({.id = id, .bytes = kChunk});
  absl::StatusOr<AdoptOutcome> got = pool->Adopt(1, std::move(declared));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->adopted, (std::vector<uint64_t>{1, 2}));
  ASSERT_EQ(got->refused.size(), 1u);
  EXPECT_THAT(got->refused[0].second,
              HasSubstr("tenant uid:1000 quota exceeded"));
  EXPECT_EQ(pool->Stats().sessions.at(1).bytes, 2 * kChunk);
}

// Chunks of the pool's size classes are adopted at their own sizes and
// counted in bytes as Acquire counts them; a size between classes is no
// chunk this pool makes.
TEST_F(NodePoolTest, DeclaredChunksKeepTheirSizeClasses) {
  const std::vector<uint64_t> classes = DefaultChunkClasses(kChunk);
  auto pool = MakePool(64, classes);
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "node").ok());
  std::vector<DeclaredChunk> declared;
  for (uint64_t bytes : {8 * kChunk, kChunk, 2 * kChunk}) {
    absl::StatusOr<ChunkMemory> memory = source_.memfd.CreateChunk(bytes);
    ASSERT_TRUE(memory.ok());
    declared.push_back({.id = 100 + bytes / kChunk,
                        .bytes = bytes,
                        .fd = UniqueFd(dup(memory->file->get()))});
  }
  absl::StatusOr<AdoptOutcome> got = pool->Adopt(1, std::move(declared));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->adopted, (std::vector<uint64_t>{108, 101}));
  EXPECT_EQ(got->adopted_bytes, 9 * kChunk);
  ASSERT_EQ(got->refused.size(), 1u);
  EXPECT_EQ(got->refused[0].first, 102u);
  EXPECT_THAT(got->refused[0].second, HasSubstr("16.00 MiB"));
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, 9 * kChunk);
  EXPECT_EQ(stats.in_use_bytes, 9 * kChunk);
  EXPECT_EQ(stats.sessions.at(1).bytes, 9 * kChunk);
  // Released, the 16 MiB chunk is cached at its size and serves the next
  // 16 MiB request whole.
  ASSERT_TRUE(pool->Release(1, {108}).ok());
  EXPECT_EQ(pool->Stats().free_bytes, 8 * kChunk);
  absl::StatusOr<Grant> grant = pool->Acquire(1, 8 * kChunk);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->chunk_ids, std::vector<uint64_t>{108});
  EXPECT_EQ(grant->chunk_sizes, std::vector<uint64_t>{8 * kChunk});
  EXPECT_EQ(grant->reused_chunks, 1u);
  EXPECT_EQ(pool->EndSession(1), 9 * kChunk);
  EXPECT_EQ(pool->Stats().free_bytes, 9 * kChunk);
}

// A chunk taken on the client's word (CUDA) has no memory in the pool: it
// cannot be shared, is never cached nor trimmed, and its bytes leave the
// pool's counters when released.
TEST_F(NodePoolTest, ChunksTakenOnTheClientsWordAreNeverSharedNorCached) {
  source_.proves = false;
  auto pool = MakePool(128, DefaultChunkClasses(kChunk));
  ASSERT_TRUE(pool->AddSession(1, 1000, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 1000, 22, "node").ok());
  std::vector<DeclaredChunk> declared;
  declared.push_back({.id = 5, .bytes = 64 * kChunk});
  declared.push_back({.id = 6, .bytes = kChunk});
  ASSERT_TRUE(pool->Adopt(1, std::move(declared)).ok());
  absl::StatusOr<Grant> own = pool->Acquire(1, kChunk);
  ASSERT_TRUE(own.ok());
  absl::StatusOr<std::string> share = pool->Share(1, {own->chunk_ids[0], 6});
  EXPECT_EQ(share.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(share.status().message(), HasSubstr("chunk 6"));
  // What the session acquired since can be shared as before.
  EXPECT_TRUE(pool->Share(1, own->chunk_ids).ok());
  EXPECT_EQ(pool->Stats().created_bytes, 66 * kChunk);
  EXPECT_EQ(pool->TrimFree(UINT64_MAX), 0u);
  ASSERT_TRUE(pool->Release(1, {5}).ok());
  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, 2 * kChunk);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.sessions.at(1).bytes, 2 * kChunk);
  // Nothing of it to reuse: a 128 MiB request creates a chunk.
  absl::StatusOr<Grant> big = pool->Acquire(2, 64 * kChunk);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->reused_chunks, 0u);
  EXPECT_NE(big->chunk_ids[0], 5u);
}

// What a client that makes its own chunks does: a memfd as the daemon's
// memfd source makes one, and an FD of it to give.
UniqueFd ClientMadeChunk(uint64_t bytes, const char* text) {
  MemfdChunkSource client{kChunk};
  absl::StatusOr<ChunkMemory> made = client.CreateChunk(bytes);
  EXPECT_TRUE(made.ok()) << made.status();
  char* p = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                    MAP_SHARED, made->file->get(), 0));
  std::strcpy(p, text);
  munmap(p, bytes);
  absl::StatusOr<UniqueFd> fd = DuplicateFd(made->file->get());
  EXPECT_TRUE(fd.ok());
  return *std::move(fd);
}

TEST_F(NodePoolTest, ChunksTheClientMakesAreCountedWithoutMemoryHere) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  absl::StatusOr<Grant> small = pool->Acquire(1, kChunk);
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(pool->Release(1, small->chunk_ids).ok());  // one 2 MiB cached

  absl::StatusOr<Grant> grant =
      pool->Acquire(1, 9 * kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(source_.created.load(), 1);  // the cached chunk's, no other
  EXPECT_EQ(grant->reused_chunks, 1u);
  EXPECT_EQ(grant->client_made, 1u);
  ASSERT_EQ(grant->chunk_ids.size(), 2u);
  EXPECT_EQ(grant->chunk_ids[0], small->chunk_ids[0]);  // the cached first
  EXPECT_EQ(grant->chunk_sizes, (std::vector<uint64_t>{kChunk, 8 * kChunk}));
  EXPECT_EQ(grant->bytes, 9 * kChunk);
  // The claim gives the cached chunk's FD only.
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, grant->token, 11);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 1u);
  EXPECT_EQ((*fds)[0].id, grant->chunk_ids[0]);

  PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, 9 * kChunk);  // counted against capacity
  EXPECT_EQ(stats.sessions.at(1).bytes, 9 * kChunk);
  EXPECT_EQ(stats.chunks_client_made_total, 1u);
  absl::StatusOr<Grant> over =
      pool->Acquire(1, 8 * kChunk, UINT64_MAX, /*client_creates=*/true);
  EXPECT_TRUE(IsNodeShortage(over.status())) << over.status();
  // No memory here to share until the client gives it.
  absl::StatusOr<std::string> share = pool->Share(1, grant->chunk_ids);
  EXPECT_EQ(share.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(share.status().message(),
              HasSubstr(absl::StrCat("chunk ", grant->chunk_ids[1])));
  // Released, it leaves the pool: nothing cached, nothing to trim.
  ASSERT_TRUE(pool->Release(1, {grant->chunk_ids[1]}).ok());
  stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, kChunk);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.sessions.at(1).bytes, kChunk);
}

TEST_F(NodePoolTest, MemoryTheClientGivesIsSharedAndCachedLikeACreatedChunk) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  ASSERT_TRUE(pool->AddSession(2, 0, 22, "node").ok());
  absl::StatusOr<Grant> grant =
      pool->Acquire(1, 9 * kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->client_made, 2u);
  EXPECT_EQ(source_.calls.load(), 0);
  absl::StatusOr<std::vector<ChunkFd>> none = ClaimAll(*pool, grant->token, 11);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(*none, IsEmpty());
  const uint64_t big = grant->chunk_ids[0], small = grant->chunk_ids[1];

  auto give = [&](SessionId id, std::vector<uint64_t> ids,
                  std::vector<UniqueFd> fds) {
    return pool->GiveMemory(id, ids, std::move(fds));
  };
  std::vector<UniqueFd> one;
  one.push_back(ClientMadeChunk(8 * kChunk, "big"));
  EXPECT_EQ(give(1, {big, small}, std::move(one)).code(),
            absl::StatusCode::kInvalidArgument);  // an FD short
  std::vector<UniqueFd> theirs;
  theirs.push_back(ClientMadeChunk(kChunk, "small"));
  EXPECT_EQ(give(2, {small}, std::move(theirs)).code(),
            absl::StatusCode::kPermissionDenied);  // not session 2's
  std::vector<UniqueFd> foreign;
  foreign.emplace_back(memfd_create("not-a-chunk", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(foreign[0].get(), kChunk), 0);
  absl::Status refused = give(1, {small}, std::move(foreign));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("chunk ", small)));
  std::vector<UniqueFd> wrong_size;
  wrong_size.push_back(ClientMadeChunk(kChunk, "small"));
  EXPECT_EQ(give(1, {big}, std::move(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
  // One memory for two chunks: nothing is taken.
  UniqueFd shared_memory = ClientMadeChunk(kChunk, "twice");
  std::vector<UniqueFd> twice;
  twice.push_back(*DuplicateFd(shared_memory.get()));
  std::vector<UniqueFd> again;
  again.push_back(std::move(shared_memory));
  ASSERT_TRUE(give(1, {small}, std::move(twice)).ok());
  absl::StatusOr<Grant> other =
      pool->Acquire(1, kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(other.ok());
  absl::Status duplicate = give(1, other->chunk_ids, std::move(again));
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.message(),
              HasSubstr(absl::StrCat("memory of chunk ", small)));
  // Given once: not twice.
  std::vector<UniqueFd> small_again;
  small_again.push_back(ClientMadeChunk(kChunk, "small"));
  EXPECT_EQ(give(1, {small}, std::move(small_again)).code(),
            absl::StatusCode::kFailedPrecondition);

  std::vector<UniqueFd> big_fd;
  big_fd.push_back(ClientMadeChunk(8 * kChunk, "the client's tensor"));
  ASSERT_TRUE(give(1, {big}, std::move(big_fd)).ok());
  absl::StatusOr<std::string> share = pool->Share(1, {big, small});
  ASSERT_TRUE(share.ok()) << share.status();
  absl::StatusOr<Grant> opened = pool->OpenShare(2, *share);
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<std::vector<ChunkFd>> seen = ClaimAll(*pool, opened->token, 22);
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_EQ(seen->size(), 2u);
  char* p = Map((*seen)[0]);
  EXPECT_STREQ(p, "the client's tensor");
  munmap(p, 8 * kChunk);
  ASSERT_TRUE(pool->CloseShare(2, *share).ok());

  // Released, given memory is cached and serves the next acquire.
  ASSERT_TRUE(pool->Release(1, {big, small}).ok());
  EXPECT_EQ(pool->Stats().free_bytes, 9 * kChunk);
  absl::StatusOr<Grant> next =
      pool->Acquire(2, 9 * kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->reused_chunks, 2u);
  EXPECT_EQ(next->client_made, 0u);
  EXPECT_EQ(source_.calls.load(), 0);
}

TEST_F(NodePoolTest, AReadAheadForAClientThatMakesChunksIsCachedFirstThenBudget) {
  auto pool = MakePool(16, {kChunk, 8 * kChunk});
  ASSERT_TRUE(pool->AddSession(1, 0, 11, "node").ok());
  absl::StatusOr<Grant> first = pool->Acquire(1, 9 * kChunk);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(pool->Release(1, first->chunk_ids).ok());  // one grant cached
  EXPECT_EQ(source_.created.load(), 2);

  // 16 chunks: 9 cached, 7 of room; grants of 9: the cached one, then none
  // made (7 < 9), and nothing destroyed for one.
  absl::StatusOr<Grant> ahead = pool->AcquireCached(
      1, 9 * kChunk, UINT64_MAX, /*max_count=*/3, /*client_creates=*/true);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_EQ(ahead->bytes, 9 * kChunk);
  EXPECT_EQ(ahead->client_made, 0u);
  ASSERT_TRUE(pool->Release(1, ahead->chunk_ids).ok());

  // Grants of three 2 MiB chunks: the cache holds one such chunk, not a
  // grant's three, so all are budget, as many as the room (7 chunks) holds.
  absl::StatusOr<Grant> budget = pool->AcquireCached(
      1, 3 * kChunk, UINT64_MAX, /*max_count=*/8, /*client_creates=*/true);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(budget->bytes, 6 * kChunk);  // 7 chunks of room: two grants
  EXPECT_EQ(budget->client_made, 6u);
  EXPECT_EQ(budget->reused_chunks, 0u);
  EXPECT_EQ(source_.created.load(), 2);  // nothing created, nothing destroyed
  EXPECT_EQ(pool->Stats().free_bytes, 9 * kChunk);
  absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(*pool, budget->token, 11);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_THAT(*fds, IsEmpty());
  // Without client_creates the same read-ahead gets nothing.
  absl::StatusOr<Grant> none =
      pool->AcquireCached(1, 3 * kChunk, UINT64_MAX, /*max_count=*/8);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->chunk_ids.empty());
}

}  // namespace
}  // namespace allocd
