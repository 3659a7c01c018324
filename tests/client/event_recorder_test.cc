#include "client/event_recorder.h"

#include <atomic>
#include <memory>
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
