#include "client/chunk_releaser.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// What the releaser delivered, in order: the session (by epoch) and ids of
// each call. The first call can be held until Unblock, so that what comes
// meanwhile waits.
class Daemon {
 public:
  ChunkReleaser::Deliver Deliver() {
    return [this](const std::shared_ptr<Connection>& owner,
                  std::vector<uint64_t> ids) {
      absl::MutexLock lock(&mu_);
      calls_.emplace_back(owner->epoch, std::move(ids));
      if (calls_.size() == 1) {
        first_in_flight_.Notify();
        mu_.Await(absl::Condition(
            +[](bool* blocked) { return !*blocked; }, &blocked_));
      }
    };
  }
  void BlockFirst() {
    absl::MutexLock lock(&mu_);
    blocked_ = true;
  }
  void Unblock() {
    absl::MutexLock lock(&mu_);
    blocked_ = false;
  }
  absl::Notification& first_in_flight() { return first_in_flight_; }
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  mutable absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> calls_
      ABSL_GUARDED_BY(mu_);
  absl::Notification first_in_flight_;
};

std::shared_ptr<Connection> Session(uint64_t epoch) {
  auto c = std::make_shared<Connection>();
  c->epoch = epoch;
  return c;
}

TEST(ChunkReleaserTest, WhatIsHandedOverDuringADeliveryGoesInOneCallAfterIt) {
  Daemon daemon;
  daemon.BlockFirst();
  ChunkReleaser releaser(daemon.Deliver());
  const std::shared_ptr<Connection> session = Session(1);
  releaser.Add(session, {1});
  daemon.first_in_flight().WaitForNotification();
  // The daemon has not answered: handing over returns all the same.
  releaser.Add(session, {2});
  releaser.Add(session, {3, 4});
  EXPECT_EQ(releaser.pending_chunks(), 4u);
  // Flush returns once all four are delivered: not while the first waits.
  std::atomic<bool> flushed{false};
  bool were_pending = false;
  std::thread flusher([&] {
    were_pending = releaser.Flush();
    flushed = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(flushed);
  daemon.Unblock();
  flusher.join();
  EXPECT_TRUE(were_pending);
  EXPECT_THAT(daemon.calls(),
              ElementsAre(Pair(1, ElementsAre(1)), Pair(1, ElementsAre(2, 3, 4))));
  EXPECT_EQ(releaser.pending_chunks(), 0u);
  EXPECT_EQ(releaser.deliveries(), 2u);
}

TEST(ChunkReleaserTest, FlushWaitsForWhatWasHandedOverAndSaysWhetherAnyWas) {
  Daemon daemon;
  ChunkReleaser releaser(daemon.Deliver());
  EXPECT_FALSE(releaser.Flush());
  releaser.Add(Session(1), {7, 8});
  releaser.Flush();
  EXPECT_THAT(daemon.calls(), ElementsAre(Pair(1, ElementsAre(7, 8))));
  EXPECT_FALSE(releaser.Flush());
  // No session (the daemon away) or no chunks: nothing to deliver.
  releaser.Add(nullptr, {9});
  releaser.Add(Session(1), {});
  EXPECT_FALSE(releaser.Flush());
  EXPECT_EQ(daemon.calls().size(), 1u);
}

TEST(ChunkReleaserTest, EachSessionsChunksGoToItInACallOfTheirOwn) {
  Daemon daemon;
  daemon.BlockFirst();
  ChunkReleaser releaser(daemon.Deliver());
  const std::shared_ptr<Connection> old_session = Session(1);
  const std::shared_ptr<Connection> new_session = Session(2);
  releaser.Add(old_session, {1});
  daemon.first_in_flight().WaitForNotification();
  releaser.Add(old_session, {2});
  releaser.Add(new_session, {3});
  releaser.Add(old_session, {4});
  daemon.Unblock();
  releaser.Flush();
  EXPECT_THAT(daemon.calls(),
              ElementsAre(Pair(1, ElementsAre(1)), Pair(1, ElementsAre(2, 4)),
                          Pair(2, ElementsAre(3))));
}

TEST(ChunkReleaserTest, ItsEndDeliversWhatIsPending) {
  Daemon daemon;
  daemon.BlockFirst();
  {
    ChunkReleaser releaser(daemon.Deliver());
    releaser.Add(Session(1), {1});
    daemon.first_in_flight().WaitForNotification();
    releaser.Add(Session(1), {2, 3});
    daemon.Unblock();
  }
  EXPECT_THAT(daemon.calls(),
              ElementsAre(Pair(1, ElementsAre(1)), Pair(1, ElementsAre(2, 3))));
}

}  // namespace
}  // namespace allocd
