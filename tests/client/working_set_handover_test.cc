#include "client/working_set_handover.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Segment = WorkingSetHandover::Segment;

constexpr uint64_t kLarge = uint64_t{2} << 30;
constexpr uint64_t kSmall = uint64_t{20} << 20;

// A daemon that grants what its cache holds (every grant by default), one
// chunk each with the next id, and a mapper that maps each grant at the
// next address; records what was fetched, mapped, given back and released,
// and the last report. Fetches and maps can be held at a gate.
class FakeDaemon {
 public:
  WorkingSetHandover::Callbacks Callbacks() {
    return {.fetch = [this](uint64_t bytes,
                            uint32_t count) { return Fetch(bytes, count); },
            .map = [this](ReceivedChunks grant) { return Map(std::move(grant)); },
            .give_back = [this](Segment s) { GiveBack(std::move(s)); },
            .release = [this](ReceivedChunks grant) { Release(std::move(grant)); },
            .report = [this](uint64_t bytes) {
              absl::MutexLock lock(&mu_);
              reported_ = bytes;
            }};
  }

  void Cache(uint32_t grants) {
    absl::MutexLock lock(&mu_);
    cached_ = grants;
  }
  void FailMaps() {
    absl::MutexLock lock(&mu_);
    fail_maps_ = true;
  }
  // Fetches (or maps) wait for Open() from now on.
  void CloseFetches() { fetch_gate_ = std::make_unique<absl::Notification>(); }
  void CloseMaps() { map_gate_ = std::make_unique<absl::Notification>(); }
  void OpenFetches() { fetch_gate_->Notify(); }
  void OpenMaps() { map_gate_->Notify(); }
  // Waits until a fetch (or map) waits at its gate.
  void AwaitFetching() { fetching_.WaitForNotification(); }
  void AwaitMapping() { mapping_.WaitForNotification(); }

  std::vector<std::pair<uint64_t, uint32_t>> fetched() const {
    absl::MutexLock lock(&mu_);
    return fetched_;
  }
  std::vector<uint64_t> given_back() const {
    absl::MutexLock lock(&mu_);
    return given_back_;
  }
  std::vector<uint64_t> released() const {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  uint64_t reported() const {
    absl::MutexLock lock(&mu_);
    return reported_;
  }

 private:
  std::vector<ReceivedChunks> Fetch(uint64_t bytes, uint32_t count) {
    if (fetch_gate_ != nullptr) {
      if (!fetching_.HasBeenNotified()) fetching_.Notify();
      fetch_gate_->WaitForNotification();
    }
    absl::MutexLock lock(&mu_);
    fetched_.emplace_back(bytes, count);
    const uint32_t granted = std::min(count, cached_);
    cached_ -= granted;
    std::vector<ReceivedChunks> grants(granted);
    for (ReceivedChunks& grant : grants) {
      grant.epoch = 1;
      grant.ids = {next_id_++};
      grant.sizes = {bytes};
    }
    return grants;
  }
  absl::StatusOr<Segment> Map(ReceivedChunks grant) {
    if (map_gate_ != nullptr) {
      if (!mapping_.HasBeenNotified()) mapping_.Notify();
      map_gate_->WaitForNotification();
    }
    absl::MutexLock lock(&mu_);
    if (fail_maps_) {
      released_.push_back(grant.ids[0]);  // Map gives back what it cannot map
      return absl::InternalError("cannot map");
    }
    const uint64_t address = next_address_;
    next_address_ += grant.bytes();
    return Segment{.address = address,
                   .bytes = grant.bytes(),
                   .epoch = grant.epoch,
                   .ids = grant.ids,
                   .sizes = grant.sizes,
                   .handles = {grant.ids[0]}};
  }
  void GiveBack(Segment segment) {
    absl::MutexLock lock(&mu_);
    given_back_.push_back(segment.ids[0]);
  }
  void Release(ReceivedChunks grant) {
    absl::MutexLock lock(&mu_);
    released_.push_back(grant.ids[0]);
  }

  mutable absl::Mutex mu_;
  uint32_t cached_ ABSL_GUARDED_BY(mu_) = UINT32_MAX;
  bool fail_maps_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_address_ ABSL_GUARDED_BY(mu_) = uint64_t{1} << 40;
  std::vector<std::pair<uint64_t, uint32_t>> fetched_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> given_back_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
  uint64_t reported_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<absl::Notification> fetch_gate_, map_gate_;
  absl::Notification fetching_, mapping_;
};

TEST(WorkingSetHandoverTest, MapsThePlanAheadARunOfASizePerFetchForTakeToHandOut) {
  FakeDaemon daemon;
  // 10 large (a fetch asks for at most 8), then 2 small, then 1 large.
  std::vector<uint64_t> plan(10, kLarge);
  plan.insert(plan.end(), {kSmall, kSmall, kLarge});
  WorkingSetHandover handover(plan, daemon.Callbacks(), absl::Seconds(60));
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  EXPECT_THAT(daemon.fetched(),
              ElementsAre(std::pair{kLarge, 8u}, std::pair{kLarge, 2u},
                          std::pair{kSmall, 2u}, std::pair{kLarge, 1u}));
  EXPECT_EQ(handover.counts().prepared, 13u);
  EXPECT_EQ(daemon.reported(), 11 * kLarge + 2 * kSmall);

  std::vector<uint64_t> addresses;
  for (int i = 0; i < 11; ++i) {
    std::optional<Segment> segment = handover.Take(kLarge);
    ASSERT_TRUE(segment.has_value()) << i;
    EXPECT_EQ(segment->bytes, kLarge);
    addresses.push_back(segment->address);
  }
  std::sort(addresses.begin(), addresses.end());
  EXPECT_EQ(std::unique(addresses.begin(), addresses.end()), addresses.end());
  EXPECT_FALSE(handover.Take(kLarge).has_value()) << "all taken";
  EXPECT_FALSE(handover.Take(4 * kSmall).has_value()) << "never prepared";
  EXPECT_EQ(handover.counts().taken, 11u);
  EXPECT_EQ(daemon.reported(), 2 * kSmall);
  EXPECT_THAT(daemon.given_back(), IsEmpty());
}

TEST(WorkingSetHandoverTest, WhatIsNotTakenWithinTheKeepAfterTheLastTakeGoesBack) {
  FakeDaemon daemon;
  WorkingSetHandover handover({kLarge, kLarge, kSmall}, daemon.Callbacks(),
                              absl::Milliseconds(100));
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  // Kept for a process that has not asked yet (kFirstRequestWait).
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_THAT(daemon.given_back(), IsEmpty());
  ASSERT_TRUE(handover.Take(kLarge).has_value());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (daemon.given_back().size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(daemon.given_back(), UnorderedElementsAre(2u, 3u));
  EXPECT_EQ(handover.counts().given_back, 2u);
  EXPECT_EQ(daemon.reported(), 0u);
  EXPECT_FALSE(handover.Take(kSmall).has_value());
}

TEST(WorkingSetHandoverTest, ARefusedFetchEndsThePreparation) {
  FakeDaemon daemon;
  daemon.Cache(2);
  WorkingSetHandover handover({kLarge, kLarge, kLarge, kSmall},
                              daemon.Callbacks(), absl::Seconds(60));
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  // Two of three: the cache is short, the small one is not asked for.
  EXPECT_THAT(daemon.fetched(), ElementsAre(std::pair{kLarge, 3u}));
  EXPECT_EQ(handover.counts().prepared, 2u);
}

TEST(WorkingSetHandoverTest, DropGivesBackEverythingAndWhatAFetchBringsLater) {
  FakeDaemon daemon;
  daemon.CloseFetches();
  WorkingSetHandover handover({kSmall, kLarge, kLarge}, daemon.Callbacks(),
                              absl::Seconds(60));
  daemon.AwaitFetching();
  handover.Drop();
  daemon.OpenFetches();
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  // The small one's fetch was under way: released unmapped; nothing after.
  EXPECT_THAT(daemon.fetched(), ElementsAre(std::pair{kSmall, 1u}));
  EXPECT_THAT(daemon.released(), ElementsAre(1u));
  EXPECT_EQ(handover.counts().prepared, 0u);
  EXPECT_FALSE(handover.Take(kSmall).has_value());
  EXPECT_EQ(daemon.reported(), 0u);
}

TEST(WorkingSetHandoverTest, DropAfterThePreparationGivesBackWhatIsReady) {
  FakeDaemon daemon;
  WorkingSetHandover handover({kSmall, kLarge}, daemon.Callbacks(),
                              absl::Seconds(60));
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  handover.Drop();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (daemon.given_back().size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(daemon.given_back(), UnorderedElementsAre(1u, 2u));
  EXPECT_FALSE(handover.Take(kSmall).has_value());
}

TEST(WorkingSetHandoverTest, ARequestForASizeStillToComeTakesItOffThePlan) {
  FakeDaemon daemon;
  daemon.CloseFetches();
  WorkingSetHandover handover({kLarge, kSmall, kSmall}, daemon.Callbacks(),
                              absl::Seconds(60));
  daemon.AwaitFetching();  // the large one
  // The caller maps its own small segment: one fewer is prepared.
  EXPECT_FALSE(handover.Take(kSmall).has_value());
  daemon.OpenFetches();
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  EXPECT_THAT(daemon.fetched(),
              ElementsAre(std::pair{kLarge, 1u}, std::pair{kSmall, 1u}));
}

TEST(WorkingSetHandoverTest, ARequestWaitsForTheSegmentOfItsSizeBeingMapped) {
  FakeDaemon daemon;
  daemon.CloseMaps();
  WorkingSetHandover handover({kLarge}, daemon.Callbacks(), absl::Seconds(60));
  daemon.AwaitMapping();
  std::optional<Segment> taken;
  std::thread asker([&] { taken = handover.Take(kLarge); });
  absl::SleepFor(absl::Milliseconds(50));
  daemon.OpenMaps();
  asker.join();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->ids, std::vector<uint64_t>{1});
  EXPECT_EQ(handover.counts().taken, 1u);
}

TEST(WorkingSetHandoverTest, AGrantThatCannotBeMappedIsNotHeld) {
  FakeDaemon daemon;
  daemon.FailMaps();
  WorkingSetHandover handover({kLarge, kLarge}, daemon.Callbacks(),
                              absl::Seconds(60));
  ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
  EXPECT_EQ(handover.counts().prepared, 0u);
  EXPECT_THAT(daemon.released(), ElementsAre(1u, 2u));
  EXPECT_EQ(daemon.reported(), 0u);
  EXPECT_FALSE(handover.Take(kLarge).has_value());
}

TEST(WorkingSetHandoverTest, DestructionGivesBackWhatIsReady) {
  FakeDaemon daemon;
  {
    WorkingSetHandover handover({kSmall, kSmall}, daemon.Callbacks(),
                                absl::Seconds(60));
    ASSERT_TRUE(handover.WaitPrepared(absl::Seconds(10)));
    ASSERT_TRUE(handover.Take(kSmall).has_value());
  }
  EXPECT_THAT(daemon.given_back(), ElementsAre(2u));
}

}  // namespace
}  // namespace allocd
