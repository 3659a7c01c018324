#include "server/autotune/job_window.h"

#include <string>
#include <vector>

#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

EvidenceEvent Alloc(uint64_t id, uint64_t size, uint64_t stream = 7) {
  return {TraceOp::kAlloc, stream, id, size};
}
EvidenceEvent Requested(uint64_t id) { return {TraceOp::kFreeRequested, 7, id, 0}; }
EvidenceEvent Completed(uint64_t id) { return {TraceOp::kFreeCompleted, 7, id, 0}; }

ReplayResult MustReplay(const Trace& trace) {
  absl::StatusOr<ReplayResult> r = Replay(trace, AllocatorConfig{});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ReplayResult{};
}

// `n` short-lived allocations at reused addresses.
std::vector<EvidenceEvent> Churn(int n, uint64_t size = kMiB) {
  std::vector<EvidenceEvent> events;
  for (int i = 0; i < n; ++i) {
    const uint64_t address = 0x1000 + (i % 4) * 0x100;
    events.push_back(Alloc(address, size));
    events.push_back(Requested(address));
    events.push_back(Completed(address));
  }
  return events;
}

TEST(JobWindowTest, MemoryStaysBounded) {
  JobWindow window(3000);
  window.Add(Churn(1000), 0);
  const size_t full = window.MemoryBytes();
  for (int i = 0; i < 100; ++i) window.Add(Churn(1000), 0);
  EXPECT_EQ(window.size(), 3000u);
  EXPECT_EQ(window.total_events(), 101u * 3000);
  EXPECT_LE(window.MemoryBytes(), full + 1024);
  // About 16 bytes an event, plus small tables.
  EXPECT_LT(window.MemoryBytes(), 3000 * 16 + 16 * 1024);
}

TEST(JobWindowTest, ThePreludeKeepsWhatWasLiveAtTheWindowStart) {
  JobWindow window(300);
  window.Add({Alloc(0xA, 100 * kMiB), Alloc(0xB, 3000), Alloc(0xC, 50 * kMiB), Requested(0xC)}, 0);
  window.Add(Churn(200), 0);  // pushes them out of the window
  window.Add({Completed(0xC), Requested(0xB), Completed(0xB)}, 0);
  const Trace trace = window.ToTrace();
  ASSERT_GE(trace.events.size(), 4u);
  // The prelude: the three allocations in their order, then C's pending free.
  EXPECT_EQ(trace.events[0], (TraceEvent{TraceOp::kAlloc, 0, 0, 100 * kMiB}));
  EXPECT_EQ(trace.events[1], (TraceEvent{TraceOp::kAlloc, 0, 1, 3000}));
  EXPECT_EQ(trace.events[2], (TraceEvent{TraceOp::kAlloc, 0, 2, 50 * kMiB}));
  EXPECT_EQ(trace.events[3], (TraceEvent{TraceOp::kFreeRequested, 0, 2, 0}));
  EXPECT_EQ(trace.events.size(), 4 + window.size());
  const ReplayResult r = MustReplay(trace);
  EXPECT_GE(r.peak_requested, static_cast<int64_t>(150 * kMiB + 3000));
}

TEST(JobWindowTest, ReusedAddressesGetTheirOwnIds) {
  JobWindow window(100);
  window.Add({Alloc(0xA, 10), Requested(0xA), Completed(0xA), Alloc(0xA, 20)}, 0);
  // The client lost 0xA's free: a new alloc of it frees the old one first.
  window.Add({Alloc(0xA, 30)}, 0);
  const Trace trace = window.ToTrace();
  EXPECT_EQ(trace.num_ids, 3u);
  EXPECT_EQ(trace.events.back(), (TraceEvent{TraceOp::kAlloc, 0, 2, 30}));
  const ReplayResult r = MustReplay(trace);
  EXPECT_EQ(r.stats.allocated_bytes.all().current, 512);  // only the last one is live
}

TEST(JobWindowTest, FreesOfUnknownIdsAreLeftOutAndCounted) {
  JobWindow window(100);
  // A plain free may come as free_completed alone.
  window.Add({Requested(0x99), Completed(0x98), Alloc(0xA, 10), Completed(0xA)}, 0);
  const Trace trace = window.ToTrace();
  EXPECT_EQ(trace.omitted.unmatched_frees, 2u);
  ASSERT_EQ(trace.events.size(), 3u);
  EXPECT_EQ(trace.events[1].op, TraceOp::kFreeRequested);
  MustReplay(trace);
}

// A push's watch measures what the job needs by this, as PyTorch's
// requested_bytes (an alloc to its free request), however the client's
// frees came: a reused id's lost free, a free_completed alone.
TEST(JobWindowTest, ItTalliesWhatTheJobAskedForAndItsPeakSinceAReset) {
  JobWindow window(4);  // the tally does not depend on what the window keeps
  window.Add({Alloc(0xA, 100), Alloc(0xB, 50), Requested(0xA)}, 0);
  EXPECT_EQ(window.requested_bytes(), 50);
  EXPECT_EQ(window.peak_requested_bytes(), 150);
  window.Add({Completed(0xA), Completed(0xB)}, 0);  // 0xB freed without a request
  EXPECT_EQ(window.requested_bytes(), 0);
  window.Add({Requested(0x99), Alloc(0xC, 30), Alloc(0xC, 40)}, 0);  // 0xC's free lost
  EXPECT_EQ(window.requested_bytes(), 40);
  EXPECT_EQ(window.peak_requested_bytes(), 150);
  window.ResetPeakRequested();
  EXPECT_EQ(window.peak_requested_bytes(), 40);
  window.Add({Alloc(0xD, 70), Requested(0xD)}, 0);
  EXPECT_EQ(window.peak_requested_bytes(), 110);
}

TEST(JobWindowTest, StreamsAreIndexedInHandleOrder) {
  JobWindow window(100);
  window.Add({Alloc(1, 10, 0x900), Alloc(2, 10, 0x100), Alloc(3, 10, 0x900)}, 0);
  const Trace trace = window.ToTrace();
  EXPECT_EQ(trace.streams, (std::vector<uint64_t>{0x100, 0x900}));
  EXPECT_EQ(trace.events[0].stream, 1);
  EXPECT_EQ(trace.events[1].stream, 0);
  EXPECT_EQ(trace.events[2].stream, 1);
}

// Streams are found again wherever they were first seen (the first few by
// a scan, the rest hashed); past 2^16 of them, the rest share the last.
TEST(JobWindowTest, ManyStreamsKeepTheirIndexAndThoseFarPastAnyJobShareOne) {
  JobWindow window(size_t{1} << 18);
  std::vector<EvidenceEvent> events;
  for (uint64_t s = 0; s < 10; ++s) events.push_back(Alloc(s, 10, 0x1000 - s));
  for (uint64_t s = 0; s < 10; ++s) events.push_back(Alloc(100 + s, 10, 0x1000 - s));
  window.Add(events, 0);
  Trace trace = window.ToTrace();
  ASSERT_EQ(trace.streams.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(trace.events[i].stream, trace.events[10 + i].stream) << i;
    EXPECT_EQ(trace.streams[trace.events[i].stream], 0x1000 - i);
  }
  events.clear();
  for (uint64_t s = 0; s < (uint64_t{1} << 16) + 10; ++s) {
    events.push_back(Alloc(1000 + s, 10, 0x100000 + s));
  }
  window.Add(events, 0);
  trace = window.ToTrace();
  EXPECT_EQ(trace.streams.size(), size_t{1} << 16);
  EXPECT_EQ(trace.events.size(), 20 + (size_t{1} << 16) + 10);
  // The last ones share the last index the window gave.
  EXPECT_EQ(trace.events.back().stream, trace.events[trace.events.size() - 11].stream);
  EXPECT_EQ(trace.events[0].stream, trace.events[10].stream);
}

TEST(JobWindowTest, AGapCountsUntilTheWindowMovesPastIt) {
  JobWindow window(30);
  window.Add(Churn(5), 0);
  window.Add(Churn(5), 7);
  EXPECT_TRUE(window.has_gap());
  EXPECT_EQ(window.dropped_events(), 7u);
  window.Add(Churn(10), 0);  // 30 newer events: the gap is out
  EXPECT_FALSE(window.has_gap());
  EXPECT_EQ(window.dropped_events(), 7u);
}

TEST(JobWindowTest, LlamaLoraReplaysAsRecordedAndInAnyWindow) {
  absl::StatusOr<Trace> recorded =
      ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  std::vector<EvidenceEvent> events;
  for (const TraceEvent& e : recorded->events) {
    events.push_back({e.op, recorded->streams[e.stream], e.id, e.size});
  }
  JobWindow all(recorded->events.size());
  all.Add(events, 0);
  const Trace whole = all.ToTrace();
  ASSERT_EQ(whole.events.size(), recorded->events.size());
  const ReplayResult a = MustReplay(whole);
  const ReplayResult b = MustReplay(*recorded);
  EXPECT_EQ(a.peak_reserved, b.peak_reserved);
  EXPECT_EQ(a.peak_allocated, b.peak_allocated);
  EXPECT_EQ(a.num_device_alloc, b.num_device_alloc);
  // Its tally of what the job asked for is the allocator's.
  EXPECT_EQ(all.peak_requested_bytes(), b.peak_requested);
  EXPECT_EQ(all.requested_bytes(), b.stats.requested_bytes.all().current);

  JobWindow half(recorded->events.size() / 2);
  half.Add(events, 0);
  const ReplayResult r = MustReplay(half.ToTrace());
  EXPECT_GT(r.peak_reserved, 0);
  // What the program asked for at any point of the window is what it had
  // asked for at that point of the run (blocks may round differently).
  EXPECT_LE(r.peak_requested, b.peak_requested);
  EXPECT_GT(r.peak_requested, b.peak_requested / 2);
}

// The allocator of a job that left 20 MiB segments cached before the window
// began (10 held, 10 cached), as its client reports it: what no window
// rebuilds.
constexpr uint64_t kBase = 0x7f0000000000;
AllocatorSnapshot FragmentedState(uint64_t held_id_base) {
  AllocatorSnapshot state;
  for (uint64_t i = 0; i < 20; ++i) {
    const uint64_t address = kBase + i * 20 * kMiB;
    state.segments.push_back({address, 20 * kMiB, 7, false, false});
    if (i % 2 == 0) {
      state.blocks.push_back({held_id_base + i, address, 20 * kMiB, 20 * kMiB, false});
    }
  }
  return state;
}

// One step: a 30 MiB activation, allocated and freed.
std::vector<EvidenceEvent> Step(uint64_t id) {
  return {Alloc(id, 30 * kMiB), Requested(id), Completed(id)};
}

TEST(JobWindowTest, AStateIsReplayedFromWithTheEventsAfterIt) {
  JobWindow window(1000);
  // Two of the held blocks were allocated while the window recorded; 0x777
  // too, but the client's state does not hold it (its free was lost).
  window.Add({Alloc(0x100, 20 * kMiB), Alloc(0x102, 20 * kMiB), Alloc(0x777, kMiB)}, 0);
  window.Add(Step(0x900), 0);
  AllocatorSnapshot state = FragmentedState(0x100);
  ASSERT_TRUE(window.AddState(state));
  EXPECT_EQ(window.StateSeqs(), std::vector<uint64_t>{6});
  window.Add(Step(0x901), 0);
  window.Add({Requested(0x102), Completed(0x102), Completed(0x777)}, 0);

  const Trace trace = window.ToTraceFromState(6);
  EXPECT_TRUE(trace.partial.reconstructed());
  ASSERT_EQ(trace.partial.segments.size(), 20u);
  ASSERT_EQ(trace.partial.blocks.size(), 10u);
  EXPECT_EQ(trace.partial.segments[3].address, kBase + 60 * kMiB);
  EXPECT_EQ(trace.partial.blocks[1].address, kBase + 40 * kMiB);
  // The events after the state: the step, then 0x102's free (a block the
  // window saw allocated: the state's block 1); 0x777's is left out.
  ASSERT_EQ(trace.events.size(), 5u);
  EXPECT_EQ(trace.events[0].op, TraceOp::kAlloc);
  EXPECT_EQ(trace.events[0].size, 30 * kMiB);
  EXPECT_EQ(trace.events[3], (TraceEvent{TraceOp::kFreeRequested, 0, 1, 0}));
  EXPECT_EQ(trace.events[4], (TraceEvent{TraceOp::kFreeCompleted, 0, 1, 0}));
  EXPECT_EQ(trace.omitted.unmatched_frees, 2u);  // its free_requested and free_completed
  // The replay holds the 400 MiB of segments from the start: the step's
  // 30 MiB fits in none of the cached 20 MiB ones.
  const ReplayResult r = MustReplay(trace);
  EXPECT_EQ(r.peak_reserved, static_cast<int64_t>(430 * kMiB));
  // From the window alone: the blocks it saw, and the step.
  EXPECT_EQ(MustReplay(window.ToTrace()).peak_reserved, static_cast<int64_t>(72 * kMiB));
}

// What the client holds counts the blocks a state showed held that the
// stream never allocated, until their free: a replay from the state counts
// them too, and a push's growth is measured against it.
TEST(JobWindowTest, BlocksAStateHeldOutsideTheStreamCountUntilTheirFree) {
  JobWindow window(1000);
  window.Add({Alloc(0x100, 20 * kMiB), Alloc(0x102, 20 * kMiB)}, 0);
  const int64_t stream = window.requested_bytes();
  EXPECT_EQ(window.held_requested_bytes(), stream);
  // Ten held blocks of 20 MiB, two of them the stream's own.
  ASSERT_TRUE(window.AddState(FragmentedState(0x100)));
  EXPECT_EQ(window.requested_bytes(), stream);
  EXPECT_EQ(window.held_requested_bytes(), stream + static_cast<int64_t>(8 * 20 * kMiB));
  EXPECT_EQ(window.peak_held_requested_bytes(), window.held_requested_bytes());
  // A later state showing them again adds nothing.
  window.Add(Step(0x900), 0);
  ASSERT_TRUE(window.AddState(FragmentedState(0x100)));
  EXPECT_EQ(window.held_requested_bytes(), stream + static_cast<int64_t>(8 * 20 * kMiB));
  // One is freed (its free is no event of the window's), another's
  // address is allocated anew: both are gone.
  window.ResetPeakRequested();
  window.Add({Requested(0x104), Completed(0x104), Alloc(0x106, kMiB)}, 0);
  EXPECT_EQ(window.held_requested_bytes(),
            stream + static_cast<int64_t>(6 * 20 * kMiB + kMiB));
  // The peak since the reset was at the reset; an allocation past it moves it.
  EXPECT_EQ(window.peak_held_requested_bytes(),
            stream + static_cast<int64_t>(8 * 20 * kMiB));
  window.Add({Alloc(0x200, 100 * kMiB)}, 0);
  EXPECT_EQ(window.peak_held_requested_bytes(),
            stream + static_cast<int64_t>(6 * 20 * kMiB + kMiB + 100 * kMiB));
}

TEST(JobWindowTest, AStateTakenAfterAGapRestartsTheWindowThere) {
  JobWindow window(1000);
  window.Add({Alloc(0x100, 20 * kMiB), Alloc(0x102, 20 * kMiB), Alloc(0x777, kMiB)}, 0);
  ASSERT_TRUE(window.AddState(FragmentedState(0x100)));  // before the gap
  window.Add(Step(0x900), 5);
  EXPECT_FALSE(window.RestartAtStateAfterGap());
  // Told with no events: the state may have been taken before the loss.
  window.Add({}, 3);
  ASSERT_TRUE(window.AddState(FragmentedState(0x100)));
  EXPECT_FALSE(window.RestartAtStateAfterGap());
  EXPECT_TRUE(window.has_gap());

  window.Add(Step(0x901), 0);
  ASSERT_TRUE(window.AddState(FragmentedState(0x100)));
  const uint64_t at = window.total_events();
  EXPECT_TRUE(window.RestartAtStateAfterGap());
  EXPECT_FALSE(window.has_gap());
  EXPECT_EQ(window.size(), 0u);
  EXPECT_EQ(window.StateSeqs(), std::vector<uint64_t>{at});
  EXPECT_EQ(window.dropped_events(), 8u);
  EXPECT_FALSE(window.RestartAtStateAfterGap());

  window.Add(Step(0x902), 0);
  window.Add({Requested(0x102), Completed(0x102)}, 0);
  const Trace from_state = window.ToTraceFromState(at);
  EXPECT_EQ(from_state.partial.blocks.size(), 10u);
  ASSERT_EQ(from_state.events.size(), 5u);
  EXPECT_EQ(from_state.events[0].size, 30 * kMiB);
  // The whole window: what the stream left live at the state (0x100, 0x102
  // and 0x777, whose free the gap may have lost), then the events after it.
  const Trace whole = window.ToTrace();
  ASSERT_EQ(whole.events.size(), 3u + 5u);
  EXPECT_EQ(whole.events[0], (TraceEvent{TraceOp::kAlloc, 0, 0, 20 * kMiB}));
  EXPECT_EQ(whole.events[2], (TraceEvent{TraceOp::kAlloc, 0, 2, kMiB}));
}

TEST(JobWindowTest, AStateThatCannotBeReplayedIsNotKept) {
  JobWindow window(1000);
  AllocatorSnapshot outside = FragmentedState(0x100);
  outside.blocks.push_back({0x1, kBase + 400 * kMiB, kMiB, kMiB, false});
  EXPECT_FALSE(window.AddState(outside));
  AllocatorSnapshot overlapping_segments = FragmentedState(0x100);
  overlapping_segments.segments.push_back({kBase + kMiB, 2 * kMiB, 7, true, false});
  EXPECT_FALSE(window.AddState(overlapping_segments));
  AllocatorSnapshot overlapping_blocks = FragmentedState(0x100);
  overlapping_blocks.blocks.push_back({0x2, kBase + kMiB, kMiB, kMiB, false});
  EXPECT_FALSE(window.AddState(overlapping_blocks));
  AllocatorSnapshot empty_segment = FragmentedState(0x100);
  empty_segment.segments.push_back({kBase + 500 * kMiB, 0, 7, false, false});
  EXPECT_FALSE(window.AddState(empty_segment));
  AllocatorSnapshot asks_past_its_size = FragmentedState(0x100);
  asks_past_its_size.blocks[0].requested_size = asks_past_its_size.blocks[0].size + 1;
  EXPECT_FALSE(window.AddState(asks_past_its_size));
  AllocatorSnapshot huge_segment = FragmentedState(0x100);
  huge_segment.segments.push_back({uint64_t{1} << 50, kMaxEventBytes + 1, 7, false, false});
  EXPECT_FALSE(window.AddState(huge_segment));
  EXPECT_TRUE(window.StateSeqs().empty());
  EXPECT_TRUE(window.ToTraceFromState(0).events.empty());
}

// Sizes no device holds cannot make what the window sums overflow (a
// client could send them; the daemon refuses them at the wire too): the
// window stops, or refuses the state, before passing kMaxHeldBytes.
TEST(JobWindowTest, WhatNoDeviceHoldsStopsTheWindowBeforeItsSumsOverflow) {
  {
    JobWindow window(1000);
    window.Add({Alloc(0x100, kMiB), Alloc(0x200, kMaxEventBytes + 1), Alloc(0x300, kMiB)}, 0);
    EXPECT_TRUE(window.stopped());
    EXPECT_EQ(window.size(), 0u);
  }
  {
    // 2^12 allocations of 2^48 bytes reach 2^60; the next one stops it.
    JobWindow window(1 << 14);
    std::vector<EvidenceEvent> events;
    for (uint64_t i = 0; i < 4096; ++i) events.push_back(Alloc(0x1000 + i, kMaxEventBytes));
    window.Add(events, 0);
    ASSERT_FALSE(window.stopped());
    EXPECT_EQ(window.held_requested_bytes(), JobWindow::kMaxHeldBytes);
    window.Add({Alloc(0x9999, 1)}, 0);
    EXPECT_TRUE(window.stopped());
  }
  {
    // A state whose blocks outside the stream would pass the bound.
    JobWindow window(1 << 14);
    std::vector<EvidenceEvent> events;
    for (uint64_t i = 0; i < 4095; ++i) events.push_back(Alloc(0x1000 + i, kMaxEventBytes));
    window.Add(events, 0);
    AllocatorSnapshot state;
    const uint64_t base = uint64_t{1} << 52;
    for (uint64_t i = 0; i < 2; ++i) {
      state.segments.push_back({base + i * kMaxEventBytes, kMaxEventBytes, 7, false, false});
      state.blocks.push_back({0x5000 + i, base + i * kMaxEventBytes, kMaxEventBytes,
                              kMaxEventBytes, false});
    }
    EXPECT_FALSE(window.AddState(state));
    EXPECT_EQ(window.held_requested_bytes(), JobWindow::kMaxHeldBytes - kMaxEventBytes);
    state.segments.pop_back();
    state.blocks.pop_back();
    EXPECT_TRUE(window.AddState(state));
    EXPECT_EQ(window.held_requested_bytes(), JobWindow::kMaxHeldBytes);
  }
}

TEST(JobWindowTest, StatesGoWhenTheWindowPassesThemAndTheNewestAreKept) {
  JobWindow window(30);
  for (uint64_t i = 0; i < JobWindow::kMaxStates + 2; ++i) {
    window.Add(Step(0x900 + i), 0);
    ASSERT_TRUE(window.AddState(FragmentedState(0x100)));
  }
  std::vector<uint64_t> seqs = window.StateSeqs();
  ASSERT_EQ(seqs.size(), JobWindow::kMaxStates);
  EXPECT_EQ(seqs.back(), window.total_events());
  EXPECT_EQ(seqs.front(), 3 * 3u);
  // Past the window's start, a state has no events to replay: gone.
  window.Add(Churn(8), 0);
  seqs = window.StateSeqs();
  ASSERT_FALSE(seqs.empty());
  EXPECT_GE(seqs.front(), window.total_events() - window.size());
  EXPECT_LT(seqs.size(), JobWindow::kMaxStates);
}

}  // namespace
}  // namespace allocd
