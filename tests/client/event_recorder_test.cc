#include "client/event_recorder.h"

#include <atomic>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace allocd
