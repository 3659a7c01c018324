#include "client/event_recorder.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

void RecordN(EventRecorder& r, uint64_t first_id, int n) {
  for (int i = 0; i < n; ++i) {
    r.Record(TraceOp::kAlloc, 7, first_id + i, 512);
  }
}

TEST(EventRecorderTest, TakeHandsOverEverythingInOrderWithItsPosition) {
  EventRecorder r(16);
  RecordN(r, 0, 3);
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].sequence, 0u);
  EXPECT_EQ(b[0].dropped, 0u);
  ASSERT_EQ(b[0].events.size(), 3u);
  EXPECT_EQ(b[0].events[2].id, 2u);
  EXPECT_EQ(b[0].events[0].stream, 7u);
  EXPECT_TRUE(r.Take().empty());
  RecordN(r, 3, 2);
  b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].sequence, 3u);
}

TEST(EventRecorderTest, AFullBufferDropsAndTheGapComesBeforeTheNextEvents) {
  EventRecorder r(4);
  RecordN(r, 0, 6);  // 4 kept, 2 dropped after them
  EXPECT_EQ(r.dropped_total(), 2u);
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].events.size(), 4u);
  EXPECT_EQ(b[0].dropped, 0u);
  RecordN(r, 6, 1);
  b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].dropped, 2u);
  EXPECT_EQ(b[0].sequence, 6u);
  EXPECT_EQ(b[0].events[0].id, 6u);
}

TEST(EventRecorderTest, AGapInsideTheBufferSplitsTheBatches) {
  EventRecorder r(16);
  RecordN(r, 0, 2);
  r.Drop(5);  // e.g. PyTorch's ring lost five events here
  RecordN(r, 7, 3);
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].sequence, 0u);
  EXPECT_EQ(b[0].events.size(), 2u);
  EXPECT_EQ(b[1].dropped, 5u);
  EXPECT_EQ(b[1].sequence, 7u);
  EXPECT_EQ(b[1].events.size(), 3u);
  EXPECT_EQ(r.dropped_total(), 5u);
}

TEST(EventRecorderTest, UnsentBatchesBecomeAGapBeforeWhatWaits) {
  EventRecorder r(16);
  RecordN(r, 0, 3);
  std::vector<RecordedBatch> lost = r.Take();
  RecordN(r, 3, 2);
  r.Unsent(lost);
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].dropped, 3u);
  EXPECT_EQ(b[0].sequence, 3u);
  EXPECT_EQ(r.dropped_total(), 3u);
}

TEST(EventRecorderTest, AStateEndsItsBatchAndRidesWithIt) {
  EventRecorder r(16);
  RecordN(r, 0, 3);
  auto state = std::make_shared<v1::AllocatorState>();
  state->add_segment_addresses(42);
  r.RecordState(state);
  RecordN(r, 3, 2);
  r.RecordState(std::make_shared<v1::AllocatorState>());
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].events.size(), 3u);
  ASSERT_NE(b[0].state_after, nullptr);
  EXPECT_EQ(b[0].state_after->segment_addresses(0), 42u);
  EXPECT_EQ(b[1].sequence, 3u);
  EXPECT_EQ(b[1].events.size(), 2u);
  EXPECT_NE(b[1].state_after, nullptr);
  // A state takes no place in the stream's numbering.
  RecordN(r, 5, 1);
  b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].sequence, 5u);
  EXPECT_EQ(b[0].state_after, nullptr);
}

TEST(EventRecorderTest, AStateAfterAGapFollowsItAndAFullBufferKeepsNone) {
  EventRecorder r(4);
  RecordN(r, 0, 5);  // 4 kept, 1 dropped
  r.RecordState(std::make_shared<v1::AllocatorState>());  // no slot left
  std::vector<RecordedBatch> b = r.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].state_after, nullptr);
  RecordN(r, 5, 1);
  r.Drop(2);
  r.RecordState(std::make_shared<v1::AllocatorState>());
  b = r.Take();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].sequence, 5u);
  EXPECT_EQ(b[0].dropped, 1u);
  EXPECT_EQ(b[0].state_after, nullptr);
  // The state comes after the gap, in a batch of no events.
  EXPECT_EQ(b[1].sequence, 8u);
  EXPECT_EQ(b[1].dropped, 2u);
  EXPECT_TRUE(b[1].events.empty());
  EXPECT_NE(b[1].state_after, nullptr);
}

// RecordMany is Record of each event in order: the same batches, gaps and
// drops, and the half-full cue once when a call crosses the half.
TEST(EventRecorderTest, RecordManyIsRecordOfEachEventInOrder) {
  constexpr size_t kEvents = 13;
  std::vector<TraceOp> ops;
  std::vector<uint64_t> streams, ids, sizes;
  for (size_t i = 0; i < kEvents; ++i) {
    ops.push_back(static_cast<TraceOp>(i % 3));
    streams.push_back(i % 2);
    ids.push_back(100 + i);
    sizes.push_back(512 * (i + 1));
  }
  int cues_one = 0, cues_many = 0;
  EventRecorder one(8, [&] { ++cues_one; });
  EventRecorder many(8, [&] { ++cues_many; });
  for (size_t i = 0; i < kEvents; ++i) one.Record(ops[i], streams[i], ids[i], sizes[i]);
  EXPECT_EQ(many.RecordMany(ops.data(), streams.data(), ids.data(), sizes.data(), kEvents), 8u);
  EXPECT_EQ(many.dropped_total(), one.dropped_total());
  EXPECT_EQ(many.dropped_total(), kEvents - 8);
  EXPECT_EQ(cues_one, 1);
  EXPECT_EQ(cues_many, 1);
  std::vector<RecordedBatch> first_one = one.Take();
  std::vector<RecordedBatch> first_many = many.Take();
  ASSERT_EQ(first_one.size(), 1u);
  ASSERT_EQ(first_many.size(), 1u);
  ASSERT_EQ(first_many[0].events.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const RecordedEvent& e = first_many[0].events[i];
    const RecordedEvent& want = first_one[0].events[i];
    EXPECT_EQ(e.op, want.op);
    EXPECT_EQ(e.stream, want.stream);
    EXPECT_EQ(e.id, want.id);
    EXPECT_EQ(e.size, want.size);
    EXPECT_EQ(e.id, 100 + i);
  }
  // After the gap: both go on the same way.
  one.Record(ops[0], streams[0], ids[0], sizes[0]);
  EXPECT_EQ(many.RecordMany(ops.data(), streams.data(), ids.data(), sizes.data(), 1), 1u);
  std::vector<RecordedBatch> a = one.Take();
  std::vector<RecordedBatch> b = many.Take();
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].sequence, a[0].sequence);
  EXPECT_EQ(b[0].dropped, a[0].dropped);
  EXPECT_EQ(b[0].dropped, kEvents - 8);
  ASSERT_EQ(b[0].events.size(), 1u);
  EXPECT_EQ(b[0].events[0].id, 100u);
  EXPECT_EQ(b[0].events[0].size, 512u);
  EXPECT_EQ(many.RecordMany(ops.data(), streams.data(), ids.data(), sizes.data(), 0), 0u);
  EXPECT_TRUE(many.Take().empty());
}

TEST(EventRecorderTest, HalfFullCallsTheTakerOnceAndConcurrentRecordsAreAllCounted) {
  std::atomic<int> calls = 0;
  EventRecorder r(1000, [&] { ++calls; });
  RecordN(r, 0, 600);
  EXPECT_EQ(calls.load(), 1);
  r.Take();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { RecordN(r, 10000 * (t + 1), 400); });
  }
  for (std::thread& t : threads) t.join();
  uint64_t kept = 0;
  for (const RecordedBatch& b : r.Take()) kept += b.dropped + b.events.size();
  EXPECT_EQ(kept, 1000u);  // the capacity
  EXPECT_EQ(r.dropped_total(), 600u);
}

// `n` allocations' events as columns, ids from `first_id`.
struct Columns {
  std::vector<TraceOp> ops;
  std::vector<uint64_t> streams, ids, sizes;
  Columns(uint64_t first_id, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      ops.push_back(TraceOp::kAlloc);
      streams.push_back(7);
      ids.push_back(first_id + i);
      sizes.push_back(512);
    }
  }
  size_t RecordWaiting(EventRecorder& r, absl::Duration max_wait) const {
    return r.RecordManyWaiting(ops.data(), streams.data(), ids.data(), sizes.data(),
                               ops.size(), max_wait);
  }
};

// A taker as the telemetry thread is one: it takes when the recorder's
// half_full callback cues it, and keeps every event it took.
class CuedTaker {
 public:
  std::function<void()> Cue() {
    return [this] {
      absl::MutexLock lock(&mu_);
      cued_ = true;
    };
  }
  void Run(EventRecorder& r) {
    thread_ = std::thread([this, &r] {
      for (;;) {
        {
          absl::MutexLock lock(&mu_);
          mu_.Await(absl::Condition(
              +[](CuedTaker* t) ABSL_SHARED_LOCKS_REQUIRED(t->mu_) {
                return t->cued_ || t->stop_;
              },
              this));
          if (stop_) return;
          cued_ = false;
        }
        for (RecordedBatch& b : r.Take()) {
          for (const RecordedEvent& e : b.events) ids_.push_back(e.id);
        }
      }
    });
  }
  // Stops the thread; the ids it took, in order.
  std::vector<uint64_t> Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    return ids_;
  }

 private:
  absl::Mutex mu_;
  bool cued_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::vector<uint64_t> ids_;  // the thread's
};

TEST(EventRecorderTest, RecordManyWaitingKeepsMoreThanTheBufferHoldsWhileATakerTakes) {
  CuedTaker taker;
  EventRecorder r(8, taker.Cue());
  taker.Run(r);
  // 50 events into a buffer of 8: each time it is full, the call cues the
  // taker and waits for its Take(); nothing is dropped.
  const Columns events(100, 50);
  EXPECT_EQ(events.RecordWaiting(r, absl::Hours(1)), 50u);
  EXPECT_EQ(r.dropped_total(), 0u);
  std::vector<uint64_t> ids = taker.Stop();
  for (RecordedBatch& b : r.Take()) {
    for (const RecordedEvent& e : b.events) ids.push_back(e.id);
  }
  ASSERT_EQ(ids.size(), 50u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], 100 + i);
}

TEST(EventRecorderTest, RecordManyWaitingDropsAfterItsWaitAndWaitsAgainOnlyAfterATake) {
  CuedTaker taker;  // cued, but not taking until it runs below
  EventRecorder r(4, taker.Cue());
  // Nobody takes: 4 kept, and after the wait the other 2 are dropped.
  EXPECT_EQ(Columns(0, 6).RecordWaiting(r, absl::Milliseconds(10)), 4u);
  EXPECT_EQ(r.dropped_total(), 2u);
  // Until a Take(), a full buffer drops at once: with an hour's wait, this
  // returns only because it does not wait.
  EXPECT_EQ(Columns(6, 3).RecordWaiting(r, absl::Hours(1)), 0u);
  EXPECT_EQ(r.dropped_total(), 5u);
  std::vector<RecordedBatch> first = r.Take();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].events.size(), 4u);
  // A Take() shows a taker again: what overflows now waits for the next.
  taker.Run(r);
  EXPECT_EQ(Columns(9, 8).RecordWaiting(r, absl::Hours(1)), 8u);
  EXPECT_EQ(r.dropped_total(), 5u);
  taker.Stop();
}

}  // namespace
}  // namespace allocd
