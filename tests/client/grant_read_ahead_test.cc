#include "client/grant_read_ahead.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using Key = GrantReadAhead::Key;

constexpr uint64_t kSegment = uint64_t{2} << 30;
constexpr Key kTwoGiB{.bytes = kSegment, .max_chunk_bytes = uint64_t{1} << 30};
constexpr Key kTwentyMiB{.bytes = uint64_t{20} << 20,
                         .max_chunk_bytes = uint64_t{2} << 20};

// A daemon that grants what is asked, as many grants as it caches (all by
// default), each one chunk with the next id, and records what it granted
// and got back.
class FakeDaemon {
 public:
  std::vector<ReceivedChunks> Grant(const Key& key, uint32_t count) {
    absl::MutexLock lock(&mu_);
    if (refuse_) return {};
    fetched_.push_back(key);
    counts_.push_back(count);
    std::vector<ReceivedChunks> grants(std::min(count, cached_));
    for (ReceivedChunks& grant : grants) {
      grant.ids = {next_id_++};
      grant.sizes = {key.bytes};
    }
    return grants;
  }
  void Return(ReceivedChunks chunks) {
    absl::MutexLock lock(&mu_);
    returned_.insert(returned_.end(), chunks.ids.begin(), chunks.ids.end());
  }
  void Refuse(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_ = refuse;
  }
  void Cache(uint32_t grants) {
    absl::MutexLock lock(&mu_);
    cached_ = grants;
  }
  std::vector<Key> fetched() const {
    absl::MutexLock lock(&mu_);
    return fetched_;
  }
  // How many grants each fetch asked for.
  std::vector<uint32_t> counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }
  std::vector<uint64_t> returned() const {
    absl::MutexLock lock(&mu_);
    return returned_;
  }

 private:
  mutable absl::Mutex mu_;
  bool refuse_ = false;
  uint32_t cached_ = UINT32_MAX;
  uint64_t next_id_ = 100;
  std::vector<Key> fetched_;
  std::vector<uint32_t> counts_;
  std::vector<uint64_t> returned_;
};

class GrantReadAheadTest : public ::testing::Test {
 protected:
  std::unique_ptr<GrantReadAhead> Make(absl::Duration keep = absl::Seconds(30)) {
    return std::make_unique<GrantReadAhead>(
        [this](const Key& key, uint32_t count) {
          return daemon_.Grant(key, count);
        },
        [this](ReceivedChunks c) { daemon_.Return(std::move(c)); }, keep);
  }
  // What a caller without a parked grant gets by itself, made for it
  // unless `readable_ahead`.
  static void OwnGrant(GrantReadAhead& ahead, const Key& key,
                       bool readable_ahead = false) {
    EXPECT_FALSE(ahead.Take(key).has_value());
    ahead.Granted(key, readable_ahead);
  }
  static bool Eventually(const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(1));
    return done();
  }

  FakeDaemon daemon_;
};

TEST_F(GrantReadAheadTest, TheSecondRequestOfASizeReadsTheNextAhead) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  OwnGrant(*ahead, kTwoGiB);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(daemon_.fetched().empty()) << "one request is not a run";
  OwnGrant(*ahead, kTwoGiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == kSegment; }));
  // Served from the parked grants, in order, each fetch asking twice as
  // many as the last, up to the batch; none asked while some are parked.
  for (uint64_t id = 100; id < 120; ++id) {
    std::optional<ReceivedChunks> got = ahead->Take(kTwoGiB);
    ASSERT_TRUE(got.has_value()) << id;
    EXPECT_EQ(got->ids, std::vector<uint64_t>{id});
    ahead->Granted(kTwoGiB, /*readable_ahead=*/true);
  }
  EXPECT_TRUE(daemon_.returned().empty());
  const std::vector<uint32_t> doubling = {1, 2, 4, 8, 8};
  ASSERT_TRUE(Eventually([&] { return daemon_.counts() == doubling; }));
  // 1 + 2 + 4 + 8 + 8 = 23 read ahead, 20 taken.
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == 3 * kSegment; }));
  ahead.reset();
  // What was read ahead last and never taken went back.
  EXPECT_EQ(daemon_.returned(), (std::vector<uint64_t>{120, 121, 122}));
}

TEST_F(GrantReadAheadTest, AFetchParksWhatTheDaemonGivesAndANewRunStartsAtOne) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == kSegment; }));
  daemon_.Cache(1);  // asked for 2, it has one
  ASSERT_TRUE(ahead->Take(kTwoGiB).has_value());
  ahead->Granted(kTwoGiB, /*readable_ahead=*/true);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == kSegment; }));
  EXPECT_EQ(daemon_.counts(), (std::vector<uint32_t>{1, 2}));
  // Another size: what is parked goes back, and its run asks one first.
  daemon_.Cache(UINT32_MAX);
  OwnGrant(*ahead, kTwentyMiB);
  OwnGrant(*ahead, kTwentyMiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() > 0; }));
  EXPECT_EQ(daemon_.counts(), (std::vector<uint32_t>{1, 2, 1}));
  EXPECT_EQ(daemon_.returned(), std::vector<uint64_t>{101});
}

TEST_F(GrantReadAheadTest, AParkedGrantGoesBackAfterItsTime) {
  std::unique_ptr<GrantReadAhead> ahead = Make(absl::Milliseconds(30));
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  ASSERT_TRUE(Eventually([&] { return daemon_.returned().size() == 1; }));
  EXPECT_EQ(ahead->parked_bytes(), 0u);
  EXPECT_FALSE(ahead->Take(kTwoGiB).has_value());
  EXPECT_EQ(daemon_.returned().size(), 1u);  // given back once
}

TEST_F(GrantReadAheadTest, ARequestOfAnotherSizeGivesTheParkedGrantBackFirst) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() > 0; }));
  // Back before Take returns: the caller's own request never counts
  // against a quota together with it.
  EXPECT_FALSE(ahead->Take(kTwentyMiB).has_value());
  EXPECT_EQ(daemon_.returned(), std::vector<uint64_t>{100});
  ahead->Granted(kTwentyMiB, /*readable_ahead=*/false);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(daemon_.fetched().size(), 1u) << "a new size starts a new run";
}

TEST_F(GrantReadAheadTest, DropGivesBackWhatIsParkedAndWhatAFetchBrings) {
  absl::Notification fetching;
  absl::Notification answer;
  GrantReadAhead ahead(
      [&](const Key& key, uint32_t count) {
        fetching.Notify();
        answer.WaitForNotification();
        return daemon_.Grant(key, count);
      },
      [this](ReceivedChunks c) { daemon_.Return(std::move(c)); },
      absl::Seconds(30));
  OwnGrant(ahead, kTwoGiB);
  OwnGrant(ahead, kTwoGiB);
  fetching.WaitForNotification();
  ahead.Drop();  // a reclaim while the fetch is in flight
  answer.Notify();
  ASSERT_TRUE(Eventually([&] { return daemon_.returned().size() == 1; }));
  EXPECT_EQ(ahead.parked_bytes(), 0u);
  EXPECT_FALSE(ahead.Take(kTwoGiB).has_value());
}

TEST_F(GrantReadAheadTest, DropGivesBackAParkedGrantAtOnce) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() > 0; }));
  ahead->Drop();
  ASSERT_TRUE(Eventually([&] { return daemon_.returned().size() == 1; }));
  EXPECT_EQ(ahead->parked_bytes(), 0u);
}

// A grant the caller asked for ahead (a pre-warm) serves the next Take of
// its key, before the first request of that key ever read ahead.
TEST_F(GrantReadAheadTest, AParkedPrewarmServesTheNextTakeOfItsKey) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  ahead->Park(kTwoGiB, ReceivedChunks{.ids = {7}, .sizes = {kSegment}});
  EXPECT_EQ(ahead->parked_bytes(), kSegment);
  std::optional<ReceivedChunks> got = ahead->Take(kTwoGiB);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->ids, std::vector<uint64_t>{7});
  EXPECT_EQ(ahead->parked_bytes(), 0u);
  EXPECT_TRUE(daemon_.fetched().empty());
  EXPECT_TRUE(daemon_.returned().empty());
}

// Unused, it goes back after the keep (the thread waits for its deadline,
// not the one it waited for before it was parked), or at once on a Drop;
// and it replaces what was parked before.
TEST_F(GrantReadAheadTest, AParkedPrewarmGoesBackAfterItsTimeOrOnADrop) {
  std::unique_ptr<GrantReadAhead> ahead = Make(absl::Milliseconds(30));
  ahead->Park(kTwoGiB, ReceivedChunks{.ids = {7}, .sizes = {kSegment}});
  ASSERT_TRUE(Eventually([&] { return daemon_.returned().size() == 1; }));
  EXPECT_EQ(ahead->parked_bytes(), 0u);
  EXPECT_FALSE(ahead->Take(kTwoGiB).has_value());

  std::unique_ptr<GrantReadAhead> kept = Make(absl::Seconds(30));
  kept->Park(kTwentyMiB, ReceivedChunks{.ids = {8}, .sizes = {kTwentyMiB.bytes}});
  kept->Park(kTwoGiB, ReceivedChunks{.ids = {9}, .sizes = {kSegment}});
  EXPECT_EQ(daemon_.returned(), (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(kept->parked_bytes(), kSegment);
  kept->Drop();
  ASSERT_TRUE(Eventually([&] { return daemon_.returned().size() == 3; }));
  EXPECT_EQ(daemon_.returned().back(), 9u);
}

// The request a pre-warm foresees, come while the pre-warm's grant is
// asked for, waits for it and takes it (a request of another size does
// not wait); a Drop meanwhile sends the grant back instead.
TEST_F(GrantReadAheadTest, ATakeWaitsForAPrewarmInFlightOfItsKey) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  ahead->BeginPark(kTwoGiB);
  EXPECT_FALSE(ahead->Take(kTwentyMiB).has_value());
  std::optional<ReceivedChunks> taken;
  absl::Notification took;
  std::thread take([&] {
    taken = ahead->Take(kTwoGiB);
    took.Notify();
  });
  EXPECT_FALSE(took.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_TRUE(ahead->Park(kTwoGiB, ReceivedChunks{.ids = {7}, .sizes = {kSegment}}));
  take.join();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->ids, std::vector<uint64_t>{7});

  ahead->BeginPark(kTwoGiB);
  ahead->Drop();
  EXPECT_FALSE(ahead->Park(kTwoGiB, ReceivedChunks{.ids = {8}, .sizes = {kSegment}}));
  EXPECT_EQ(daemon_.returned(), std::vector<uint64_t>{8});
  EXPECT_EQ(ahead->parked_bytes(), 0u);
  // A pre-warm the daemon refused parks nothing, and wakes the waiter.
  ahead->BeginPark(kTwoGiB);
  std::thread refused([&] { taken = ahead->Take(kTwoGiB); });
  EXPECT_FALSE(ahead->Park(kTwoGiB, std::nullopt));
  refused.join();
  EXPECT_FALSE(taken.has_value());
}

TEST_F(GrantReadAheadTest, ARefusedFetchStopsReadingAheadUntilTheSizeChanges) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  daemon_.Refuse(true);
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  absl::SleepFor(absl::Milliseconds(20));
  daemon_.Refuse(false);
  for (int i = 0; i < 3; ++i) OwnGrant(*ahead, kTwoGiB);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(daemon_.fetched().empty());
  EXPECT_EQ(ahead->parked_bytes(), 0u);
  // A new run asks again.
  OwnGrant(*ahead, kTwentyMiB);
  OwnGrant(*ahead, kTwentyMiB);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() > 0; }));
  EXPECT_EQ(daemon_.fetched(), std::vector<Key>{kTwentyMiB});
}

TEST_F(GrantReadAheadTest, AnOwnGrantFromTheCacheEndsARefusal) {
  std::unique_ptr<GrantReadAhead> ahead = Make();
  daemon_.Refuse(true);  // a cold pool: nothing cached to read ahead
  OwnGrant(*ahead, kTwoGiB);
  OwnGrant(*ahead, kTwoGiB);
  absl::SleepFor(absl::Milliseconds(20));
  daemon_.Refuse(false);
  OwnGrant(*ahead, kTwoGiB);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(daemon_.fetched().empty());
  // The process freed its segments and takes them again, from the cache.
  OwnGrant(*ahead, kTwoGiB, /*readable_ahead=*/true);
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == kSegment; }));
  EXPECT_EQ(daemon_.fetched(), std::vector<Key>{kTwoGiB});
}

}  // namespace
}  // namespace allocd
