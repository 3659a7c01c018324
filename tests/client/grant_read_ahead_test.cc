#include "client/grant_read_ahead.h"

#include <memory>
#include <optional>
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

// A daemon that grants whatever is asked as one chunk with the next id,
// and records what it granted and got back.
class FakeDaemon {
 public:
  std::optional<ReceivedChunks> Grant(const Key& key) {
    absl::MutexLock lock(&mu_);
    if (refuse_) return std::nullopt;
    fetched_.push_back(key);
    ReceivedChunks chunks;
    chunks.ids = {next_id_++};
    chunks.sizes = {key.bytes};
    return chunks;
  }
  void Return(ReceivedChunks chunks) {
    absl::MutexLock lock(&mu_);
    returned_.insert(returned_.end(), chunks.ids.begin(), chunks.ids.end());
  }
  void Refuse(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_ = refuse;
  }
  std::vector<Key> fetched() const {
    absl::MutexLock lock(&mu_);
    return fetched_;
  }
  std::vector<uint64_t> returned() const {
    absl::MutexLock lock(&mu_);
    return returned_;
  }

 private:
  mutable absl::Mutex mu_;
  bool refuse_ = false;
  uint64_t next_id_ = 100;
  std::vector<Key> fetched_;
  std::vector<uint64_t> returned_;
};

class GrantReadAheadTest : public ::testing::Test {
 protected:
  std::unique_ptr<GrantReadAhead> Make(absl::Duration keep = absl::Seconds(30)) {
    return std::make_unique<GrantReadAhead>(
        [this](const Key& key) { return daemon_.Grant(key); },
        [this](ReceivedChunks c) { daemon_.Return(std::move(c)); }, keep);
  }
  // What a caller without a parked grant gets by itself.
  static void OwnGrant(GrantReadAhead& ahead, const Key& key) {
    EXPECT_FALSE(ahead.Take(key).has_value());
    ahead.Granted(key);
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
  // Served from the parked grant, and the one after it is read ahead.
  int taken = 0;
  for (uint64_t id : {100u, 101u, 102u}) {
    std::optional<ReceivedChunks> got = ahead->Take(kTwoGiB);
    ASSERT_TRUE(got.has_value());
    ++taken;
    EXPECT_EQ(got->ids, std::vector<uint64_t>{id});
    ahead->Granted(kTwoGiB);
  }
  EXPECT_EQ(taken, 3);
  EXPECT_TRUE(daemon_.returned().empty());
  ASSERT_TRUE(Eventually([&] { return ahead->parked_bytes() == kSegment; }));
  ahead.reset();
  // What was read ahead last and never taken went back.
  EXPECT_EQ(daemon_.returned(), std::vector<uint64_t>{103});
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
  ahead->Granted(kTwentyMiB);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(daemon_.fetched().size(), 1u) << "a new size starts a new run";
}

TEST_F(GrantReadAheadTest, DropGivesBackWhatIsParkedAndWhatAFetchBrings) {
  absl::Notification fetching;
  absl::Notification answer;
  GrantReadAhead ahead(
      [&](const Key& key) {
        fetching.Notify();
        answer.WaitForNotification();
        return daemon_.Grant(key);
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

}  // namespace
}  // namespace allocd
