// Partial snapshots (recording started late, or a ring buffer that dropped
// the oldest events): what the reader detects, the state at the first event
// it reconstructs from the end state, and replays of the recorded window
// that match the whole trace's replay of the same window.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/replay_observer.h"
#include "allocator/trace/snapshot_reader.h"
#include "allocator/trace/snapshot_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trace/partial_snapshot.h"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// What a replay did from trace event `start` on: the whole trace replayed,
// peaks reset when the window begins (they then start from what was live).
class WindowObserver final : public ReplayObserver {
 public:
  explicit WindowObserver(uint64_t start) : start_(start) {}
  void OnEvent(uint64_t, const TraceEvent&) override {}
  void OnDeviceCall(DeviceCall, uint64_t, uint64_t) override {}
  void OnCacheFlush() override {}
  void OnBlock(const TraceEvent&, const Allocation&) override {}
  void OnOutOfMemory(const TraceEvent&, uint64_t) override {}
  void OnEnd(const CachingAllocator&) override {}
  bool AfterEvent(uint64_t index, CachingAllocator& allocator) override {
    if (index + 1 == start_) {
      allocator.ResetPeakStats();
      device_allocs_before_ = allocator.Stats().num_device_alloc;
      device_frees_before_ = allocator.Stats().num_device_free;
    }
    return true;
  }
  int64_t device_allocs_before() const { return device_allocs_before_; }
  int64_t device_frees_before() const { return device_frees_before_; }

 private:
  uint64_t start_;
  int64_t device_allocs_before_ = 0;
  int64_t device_frees_before_ = 0;
};

struct WindowResult {
  int64_t peak_reserved;
  int64_t peak_allocated;
  int64_t device_allocs;
};

// The whole trace's replay over its last `window_events` trace events.
WindowResult ReplayWindow(const Trace& full, uint64_t window_events,
                          const AllocatorConfig& config) {
  WindowObserver observer(full.events.size() - window_events);
  ReplayOptions options;
  options.observer = &observer;
  absl::StatusOr<ReplayResult> r = Replay(full, config, options);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return {r->peak_reserved, r->peak_allocated,
          r->num_device_alloc - observer.device_allocs_before()};
}

WindowResult ReplayPartial(const Trace& partial, const AllocatorConfig& config) {
  absl::StatusOr<ReplayResult> r = Replay(partial, config);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return {r->peak_reserved, r->peak_allocated, r->num_device_alloc};
}

// `trace` replayed under `config` and written as a snapshot pickle.
std::string Exported(const Trace& trace, const AllocatorConfig& config = {}) {
  SnapshotRecorder recorder(trace, config);
  ReplayOptions options;
  options.observer = &recorder;
  EXPECT_TRUE(Replay(trace, config, options).ok());
  return recorder.Pickle();
}

// The snapshot events of a trace read from one: its allocs and frees, and
// the segment_alloc events.
size_t SnapshotEvents(const Trace& trace) {
  return trace.events.size() + trace.recorded_segments.size();
}

Trace Cut(const std::string& pickle, size_t keep_last,
          bool drop_end_state = false) {
  absl::StatusOr<std::string> cut = MakePartialSnapshot(
      pickle, {.keep_last_events = keep_last, .drop_end_state = drop_end_state});
  EXPECT_TRUE(cut.ok()) << cut.status();
  absl::StatusOr<Trace> trace = ParseSnapshot(cut.value_or(""));
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.value_or(Trace{});
}

// ---------------------------------------------------------------------------
// Small traces, exported by the engine and cut.

// A model's weights allocated before recording began, then steps that
// allocate and free activations and, halfway, free a weight.
Trace WeightsThenSteps() {
  TraceBuilder b;
  std::vector<uint32_t> weights;
  for (int i = 0; i < 6; ++i) weights.push_back(b.Alloc((30 + i) * kMiB));
  const uint32_t small = b.Alloc(1000);
  for (int step = 0; step < 8; ++step) {
    const uint32_t a = b.Alloc((12 + step) * kMiB);
    const uint32_t c = b.Alloc(3 * kMiB);
    const uint32_t d = b.Alloc(5000);
    b.Free(c);
    if (step == 4) b.Free(weights[2]);
    if (step == 5) b.Free(small);
    b.Free(a).Free(d);
  }
  return b.Build();
}

// The events of WeightsThenSteps' steps: all but the 7 first allocs and
// their 7 segment_allocs.
size_t StepsOnly(const std::string& pickle) {
  return SnapshotEvents(*ParseSnapshot(pickle)) - 14;
}

// Recording that began after the weights were allocated: the end state
// shows them, and the frees of the one freed in the window have no alloc.
TEST(PartialTraceTest, ReconstructsTheStateAtTheFirstEvent) {
  const Trace full = WeightsThenSteps();
  const std::string pickle = Exported(full);
  // Keep the steps only (the 7 allocs and their segment_allocs go).
  const Trace full_read = *ParseSnapshot(pickle);
  const Trace partial = Cut(pickle, StepsOnly(pickle));

  EXPECT_TRUE(partial.partial.partial());
  EXPECT_TRUE(partial.partial.reconstructed()) << partial.partial.unrecoverable;
  EXPECT_TRUE(partial.partial.state_before_first_event);
  EXPECT_EQ(partial.partial.unmatched_frees, 4u);  // weight 2 and `small`
  EXPECT_FALSE(partial.partial.ring_buffer_wrapped);
  // The 6 weights' segments and the small one; every weight and `small`.
  EXPECT_EQ(partial.partial.segments.size(), 7u);
  EXPECT_EQ(partial.partial.blocks.size(), 7u);
  EXPECT_EQ(partial.omitted.unmatched_frees, 0u);

  const uint64_t window = partial.events.size();
  const WindowResult truth = ReplayWindow(full_read, window, {});
  const WindowResult got = ReplayPartial(partial, {});
  EXPECT_EQ(got.peak_reserved, truth.peak_reserved);
  EXPECT_EQ(got.peak_allocated, truth.peak_allocated);
  EXPECT_EQ(got.device_allocs, truth.device_allocs);
}

// Blocks allocated before recording began and freed (free_requested) but
// still waiting on another stream: the window holds only free_completed.
TEST(PartialTraceTest, PendingFreesAtTheFirstEventStayPending) {
  TraceBuilder b;
  const uint32_t x = b.Alloc(25 * kMiB);
  const uint32_t y = b.Alloc(25 * kMiB);
  b.Request(x);
  const uint32_t z = b.Alloc(3 * kMiB);
  b.Complete(x);
  b.Request(y);
  b.Free(z);
  const Trace full = b.Build();
  const std::string pickle = Exported(full);
  // From the alloc of z on: x is pending-free at the first event.
  const Trace partial = Cut(pickle, 6);
  ASSERT_TRUE(partial.partial.reconstructed()) << partial.partial.unrecoverable;
  ASSERT_EQ(partial.partial.blocks.size(), 2u);
  int pending = 0;
  for (const InitialBlock& block : partial.partial.blocks) {
    pending += block.free_requested;
    EXPECT_EQ(block.size, 26 * kMiB);  // 25 MiB rounded up, rest unsplit
  }
  EXPECT_EQ(pending, 1);
  absl::StatusOr<ReplayResult> r = Replay(partial, {});
  ASSERT_TRUE(r.ok()) << r.status();
  // y's free_requested is in the window; at the end only z is gone too.
  EXPECT_EQ(r->stats.allocated_bytes.all().current, 0);
  EXPECT_EQ(r->peak_allocated, static_cast<int64_t>(26 + 3) * kMiB);
}

// A block's size that only its free names: the request rounded, and the
// rest of the segment when PyTorch would not have split it off (a large
// remainder of at most 1 MiB).
TEST(PartialTraceTest, UnsplitBlocksTakeTheirWholeSpace) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(19 * kMiB + 1);  // 20 MiB segment, unsplit
  const uint32_t c = b.Alloc(5 * kMiB);       // 20 MiB segment, split
  b.Free(a).Free(c);
  const std::string pickle = Exported(b.Build());
  const Trace partial = Cut(pickle, 4);
  ASSERT_TRUE(partial.partial.reconstructed()) << partial.partial.unrecoverable;
  ASSERT_EQ(partial.partial.blocks.size(), 2u);
  std::vector<uint64_t> sizes;
  for (const InitialBlock& block : partial.partial.blocks) {
    sizes.push_back(block.size);
  }
  EXPECT_THAT(sizes, ::testing::UnorderedElementsAre(20 * kMiB, 5 * kMiB));
}

// Expandable segments: the pages mapped at the first event are the end
// state's less what the events mapped, plus what they unmapped; the replay
// adopts them as the segment's mapped ranges.
TEST(PartialTraceTest, ExpandableSegmentsAreReconstructed) {
  const AllocatorConfig expandable = *ParseAllocatorConfig("expandable_segments:True");
  const Trace full = WeightsThenSteps();
  const std::string pickle = Exported(full, expandable);
  const Trace full_read = *ParseSnapshot(pickle);
  EXPECT_FALSE(full_read.partial.partial());
  for (const size_t keep : {size_t{60}, size_t{40}, size_t{20}}) {
    const Trace partial = Cut(pickle, keep);
    ASSERT_TRUE(partial.partial.reconstructed()) << partial.partial.unrecoverable;
    ASSERT_FALSE(partial.partial.segments.empty());
    for (const InitialSegment& s : partial.partial.segments) {
      EXPECT_TRUE(s.is_expandable);
    }
    const WindowResult truth = ReplayWindow(full_read, partial.events.size(), expandable);
    const WindowResult got = ReplayPartial(partial, expandable);
    EXPECT_EQ(got.peak_reserved, truth.peak_reserved) << keep;
    EXPECT_EQ(got.peak_allocated, truth.peak_allocated) << keep;
    EXPECT_EQ(got.device_allocs, truth.device_allocs) << keep;
    // And it round-trips.
    absl::StatusOr<Trace> back = ParseSnapshot(Exported(partial, expandable));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->partial.segments, partial.partial.segments);
    EXPECT_EQ(back->partial.blocks, partial.partial.blocks);
  }
}

// A snapshot without its end state: the frees are counted and skipped, and
// the trace says it cannot be right.
TEST(PartialTraceTest, WithoutTheEndStateItSaysSo) {
  const std::string pickle = Exported(WeightsThenSteps());
  const Trace partial = Cut(pickle, StepsOnly(pickle), /*drop_end_state=*/true);
  EXPECT_TRUE(partial.partial.partial());
  EXPECT_FALSE(partial.partial.reconstructed());
  EXPECT_THAT(partial.partial.unrecoverable, HasSubstr("no 'segments'"));
  EXPECT_EQ(partial.omitted.unmatched_frees, 4u);
  EXPECT_TRUE(partial.partial.blocks.empty());
  // The frees of unknown blocks are gone; the rest replays.
  EXPECT_TRUE(Replay(partial, {}).ok());
}

// A whole trace is not partial; a ring buffer's cut holds a round number
// of events.
TEST(PartialTraceTest, WholeTracesAreNotPartialAndRingsLookWrapped) {
  absl::StatusOr<Trace> full = ReadSnapshotFile(
      std::string(ALLOCD_SOURCE_DIR) + "/traces/gpt2_full.pickle.gz");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->partial.partial());
  EXPECT_TRUE(full->partial.segments.empty());

  const std::string pickle = ReadGunzipped(std::string(ALLOCD_SOURCE_DIR) +
                                           "/traces/gpt2_full.pickle.gz");
  const Trace ring = Cut(pickle, 100000);
  EXPECT_TRUE(ring.partial.ring_buffer_wrapped);
  EXPECT_TRUE(ring.partial.reconstructed()) << ring.partial.unrecoverable;
  const Trace late = Cut(pickle, 100001);
  EXPECT_FALSE(late.partial.ring_buffer_wrapped);
}

// Exporting a partial trace's replay and reading it back gives the same
// state at the first event and the same replay.
TEST(PartialTraceTest, PartialReplaysRoundTrip) {
  const std::string pickle = Exported(WeightsThenSteps());
  const Trace partial = Cut(pickle, StepsOnly(pickle));
  ASSERT_TRUE(partial.partial.reconstructed());
  const std::string again = Exported(partial);
  absl::StatusOr<Trace> back = ParseSnapshot(again);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->partial.segments, partial.partial.segments);
  EXPECT_EQ(back->partial.blocks, partial.partial.blocks);
  EXPECT_EQ(back->events, partial.events);
  EXPECT_EQ(Replay(*back, {})->peak_reserved, Replay(partial, {})->peak_reserved);
}

// The cudaMallocAsync estimate starts from the live blocks too.
TEST(PartialTraceTest, TheAsyncPoolEstimateIncludesTheLiveBlocks) {
  const Trace full = WeightsThenSteps();
  const std::string pickle = Exported(full);
  const Trace partial = Cut(pickle, StepsOnly(pickle));
  const AllocatorConfig async = *ParseAllocatorConfig("backend:cudaMallocAsync");
  absl::StatusOr<ReplayResult> whole = Replay(full, async);
  absl::StatusOr<ReplayResult> window = Replay(partial, async);
  ASSERT_TRUE(whole.ok() && window.ok());
  // The weights are live throughout: the window's peak is the job's.
  EXPECT_EQ(window->peak_allocated, whole->peak_allocated);
  EXPECT_GE(window->peak_reserved, window->peak_allocated);
}

// More state than the device holds is an error, not a quiet replay.
TEST(PartialTraceTest, StateLargerThanTheDeviceIsAnError) {
  const std::string pickle = Exported(WeightsThenSteps());
  const Trace partial = Cut(pickle, StepsOnly(pickle));
  ReplayOptions options;
  options.capacity = 100 * kMiB;
  absl::StatusOr<ReplayResult> r = Replay(partial, {}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("partial"));
}

// ---------------------------------------------------------------------------
// The shipped traces, cut as users' snapshots are: the reconstructed
// replay of the window matches the whole trace's replay of it, within
// DESIGN.md's fidelity bar (peak reserved within 0.1%, device allocs within
// 1%; the only freedom is the driver's choice of new segments' addresses).

struct Cutting {
  const char* name;
  // Events kept: a fraction of the trace, or a ring buffer's max_entries.
  double keep_fraction;
  size_t max_entries;
};

TEST(PartialTraceAccuracyTest, ShippedTracesCutAndRingBuffered) {
  const Cutting cuttings[] = {
      {"first third dropped", 2.0 / 3.0, 0},
      {"first half dropped", 0.5, 0},
      {"ring max_entries=100000", 0, 100000},
      {"ring max_entries=20000", 0, 20000},
  };
  std::printf(
      "| trace | cut | events kept | live at first event | peak reserved: "
      "whole / partial (diff) | peak allocated: whole / partial (diff) | "
      "device allocs: whole / partial (recorded run) | without "
      "reconstruction: peak allocated |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const char* name : {"gpt2_full", "llama_lora"}) {
    const std::string path =
        absl::StrFormat("%s/traces/%s.pickle.gz", ALLOCD_SOURCE_DIR, name);
    const std::string pickle = ReadGunzipped(path);
    ASSERT_FALSE(pickle.empty()) << path;
    const Trace full = *ParseSnapshot(pickle);
    const size_t snapshot_events = SnapshotEvents(full);
    for (const Cutting& c : cuttings) {
      const size_t keep = c.max_entries != 0
                              ? c.max_entries
                              : static_cast<size_t>(snapshot_events * c.keep_fraction);
      const Trace partial = Cut(pickle, keep);
      const Trace naive = Cut(pickle, keep, /*drop_end_state=*/true);
      ASSERT_TRUE(partial.partial.reconstructed())
          << name << " " << c.name << ": " << partial.partial.unrecoverable;
      EXPECT_EQ(partial.partial.ring_buffer_wrapped, c.max_entries != 0);
      const WindowResult truth = ReplayWindow(full, partial.events.size(), {});
      const WindowResult got = ReplayPartial(partial, {});
      const WindowResult without = ReplayPartial(naive, {});
      uint64_t live = 0;
      for (const InitialBlock& b : partial.partial.blocks) {
        if (!b.free_requested) live += b.size;
      }
      std::printf(
          "| %s | %s | %zu | %s in %zu blocks | %s / %s (%+.3f%%) | %s / %s "
          "(%+.3f%%) | %lld / %lld (%zu) | %s |\n",
          name, c.name, keep, FormatSize(live).c_str(),
          partial.partial.blocks.size(), FormatSize(truth.peak_reserved).c_str(),
          FormatSize(got.peak_reserved).c_str(),
          100.0 * (got.peak_reserved - truth.peak_reserved) / truth.peak_reserved,
          FormatSize(truth.peak_allocated).c_str(),
          FormatSize(got.peak_allocated).c_str(),
          100.0 * (got.peak_allocated - truth.peak_allocated) / truth.peak_allocated,
          static_cast<long long>(truth.device_allocs),
          static_cast<long long>(got.device_allocs),
          partial.recorded_segments.size(),
          FormatSize(without.peak_allocated).c_str());
      EXPECT_NEAR(got.peak_reserved, truth.peak_reserved, truth.peak_reserved * 0.001)
          << name << " " << c.name;
      EXPECT_NEAR(got.peak_allocated, truth.peak_allocated, truth.peak_allocated * 0.001)
          << name << " " << c.name;
      // Starting from the recorded run's own addresses, the partial replay
      // makes exactly the recorded run's cudaMallocs in the window; the
      // whole trace's replay, on modelled addresses, may differ by one.
      EXPECT_EQ(got.device_allocs,
                static_cast<int64_t>(partial.recorded_segments.size()))
          << name << " " << c.name;
      EXPECT_NEAR(got.device_allocs, truth.device_allocs,
                  std::max<double>(1.0, truth.device_allocs * 0.01))
          << name << " " << c.name;
    }
  }
}

// The shipped traces have no expandable segments: their replays under
// expandable_segments:True, exported and cut, stand in for a snapshot
// PyTorch would write (segment_map/segment_unmap events, mapped ranges in
// the end state). On a device small enough to unmap pages too.
TEST(PartialTraceAccuracyTest, ExpandableSnapshotsCutAndRingBuffered) {
  const AllocatorConfig expandable = *ParseAllocatorConfig("expandable_segments:True");
  for (const char* name : {"gpt2_full", "llama_lora"}) {
    const Trace whole = *ReadSnapshotFile(
        absl::StrFormat("%s/traces/%s.pickle.gz", ALLOCD_SOURCE_DIR, name));
    // Unlimited, and 2% above the peak allocated, where caches are flushed
    // and pages unmapped.
    const int64_t peak_allocated = Replay(whole, expandable)->peak_allocated;
    for (const uint64_t capacity :
         {uint64_t{0}, static_cast<uint64_t>(peak_allocated * 1.02)}) {
      ReplayOptions options;
      options.capacity = capacity;
      SnapshotRecorder recorder(whole, expandable);
      options.observer = &recorder;
      ASSERT_TRUE(Replay(whole, expandable, options).ok());
      const std::string pickle = recorder.Pickle();
      const Trace full = *ParseSnapshot(pickle);
      ASSERT_FALSE(full.partial.partial()) << name;
      for (const size_t keep : {SnapshotEvents(full) * 2 / 3, size_t{100000}}) {
        const Trace partial = Cut(pickle, keep);
        ASSERT_TRUE(partial.partial.reconstructed())
            << name << " " << keep << ": " << partial.partial.unrecoverable;
        ReplayOptions window_options;
        window_options.capacity = capacity;
        WindowObserver observer(full.events.size() - partial.events.size());
        window_options.observer = &observer;
        absl::StatusOr<ReplayResult> truth = Replay(full, expandable, window_options);
        ReplayOptions partial_options;
        partial_options.capacity = capacity;
        absl::StatusOr<ReplayResult> got = Replay(partial, expandable, partial_options);
        ASSERT_TRUE(truth.ok()) << truth.status();
        ASSERT_TRUE(got.ok()) << got.status();
        std::printf("| %s (expandable_segments:True, capacity %s) | keeps %zu | %s / %s | %s / %s | %lld / %lld (device frees %lld / %lld) |\n",
                    name, capacity == 0 ? "unlimited" : FormatSize(capacity).c_str(), keep,
                    FormatSize(truth->peak_reserved).c_str(), FormatSize(got->peak_reserved).c_str(),
                    FormatSize(truth->peak_allocated).c_str(), FormatSize(got->peak_allocated).c_str(),
                    static_cast<long long>(truth->num_device_alloc - observer.device_allocs_before()),
                    static_cast<long long>(got->num_device_alloc),
                    static_cast<long long>(truth->num_device_free - observer.device_frees_before()),
                    static_cast<long long>(got->num_device_free));
        EXPECT_NEAR(got->peak_reserved, truth->peak_reserved, truth->peak_reserved * 0.01)
            << name << " " << keep << " " << capacity;
        EXPECT_EQ(got->peak_allocated, truth->peak_allocated) << name << " " << keep;
        EXPECT_EQ(got->num_device_alloc,
                  truth->num_device_alloc - observer.device_allocs_before())
            << name << " " << keep;
        EXPECT_EQ(got->num_device_free,
                  truth->num_device_free - observer.device_frees_before())
            << name << " " << keep;
      }
    }
  }
}

// Under a config other than the recorded one, the window starts from the
// recorded run's layout (as if the config had been switched when recording
// began), while the whole trace's replay had that config from the start:
// the figures differ by what each config's history before the window left
// behind, which the snapshot cannot tell. Reported, not asserted (the
// second table of docs/results.md's partial snapshots). Allocating the live blocks afresh under each
// config instead was measured worse: it misses all cached memory, and
// ranked every config above the defaults on gpt2_full.
TEST(PartialTraceAccuracyTest, OtherConfigsStartFromTheRecordedLayout) {
  std::printf("| trace | config | peak reserved: whole / partial (diff) | peak allocated: whole / partial |\n|---|---|---|---|\n");
  for (const char* name : {"gpt2_full", "llama_lora"}) {
    const std::string pickle = ReadGunzipped(
        absl::StrFormat("%s/traces/%s.pickle.gz", ALLOCD_SOURCE_DIR, name));
    const Trace full = *ParseSnapshot(pickle);
    const Trace partial = Cut(pickle, SnapshotEvents(full) * 2 / 3);
    for (const char* conf : {"expandable_segments:True", "max_split_size_mb:256",
                             "roundup_power2_divisions:4",
                             "max_split_size_mb:64"}) {
      const AllocatorConfig config = *ParseAllocatorConfig(conf);
      const WindowResult truth = ReplayWindow(full, partial.events.size(), config);
      const WindowResult got = ReplayPartial(partial, config);
      std::printf("| %s | %s | %s / %s (%+.1f%%) | %s / %s |\n", name, conf,
                  FormatSize(truth.peak_reserved).c_str(),
                  FormatSize(got.peak_reserved).c_str(),
                  100.0 * (got.peak_reserved - truth.peak_reserved) / truth.peak_reserved,
                  FormatSize(truth.peak_allocated).c_str(),
                  FormatSize(got.peak_allocated).c_str());
    }
  }
}

}  // namespace
}  // namespace allocd
