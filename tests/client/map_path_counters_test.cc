#include "client/map_path_counters.h"

#include <cstdint>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// The large segments are logged with when they came, the last few only;
// smaller ones (a request's, an expandable segment's pages) are not.
TEST(MapPathCountersTest, LogsTheLastLargeSegmentsWithTheirTime) {
  MapPathCounters counters;
  const int64_t before = absl::GetCurrentTimeNanos();
  counters.NoteSegment(60 * kGiB);
  counters.NoteSegment(MapPathCounters::kLargeSegmentBytes - 1);
  ASSERT_EQ(counters.LargeSegments().size(), 1u);
  EXPECT_GE(counters.LargeSegments().front().first, before);
  EXPECT_LE(counters.LargeSegments().front().first, absl::GetCurrentTimeNanos());
  EXPECT_EQ(counters.LargeSegments().front().second, 60 * kGiB);
  for (uint64_t i = 1; i <= MapPathCounters::kLargeSegmentsKept; ++i) {
    counters.NoteSegment(i * kGiB);
  }
  ASSERT_EQ(counters.LargeSegments().size(), MapPathCounters::kLargeSegmentsKept);
  EXPECT_EQ(counters.LargeSegments().front().second, kGiB);  // oldest first
  EXPECT_EQ(counters.LargeSegments().back().second,
            MapPathCounters::kLargeSegmentsKept * kGiB);
  const nlohmann::json reported = counters.ToJson().at("large_segments");
  ASSERT_EQ(reported.size(), MapPathCounters::kLargeSegmentsKept);
  EXPECT_EQ(reported[0][1], kGiB);
  EXPECT_EQ(reported[0][0], counters.LargeSegments().front().first);
}

}  // namespace
}  // namespace allocd
