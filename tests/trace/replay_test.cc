#include "allocator/trace/replay.h"

#include <algorithm>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "allocator/trace/snapshot_reader.h"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

ReplayResult MustReplay(const Trace& trace, const ReplayOptions& options = {},
                        const AllocatorConfig& config = {}) {
  absl::StatusOr<ReplayResult> r = Replay(trace, config, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayTest, EmptyTraceUsesNothing) {
  const ReplayResult r = MustReplay(Trace{});
  EXPECT_EQ(r.events, 0u);
  EXPECT_EQ(r.peak_reserved, 0);
  EXPECT_EQ(r.num_device_alloc, 0);
}

TEST(ReplayTest, SmallRequestGetsATwoMiBSegment) {
  TraceBuilder b;
  b.Free(b.Alloc(1000));
  const ReplayResult r = MustReplay(b.Build());
  EXPECT_EQ(r.peak_reserved, int64_t{2} * kMiB);
  EXPECT_EQ(r.peak_allocated, 1024);  // rounded to 512-byte multiples
  EXPECT_EQ(r.peak_requested, 1000);
  EXPECT_EQ(r.num_device_alloc, 1);
  EXPECT_EQ(r.events, 3u);
}

TEST(ReplayTest, ImmediateFreeLetsTheNextRequestReuseTheBlock) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(12 * kMiB);
  b.Free(a);
  b.Free(b.Alloc(12 * kMiB));
  const ReplayResult r = MustReplay(b.Build());
  EXPECT_EQ(r.peak_reserved, int64_t{12} * kMiB);
  EXPECT_EQ(r.num_device_alloc, 1);
}

TEST(ReplayTest, BlockReturnsToTheCacheOnlyAtFreeCompleted) {
  // record_stream() delayed A's free: B cannot have its memory, C can.
  TraceBuilder b;
  const uint32_t a = b.Alloc(12 * kMiB);
  b.Request(a);
  const uint32_t block_b = b.Alloc(12 * kMiB);
  b.Complete(a);
  const uint32_t c = b.Alloc(12 * kMiB);
  b.Free(block_b).Free(c);
  const ReplayResult r = MustReplay(b.Build());
  EXPECT_EQ(r.peak_reserved, int64_t{24} * kMiB);
  EXPECT_EQ(r.num_device_alloc, 2);
  // Allocated bytes fall at free_requested: A and B never count together
  // with C.
  EXPECT_EQ(r.peak_allocated, int64_t{24} * kMiB);
}

TEST(ReplayTest, OomSkipsTheFailedAllocationAndGoesOn) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(12 * kMiB);
  const uint32_t too_big = b.Alloc(12 * kMiB);
  b.Free(too_big).Free(a);
  b.Free(b.Alloc(12 * kMiB));
  ReplayOptions options;
  options.capacity = 20 * kMiB;
  const ReplayResult r = MustReplay(b.Build(), options);
  EXPECT_EQ(r.num_ooms, 1);
  ASSERT_TRUE(r.first_oom_event.has_value());
  EXPECT_EQ(*r.first_oom_event, 1u);
  EXPECT_EQ(r.events, 9u);
  // The retry flushed the (empty) cache once before giving up.
  EXPECT_EQ(r.num_alloc_retries, 1);
  EXPECT_EQ(r.peak_reserved, int64_t{12} * kMiB);
}

TEST(ReplayTest, StopAtFirstOom) {
  TraceBuilder b;
  b.Alloc(12 * kMiB);
  b.Alloc(12 * kMiB);
  b.Alloc(1000);
  ReplayOptions options;
  options.capacity = 20 * kMiB;
  options.stop_at_first_oom = true;
  const ReplayResult r = MustReplay(b.Build(), options);
  EXPECT_EQ(r.events, 2u);
  EXPECT_EQ(r.num_ooms, 1);
}

TEST(ReplayTest, MemoryFractionCapsReservedMemory) {
  // Two live 12 MiB blocks need 24 MiB; a 0.25 fraction of 80 MiB allows 20.
  TraceBuilder b;
  b.Alloc(12 * kMiB);
  b.Alloc(12 * kMiB);
  ReplayOptions options;
  options.capacity = 80 * kMiB;
  options.memory_fraction = 0.25;
  const ReplayResult r = MustReplay(b.Build(), options);
  EXPECT_EQ(r.num_ooms, 1);
  options.memory_fraction = 0.5;
  EXPECT_EQ(MustReplay(b.Build(), options).num_ooms, 0);
}

TEST(ReplayTest, TimelineKeepsThePeaks) {
  TraceBuilder b;
  for (int i = 0; i < 50; ++i) b.Free(b.Alloc((i % 7 + 1) * 3 * kMiB));
  ReplayOptions options;
  options.timeline_samples = 10;
  const ReplayResult r = MustReplay(b.Build(), options);
  ASSERT_EQ(r.timeline.size(), 10u);
  EXPECT_EQ(r.timeline.back().event, 149u);  // 50 x (alloc, free_requested, free_completed)
  int64_t max_reserved = 0;
  int64_t max_allocated = 0;
  for (const TimelineSample& s : r.timeline) {
    max_reserved = std::max(max_reserved, s.reserved);
    max_allocated = std::max(max_allocated, s.allocated);
  }
  EXPECT_EQ(max_reserved, r.peak_reserved);
  EXPECT_EQ(max_allocated, r.peak_allocated);
}

TEST(ReplayTest, RejectsAFreeOfSomethingNeverAllocated) {
  Trace trace;
  trace.num_ids = 1;
  trace.events.push_back({TraceOp::kFreeRequested, 0, 0, 0});
  const absl::StatusOr<ReplayResult> r = Replay(trace, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              testing::HasSubstr("trace event 0"));
}

TEST(ReplayTest, RejectsIdsOutOfRange) {
  Trace trace;
  trace.events.push_back({TraceOp::kAlloc, 0, 5, 100});
  EXPECT_FALSE(Replay(trace, {}, {}).ok());
}

TEST(ReplayTest, RejectsAFractionOutsideZeroToOne) {
  ReplayOptions options;
  options.capacity = kMiB;
  options.memory_fraction = 1.5;
  EXPECT_FALSE(Replay(Trace{}, {}, options).ok());
}

TEST(ReplayTest, CudaMallocAsyncIsAnEstimateWithoutDeviceAllocs) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(1000);
  b.Free(b.Alloc(3000));
  b.Free(a);
  AllocatorConfig config;
  config.backend = AllocatorBackend::kCudaMallocAsync;
  const ReplayResult r = MustReplay(b.Build(), {}, config);
  EXPECT_TRUE(r.estimated);
  EXPECT_EQ(r.num_device_alloc, 0);
  // The driver pool keeps the exact requested bytes, with no rounding.
  EXPECT_EQ(r.peak_allocated, 4000);
  EXPECT_EQ(r.peak_reserved, int64_t{32} * kMiB);
}

// --- live switch

LiveSwitch SplitOnly(uint64_t before_event) { return LiveSwitch{before_event, std::nullopt, std::nullopt}; }

TEST(ReplayLiveSwitchTest, SplittingWithoutASwitchChangesNothing) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(10 * kMiB);
  const uint32_t c = b.Alloc(3000);
  b.Free(a);
  const uint32_t d = b.Alloc(30 * kMiB);
  b.Free(c).Free(d);
  const Trace trace = b.Build();
  const ReplayResult plain = MustReplay(trace);
  ReplayOptions options;
  options.live_switch = SplitOnly(4);
  const ReplayResult split = MustReplay(trace, options);
  EXPECT_EQ(split.peak_reserved, plain.peak_reserved);
  EXPECT_EQ(split.num_device_alloc, plain.num_device_alloc);
  ASSERT_TRUE(split.before_switch && split.after_switch);
  EXPECT_EQ(split.before_switch->num_device_alloc + split.after_switch->num_device_alloc,
            plain.num_device_alloc);
  EXPECT_EQ(split.before_switch->peak_reserved, int64_t{12} * kMiB);
  // After the switch: the 10 MiB segment stays cached, 30 MiB more arrive.
  EXPECT_EQ(split.after_switch->reserved_at_start, int64_t{12} * kMiB);
  EXPECT_EQ(split.after_switch->peak_reserved, plain.peak_reserved);
  EXPECT_EQ(split.after_switch->first_event, 4u);
}

TEST(ReplayLiveSwitchTest, SwitchingToTheSameConfigOnlyEmptiesTheCache) {
  TraceBuilder b;
  b.Free(b.Alloc(10 * kMiB));
  b.Free(b.Alloc(10 * kMiB));
  const Trace trace = b.Build();
  const ReplayResult plain = MustReplay(trace);
  EXPECT_EQ(plain.num_device_alloc, 1);  // the second request reuses the block

  ReplayOptions options;
  options.live_switch = LiveSwitch{3, AllocatorConfig{}, std::nullopt};
  const ReplayResult r = MustReplay(trace, options);
  ASSERT_TRUE(r.after_switch);
  // empty_cache() handed the cached segment back (counted after the
  // switch), so the next request takes a new one.
  EXPECT_EQ(r.after_switch->reserved_at_start, 0);
  EXPECT_EQ(r.after_switch->num_device_free, 1);
  EXPECT_EQ(r.after_switch->num_device_alloc, 1);
  EXPECT_EQ(r.after_switch->peak_reserved, int64_t{10} * kMiB);
  EXPECT_EQ(r.before_switch->num_device_alloc, 1);
  EXPECT_EQ(r.peak_reserved, plain.peak_reserved);
}

// A block live at the switch keeps its segment through the switch's empty
// cache; freed later, the segment stays cached as the old config cut it,
// until the client's second release hands it back.
TEST(ReplayLiveSwitchTest, ASecondReleaseHandsBackWhatWasLiveAtTheSwitch) {
  TraceBuilder b;
  const uint32_t live = b.Alloc(10 * kMiB);
  b.Free(live);                  // events 1, 2: after the switch (before event 1)
  b.Free(b.Alloc(30 * kMiB));    // events 3-5
  const Trace trace = b.Build();
  AllocatorConfig expandable;
  expandable.expandable_segments = true;
  ReplayOptions once;
  once.live_switch = LiveSwitch{1, expandable, std::nullopt};
  const ReplayResult kept = MustReplay(trace, once);
  ASSERT_TRUE(kept.after_switch);
  EXPECT_EQ(kept.after_switch->reserved_at_start, int64_t{10} * kMiB);
  EXPECT_EQ(kept.after_switch->peak_reserved, int64_t{10} * kMiB + int64_t{40} * kMiB);

  ReplayOptions twice = once;
  twice.live_switch->release_again_before_event = 3;
  const ReplayResult released = MustReplay(trace, twice);
  ASSERT_TRUE(released.after_switch);
  EXPECT_EQ(released.after_switch->peak_reserved, int64_t{40} * kMiB);
  EXPECT_EQ(released.after_switch->num_device_free, kept.after_switch->num_device_free + 1);

  // Only after the switch, within the trace.
  for (const uint64_t bad : {uint64_t{1}, uint64_t{0}, trace.events.size() + 1}) {
    twice.live_switch->release_again_before_event = bad;
    EXPECT_FALSE(Replay(trace, AllocatorConfig{}, twice).ok()) << bad;
  }
}

TEST(ReplayLiveSwitchTest, SwitchAfterTheLastEvent) {
  TraceBuilder b;
  b.Free(b.Alloc(10 * kMiB));
  const Trace trace = b.Build();
  ReplayOptions options;
  options.live_switch = LiveSwitch{trace.events.size(), AllocatorConfig{}, std::nullopt};
  const ReplayResult r = MustReplay(trace, options);
  ASSERT_TRUE(r.after_switch);
  EXPECT_EQ(r.after_switch->num_device_free, 1);
  EXPECT_EQ(r.after_switch->peak_reserved, 0);
}

TEST(ReplayLiveSwitchTest, OomsAreCountedOnTheirSide) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(10 * kMiB);
  b.Free(a);
  const uint32_t big = b.Alloc(10 * kMiB);  // after the switch: under a tiny cap
  b.Free(big);
  const Trace trace = b.Build();
  ReplayOptions options;
  options.capacity = 100 * kMiB;
  options.live_switch = LiveSwitch{3, AllocatorConfig{}, 0.05};
  const ReplayResult r = MustReplay(trace, options);
  ASSERT_TRUE(r.after_switch);
  EXPECT_EQ(r.before_switch->num_ooms, 0);
  EXPECT_EQ(r.after_switch->num_ooms, 1);
  EXPECT_EQ(r.after_switch->first_oom_event, 3u);
}

TEST(ReplayLiveSwitchTest, RejectsWhatARunningProcessCannotDo) {
  TraceBuilder b;
  b.Free(b.Alloc(1000));
  const Trace trace = b.Build();
  ReplayOptions options;
  options.live_switch = LiveSwitch{4, AllocatorConfig{}, std::nullopt};
  EXPECT_FALSE(Replay(trace, AllocatorConfig{}, options).ok());
  AllocatorConfig async;
  async.backend = AllocatorBackend::kCudaMallocAsync;
  options.live_switch = LiveSwitch{1, async, std::nullopt};
  EXPECT_FALSE(Replay(trace, AllocatorConfig{}, options).ok());
  options.live_switch = LiveSwitch{1, AllocatorConfig{}, 1.5};
  EXPECT_FALSE(Replay(trace, AllocatorConfig{}, options).ok());
}

// The premise of issue 12 on a shipped trace: a job started under the
// guides' max_split_size_mb:64 peaks lower for the rest of its run once it
// switches live to expandable segments.
TEST(ReplayLiveSwitchTest, LlamaLoraSwitchToExpandableLowersThePeakAfterIt) {
  absl::StatusOr<Trace> trace =
      ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const AllocatorConfig start = *ParseAllocatorConfig("max_split_size_mb:64");
  const AllocatorConfig expandable =
      *ParseAllocatorConfigUpdate("expandable_segments:True", start);
  const uint64_t mid = trace->events.size() / 2;
  ReplayOptions stay;
  stay.live_switch = SplitOnly(mid);
  ReplayOptions go;
  go.live_switch = LiveSwitch{mid, expandable, std::nullopt};
  const ReplayResult stayed = MustReplay(*trace, stay, start);
  const ReplayResult switched = MustReplay(*trace, go, start);
  ASSERT_TRUE(stayed.after_switch && switched.after_switch);
  EXPECT_EQ(*stayed.before_switch, *switched.before_switch);
  EXPECT_LT(switched.after_switch->peak_reserved, stayed.after_switch->peak_reserved);
  EXPECT_EQ(switched.after_switch->num_ooms, 0);
}

}  // namespace
}  // namespace allocd
