// ChunkTable on its own: the cache's order and tenants, what counts
// against the capacity, chunks without memory, and the totals.
#include "server/pool/chunk_table.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/pool/memfd_chunk_source.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::Optional;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kChunk = uint64_t{2} << 20;

// The part alone, under a lock that stands for the pool's, on a clock the
// tests move, with memory from a memfd source.
class ChunkTableTest : public ::testing::Test {
 protected:
  // New memory of `bytes`.
  ChunkMemory Memory(uint64_t bytes = kChunk) {
    absl::StatusOr<ChunkMemory> memory = source_.CreateChunk(bytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    return *std::move(memory);
  }
  // A created chunk of `tenant`, cached.
  uint64_t Cached(const TenantId& tenant, uint64_t bytes = kChunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t id = table_.AddCreated(mu_, bytes, Memory(bytes), tenant,
                                          ChunkTable::kNobody, 0);
    table_.Cache(mu_, id);
    return id;
  }

  absl::Mutex mu_;
  MemfdChunkSource source_{kChunk};
  absl::Time now_ = absl::FromUnixSeconds(1000);
  ChunkTable table_{/*epoch=*/7, [this] { return now_; }};
};

TEST_F(ChunkTableTest, IdsCarryTheEpochAndSkipAdoptedOnes) {
  absl::MutexLock lock(&mu_);
  const uint64_t first = (uint64_t{7} << 40) + 1;
  // An earlier daemon of the same epoch gave out the next id.
  table_.Adopt(mu_, first + 1, Memory(), kChunk, 3, "t");
  EXPECT_EQ(table_.AddCreated(mu_, kChunk, Memory(), "t", 3, 1), first);
  EXPECT_EQ(table_.AddClientMade(mu_, kChunk, "t", 3, 1), first + 2);
}

TEST_F(ChunkTableTest, TakesTheTenantsMostRecentlyCachedChunkOfTheSize) {
  absl::MutexLock lock(&mu_);
  const uint64_t older = Cached("a");
  now_ += absl::Seconds(1);
  const uint64_t newer = Cached("a");
  const uint64_t others = Cached("b");
  const uint64_t larger = Cached("a", 2 * kChunk);
  EXPECT_EQ(table_.CachedCount(mu_, "a", kChunk), 2u);
  EXPECT_EQ(table_.free_bytes(mu_), 5 * kChunk);

  EXPECT_THAT(table_.TakeCached(mu_, "a", kChunk, 9, 4), Optional(newer));
  const ChunkTable::Chunk& taken = table_.Get(mu_, newer);
  EXPECT_EQ(taken.owner, 9u);
  EXPECT_EQ(taken.grant, 4u);
  EXPECT_THAT(table_.TakeCached(mu_, "a", kChunk, 9, 4), Optional(older));
  // Another tenant's chunk of that size is never taken.
  EXPECT_EQ(table_.TakeCached(mu_, "a", kChunk, 9, 4), std::nullopt);
  EXPECT_EQ(table_.CachedCount(mu_, "b", kChunk), 1u);
  EXPECT_EQ(table_.Get(mu_, others).owner, ChunkTable::kNobody);
  EXPECT_EQ(table_.Get(mu_, larger).owner, ChunkTable::kNobody);
  EXPECT_EQ(table_.free_bytes(mu_), 3 * kChunk);
  EXPECT_EQ(table_.live_bytes(mu_), 5 * kChunk);
  EXPECT_EQ(table_.totals(mu_).reused_chunks, 2u);
  table_.UncountReused(mu_, 1);
  EXPECT_EQ(table_.totals(mu_).reused_chunks, 1u);
}

TEST_F(ChunkTableTest, TrimsColdestFirstWhileAskedAndCountsIt) {
  absl::MutexLock lock(&mu_);
  const uint64_t coldest = Cached("a");
  now_ += absl::Seconds(1);
  const uint64_t warm = Cached("b");
  now_ += absl::Seconds(1);
  Cached("a");
  std::vector<ChunkMemory> doomed;
  std::vector<absl::Time> seen;
  const uint64_t trimmed = table_.Trim(
      mu_,
      [&](const ChunkTable::Chunk& chunk, uint64_t so_far) {
        seen.push_back(chunk.freed_at);
        return so_far < 2 * kChunk;
      },
      doomed);
  EXPECT_EQ(trimmed, 2 * kChunk);
  EXPECT_EQ(doomed.size(), 2u);
  // Asked about each coldest in turn, and once more to stop.
  EXPECT_THAT(seen, ElementsAre(absl::FromUnixSeconds(1000),
                                absl::FromUnixSeconds(1001),
                                absl::FromUnixSeconds(1002)));
  EXPECT_EQ(table_.Find(mu_, coldest), nullptr);
  EXPECT_EQ(table_.Find(mu_, warm), nullptr);
  EXPECT_EQ(table_.live_bytes(mu_), kChunk);
  EXPECT_EQ(table_.free_bytes(mu_), kChunk);
  EXPECT_EQ(table_.totals(mu_).trimmed_bytes, 2 * kChunk);
}

TEST_F(ChunkTableTest, ChunksBeingCreatedTakeRoomBeforeTheyAreLive) {
  absl::MutexLock lock(&mu_);
  const uint64_t capacity = 4 * kChunk;
  table_.AddCreated(mu_, kChunk, Memory(), "a", 1, 1);
  table_.BeginCreating(mu_, 2 * kChunk);
  EXPECT_EQ(table_.creating_bytes(mu_), 2 * kChunk);
  EXPECT_EQ(table_.UncreatedRoom(mu_, capacity), kChunk);
  // Past a lowered capacity there is no room, not a wrapped-around one.
  EXPECT_EQ(table_.UncreatedRoom(mu_, 2 * kChunk), 0u);
  table_.EndCreating(mu_, 2 * kChunk);
  EXPECT_EQ(table_.UncreatedRoom(mu_, capacity), 3 * kChunk);
  EXPECT_EQ(table_.totals(mu_).created_chunks, 1u);
}

TEST_F(ChunkTableTest, AChunkWithoutMemoryLeavesInsteadOfBeingCached) {
  absl::MutexLock lock(&mu_);
  const uint64_t made = table_.AddClientMade(mu_, kChunk, "a", 1, 1);
  const uint64_t adopted = (uint64_t{3} << 40) + 5;
  table_.Adopt(mu_, adopted, ChunkMemory{}, kChunk, 1, "a");
  EXPECT_FALSE(table_.Get(mu_, made).has_memory());
  EXPECT_EQ(table_.live_bytes(mu_), 2 * kChunk);
  EXPECT_EQ(table_.totals(mu_).client_made_chunks, 1u);
  EXPECT_EQ(table_.totals(mu_).adopted_bytes, kChunk);

  table_.Cache(mu_, adopted);
  EXPECT_EQ(table_.Find(mu_, adopted), nullptr);
  EXPECT_EQ(table_.free_bytes(mu_), 0u);
  // Given its memory, a client-made chunk is cached like a created one.
  table_.GiveMemory(mu_, made, Memory());
  table_.Cache(mu_, made);
  EXPECT_EQ(table_.CachedCount(mu_, "a", kChunk), 1u);
  EXPECT_EQ(table_.live_bytes(mu_), kChunk);
}

TEST_F(ChunkTableTest, DisownedChunksArePendingNoMoreAndNotCached) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = table_.AddCreated(mu_, kChunk, Memory(), "a", 1, 2);
  table_.SetPending(mu_, id, true);
  EXPECT_TRUE(table_.Get(mu_, id).pending);
  table_.Disown(mu_, id);
  const ChunkTable::Chunk& chunk = table_.Get(mu_, id);
  EXPECT_EQ(chunk.owner, ChunkTable::kNobody);
  EXPECT_FALSE(chunk.pending);
  EXPECT_EQ(chunk.grant, 0u);
  EXPECT_EQ(table_.CachedCount(mu_, "a", kChunk), 0u);
  EXPECT_EQ(table_.BytesOf(mu_, {id}), kChunk);
}

TEST_F(ChunkTableTest, LiveIdentitiesNameEveryChunkWithMemory) {
  absl::MutexLock lock(&mu_);
  ChunkMemory memory = Memory();
  const std::string identity = source_.Identity(memory);
  ASSERT_FALSE(identity.empty());
  const uint64_t id =
      table_.AddCreated(mu_, kChunk, std::move(memory), "a", 1, 1);
  table_.AddClientMade(mu_, kChunk, "a", 1, 1);
  EXPECT_THAT(table_.LiveIdentities(mu_, source_),
              UnorderedElementsAre(::testing::Pair(identity, id)));
}

}  // namespace
}  // namespace allocd
