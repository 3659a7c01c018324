#include "server/autotune/decider.h"

#include <string>
#include <vector>

#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "gtest/gtest.h"
#include "tests/trace/trace_builder.h"
#include "tuner/search_space.h"
#include "tuner/tuner.h"

namespace allocd {
namespace {

const Trace& LlamaLora() {
  static const Trace* trace = [] {
    absl::StatusOr<Trace> t =
        ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz");
    EXPECT_TRUE(t.ok()) << t.status();
    return new Trace(t.ok() ? *std::move(t) : Trace{});
  }();
  return *trace;
}

RunningConfig Running(const std::string& conf) {
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(conf);
  EXPECT_TRUE(config.ok()) << config.status();
  return RunningConfig{config.ok() ? *config : AllocatorConfig{}, std::nullopt};
}

DecideOptions Options() {
  DecideOptions options;
  options.threads = 2;
  return options;
}

// What a proposal does when replayed on its own: the window under the
// running config, switched live to the proposal at the decision's point.
ReplayPhase ReplayProposal(const Trace& trace, const RunningConfig& running, const Decision& d,
                           uint64_t capacity) {
  ReplayOptions options;
  options.capacity = capacity;
  options.live_switch = LiveSwitch{d.switch_event,
                                   *ParseAllocatorConfigUpdate(d.to_config, running.config),
                                   d.to.memory_fraction};
  absl::StatusOr<ReplayResult> r = Replay(trace, running.config, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r->after_switch : ReplayPhase{};
}

TEST(DecideTest, LlamaLoraStartedOnTheGuidesConfigGetsAMuchLowerPeak) {
  const RunningConfig running = Running("max_split_size_mb:64");
  const Decision d = Decide(LlamaLora(), running, JobPolicy{}, Options());
  ASSERT_EQ(d.result, Decision::Result::kPropose) << d.why;
  EXPECT_TRUE(d.step_events.has_value());
  EXPECT_LT(d.predicted_peak_switched, d.predicted_peak_current / 2) << d.why;
  EXPECT_NE(d.to.config, running.config);
  // The prediction is what the switch does.
  const ReplayPhase after = ReplayProposal(LlamaLora(), running, d, 0);
  EXPECT_EQ(after.peak_reserved, d.predicted_peak_switched);
  EXPECT_EQ(after.num_ooms, 0);
  EXPECT_GT(d.candidates, 1u);
  EXPECT_NE(d.why.find("saves"), std::string::npos) << d.why;
}

// The target: after the push, the job's peak over the rest of the
// run is within 5% of what the best config reaches on those steps. The
// online search (a small space, a budget of 32) against the tuner's full
// default space with a budget of 200, both switching live at the same point.
TEST(DecideTest, TheOnlineSearchComesWithinFivePercentOfTheFullSearch) {
  const RunningConfig running = Running("max_split_size_mb:64");
  const Decision d = Decide(LlamaLora(), running, JobPolicy{}, Options());
  ASSERT_EQ(d.result, Decision::Result::kPropose) << d.why;
  TuneOptions full;
  full.jobs = 2;
  full.budget = 200;
  full.live_start = LiveStart{running.config, std::nullopt, d.switch_event};
  SearchSpace space = DefaultSearchSpace();
  space.base = running.config;
  space.garbage_collection = {GcSetting{}};  // no fraction, as for the job
  absl::StatusOr<TuneReport> report = Tune(LlamaLora(), space, full);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_NE(report->recommended(), nullptr);
  EXPECT_LE(static_cast<double>(d.predicted_peak_switched),
            1.05 * static_cast<double>(report->recommended()->replay.peak_reserved))
      << d.why << "\nfull search: " << report->recommended()->key;
}

TEST(SizeFittedSettingsTest, CountsEachSettingFittedToSizesOnce) {
  const auto settings = [](const std::string& conf, std::optional<double> fraction = {}) {
    return SizeFittedSettings(Candidate{Running(conf).config, fraction});
  };
  EXPECT_EQ(settings(""), 0);
  EXPECT_EQ(settings("expandable_segments:True"), 0);  // serves any size
  EXPECT_EQ(settings("roundup_power2_divisions:8,expandable_segments:True"), 1);
  EXPECT_EQ(settings("max_split_size_mb:256,max_non_split_rounding_mb:256,"
                     "garbage_collection_threshold:0.6"),
            3);
  EXPECT_EQ(settings("", 0.5), 1);
  EXPECT_EQ(settings("per_process_memory_fraction:0.5", 0.5), 1);
}

Evaluation Evaluated(const std::string& conf, int64_t peak_mib) {
  Evaluation e;
  e.candidate = Candidate{Running(conf).config, std::nullopt};
  e.key = conf;
  e.replay.peak_reserved = peak_mib << 20;
  return e;
}

const std::string& ProposalOf(const std::vector<Evaluation>& ranked, double simpler_within) {
  std::vector<const Evaluation*> passing;
  for (const Evaluation& e : ranked) passing.push_back(&e);
  const Evaluation* chosen = ChooseProposal(passing, simpler_within);
  EXPECT_NE(chosen, nullptr);
  static const std::string none = "(none)";
  return chosen != nullptr ? chosen->key : none;
}

// A setting that saves little on the window's steps is fitted to their
// sizes: of the candidates near the lowest peak, the one with the fewest
// such settings is proposed.
TEST(ChooseProposalTest, OfTheCandidatesNearTheLowestPeakTheOneFittedLeastIsProposed) {
  const std::vector<Evaluation> ranked = {
      Evaluated("roundup_power2_divisions:8,expandable_segments:True", 1000),
      Evaluated("max_split_size_mb:256,expandable_segments:True", 1005),
      Evaluated("expandable_segments:True", 1015),
      Evaluated("", 1150),
  };
  EXPECT_EQ(ProposalOf(ranked, 0.0), ranked[0].key);
  EXPECT_EQ(ProposalOf(ranked, 0.01), ranked[0].key);  // one setting each: the lowest
  EXPECT_EQ(ProposalOf(ranked, 0.02), ranked[2].key);
  // expandable_segments is fitted to no size: the lower peak of two with none.
  EXPECT_EQ(ProposalOf(ranked, 0.5), ranked[2].key);
  const std::vector<Evaluation> fitted = {
      Evaluated("max_split_size_mb:256,roundup_power2_divisions:4", 1000),
      Evaluated("max_split_size_mb:512", 1010),
      Evaluated("max_split_size_mb:128", 1012),
  };
  EXPECT_EQ(ProposalOf(fitted, 0.02), fitted[1].key);  // the earliest of the fewest
  EXPECT_EQ(ChooseProposal({}, 0.02), nullptr);
}

// The safe config of a harmful start, on a window without a whole step, is
// proposed unless another peaks at least min_saving below it.
TEST(PreferUnlessBeatenTest, ThePreferredConfigUnlessAnotherPeaksClearlyLower) {
  const std::vector<Evaluation> ranked = {
      Evaluated("", 1000),
      Evaluated("roundup_power2_divisions:4", 1010),
      Evaluated("expandable_segments:True", 1040),
  };
  std::vector<const Evaluation*> passing;
  for (const Evaluation& e : ranked) passing.push_back(&e);
  const AllocatorConfig expandable = Running("expandable_segments:True").config;
  // 3.8% lower: not enough.
  EXPECT_EQ(PreferUnlessBeaten(passing, passing[0], expandable, 0.05), passing[2]);
  // 3.8% is enough for a 3% margin.
  EXPECT_EQ(PreferUnlessBeaten(passing, passing[0], expandable, 0.03), passing[0]);
  // Not among the candidates that pass: the best.
  const std::vector<const Evaluation*> without(passing.begin(), passing.begin() + 2);
  EXPECT_EQ(PreferUnlessBeaten(without, passing[0], expandable, 0.05), passing[0]);
  // Only as itself, not with a memory fraction.
  Evaluation capped = ranked[2];
  capped.candidate.memory_fraction = 0.5;
  EXPECT_EQ(PreferUnlessBeaten({passing[0], &capped}, passing[0], expandable, 0.05), passing[0]);
  EXPECT_EQ(PreferUnlessBeaten(passing, nullptr, expandable, 0.05), nullptr);
}

// Batches of decoding, each with a KV cache of 96 or 120 MiB, on
// max_split_size_mb:64, with a step mark after each batch in `marks`: from
// the first 120 MiB cache (event 218) on, PyTorch's defaults and expandable
// segments peak alike, and the defaults rank first.
Trace DecodedBatches(std::vector<uint64_t>& marks) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  TraceBuilder b;
  uint64_t events = 0;
  for (int batch = 0; batch < 40; ++batch) {
    const uint32_t cache = b.Alloc((96 + 24 * (batch % 2)) * kMiB);
    for (int token = 0; token < 6; ++token) {
      std::vector<uint32_t> temporaries;
      for (int layer = 0; layer < 12; ++layer) {
        temporaries.push_back(b.Alloc((3 + layer % 5) * kMiB));
      }
      for (uint32_t t : temporaries) b.Free(t);
    }
    b.Free(cache);
    events += 2 + 6 * 12 * 3;
    marks.push_back(events);
  }
  return b.Build();
}

// The preferred config is for a window that is not the job's own steps: on
// two or more step marks, the lowest peak is proposed as ever.
TEST(DecideTest, ThePreferredConfigOnlyWithoutTwoMarkedSteps) {
  std::vector<uint64_t> marks;
  const Trace trace = DecodedBatches(marks);
  const RunningConfig running = Running("max_split_size_mb:64");
  DecideOptions options = Options();
  options.preferred = Running("expandable_segments:True").config;
  options.cover_from = 218;
  const Decision unmarked = Decide(trace, running, JobPolicy{}, options);
  ASSERT_EQ(unmarked.result, Decision::Result::kPropose) << unmarked.why;
  EXPECT_EQ(unmarked.to_config, "expandable_segments:True") << unmarked.why;
  EXPECT_NE(unmarked.why.find("chosen over (defaults), which peaks as low"), std::string::npos)
      << unmarked.why;
  options.step_ends = marks;
  const Decision marked = Decide(trace, running, JobPolicy{}, options);
  ASSERT_EQ(marked.result, Decision::Result::kPropose) << marked.why;
  EXPECT_NE(marked.why.find("the job marked 40 steps"), std::string::npos) << marked.why;
  EXPECT_NE(marked.to_config, "expandable_segments:True") << marked.why;
  EXPECT_EQ(marked.why.find("the safe one"), std::string::npos) << marked.why;
}

TEST(DecideTest, ACandidateThatWouldRunOutOfMemoryIsNeverProposed) {
  const RunningConfig running = Running("max_split_size_mb:64");
  absl::StatusOr<ReplayResult> plain = Replay(LlamaLora(), running.config);
  ASSERT_TRUE(plain.ok());
  // Devices from barely above the job's peak allocated memory up: on the
  // small ones some candidates run out of memory.
  bool oom_left_out = false;
  for (double headroom : {1.02, 1.05, 1.1}) {
    DecideOptions tight = Options();
    tight.capacity = static_cast<uint64_t>(headroom * static_cast<double>(plain->peak_allocated));
    const Decision d = Decide(LlamaLora(), running, JobPolicy{}, tight);
    oom_left_out |= d.why.find("run out of memory") != std::string::npos;
    if (d.result == Decision::Result::kPropose) {
      EXPECT_EQ(ReplayProposal(LlamaLora(), running, d, tight.capacity).num_ooms, 0) << d.why;
    }
  }
  EXPECT_TRUE(oom_left_out);
}

TEST(DecideTest, PinnedKeysKeepTheJobsValue) {
  const RunningConfig running = Running("max_split_size_mb:64");
  JobPolicy policy;
  policy.pinned_keys = {"expandable_segments", "max_split_size_mb"};
  const Decision d = Decide(LlamaLora(), running, policy, Options());
  EXPECT_NE(d.result, Decision::Result::kSkip) << d.why;
  if (d.result == Decision::Result::kPropose) {
    EXPECT_FALSE(d.to.config.expandable_segments);
    EXPECT_EQ(d.to.config.max_split_size, running.config.max_split_size);
  }
}

// llama_lora from max_split_size_mb:64 is proposed expandable segments
// (above); a job that shares its CUDA tensors must not get them, and the
// decision names what it left out.
TEST(DecideTest, AJobThatSharesCudaTensorsIsNeverPushedExpandableSegments) {
  const RunningConfig running = Running("max_split_size_mb:64");
  const Decision free_to = Decide(LlamaLora(), running, JobPolicy{}, Options());
  ASSERT_EQ(free_to.result, Decision::Result::kPropose) << free_to.why;
  ASSERT_TRUE(free_to.to.config.expandable_segments) << free_to.to_config;
  EXPECT_TRUE(free_to.left_out.empty());

  DecideOptions options = Options();
  options.features.cuda_ipc = true;
  const Decision d = Decide(LlamaLora(), running, JobPolicy{}, options);
  ASSERT_NE(d.result, Decision::Result::kSkip) << d.why;
  if (d.result == Decision::Result::kPropose) {
    EXPECT_FALSE(d.to.config.expandable_segments) << d.to_config;
  }
  ASSERT_FALSE(d.left_out.empty()) << d.why;
  for (const LeftOutConfig& l : d.left_out) {
    EXPECT_NE(l.config.find("expandable_segments:True"), std::string::npos) << l.config;
    EXPECT_NE(l.why.find("pidfd_getfd"), std::string::npos) << l.why;
  }
  EXPECT_NE(d.why.find("left out for what the job does (cuda_ipc)"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find(d.left_out.front().config), std::string::npos) << d.why;
}

// A job started on expandable segments shares what its consumers already
// open: nothing is left out for it.
TEST(DecideTest, AJobAlreadyOnExpandableSegmentsLeavesNothingOutForSharing) {
  DecideOptions options = Options();
  options.features.cuda_ipc = true;
  const Decision d =
      Decide(LlamaLora(), Running("expandable_segments:True,max_split_size_mb:64"), JobPolicy{},
             options);
  ASSERT_NE(d.result, Decision::Result::kSkip) << d.why;
  EXPECT_TRUE(d.left_out.empty()) << d.left_out.front().config;
}

TEST(DecideTest, AMemoryFractionOnlyWhenTheJobAllowsIt) {
  const RunningConfig running = Running("max_split_size_mb:64");
  DecideOptions options = Options();
  options.total_memory = uint64_t{80} << 30;
  const Decision no = Decide(LlamaLora(), running, JobPolicy{}, options);
  ASSERT_EQ(no.result, Decision::Result::kPropose) << no.why;
  EXPECT_FALSE(no.to.memory_fraction.has_value());
  JobPolicy allow;
  allow.allow_memory_fraction = true;
  const Decision yes = Decide(LlamaLora(), running, allow, options);
  ASSERT_EQ(yes.result, Decision::Result::kPropose) << yes.why;
  // Fractions were in the running: the search saw more candidates.
  EXPECT_GT(yes.candidates, no.candidates);
  EXPECT_LE(yes.predicted_peak_switched, no.predicted_peak_switched);
}

TEST(DecideTest, TheBestConfigIsKept) {
  const RunningConfig guides = Running("max_split_size_mb:64");
  const Decision first = Decide(LlamaLora(), guides, JobPolicy{}, Options());
  ASSERT_EQ(first.result, Decision::Result::kPropose) << first.why;
  // Once the job runs the proposal, nothing better is left to push.
  const RunningConfig now{*ParseAllocatorConfigUpdate(first.to_config, guides.config),
                          first.to.memory_fraction};
  const Decision second = Decide(LlamaLora(), now, JobPolicy{}, Options());
  EXPECT_EQ(second.result, Decision::Result::kKeep) << second.why;
}

TEST(DecideTest, SkipsATooSmallWindowAndCudaMallocAsync) {
  TraceBuilder b;
  b.Free(b.Alloc(1000));
  EXPECT_EQ(Decide(b.Build(), RunningConfig{}, JobPolicy{}, Options()).result,
            Decision::Result::kSkip);
  const Decision d =
      Decide(LlamaLora(), Running("backend:cudaMallocAsync"), JobPolicy{}, Options());
  EXPECT_EQ(d.result, Decision::Result::kSkip);
  EXPECT_NE(d.why.find("cudaMallocAsync"), std::string::npos);
}

// Steps of a job that cuts its temporaries from one buffer: a 480 MiB
// buffer used and freed, then two requests of `mids[k]` MiB held while the
// buffer is asked for again; `marks` gets each step's end. Under PyTorch's
// defaults the first request splits the cached buffer, so the buffer asked
// again needs a segment of its own; max_split_size_mb:256 keeps the buffer
// whole, as a block too large to split, and the requests of 256 MiB and
// more take blocks of their own that the next steps' requests reuse
// whole when they are at most max_non_split_rounding_mb (20) smaller.
Trace SplitBufferSteps(const std::vector<uint64_t>& mids, std::vector<uint64_t>& marks) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  TraceBuilder b;
  uint64_t events = 0;
  for (uint64_t mid : mids) {
    b.Free(b.Alloc(480 * kMiB));
    const uint32_t first = b.Alloc(mid * kMiB);
    const uint32_t second = b.Alloc(mid * kMiB);
    const uint32_t buffer = b.Alloc(480 * kMiB);
    b.Free(first).Free(second).Free(buffer);
    events += 12;
    marks.push_back(events);
  }
  return b.Build();
}

// Without expandable segments (pinned off), from PyTorch's defaults.
Decision DecideWithoutExpandableSegments(const Trace& trace, const std::vector<uint64_t>& marks,
                                         bool pinned = true) {
  DecideOptions options = Options();
  options.min_events = 0;
  options.step_ends = marks;
  JobPolicy policy;
  if (pinned) policy.pinned_keys = {"expandable_segments"};
  return Decide(trace, RunningConfig{}, policy, options);
}

// Steps of 300 and 282 MiB requests: max_split_size_mb keeps the buffer
// whole (1.05 GiB against 1.23 GiB staying, 14% less) as long as the
// 282 MiB ones reuse the 300 MiB blocks whole. Grown by a quarter, they ask
// 352.5 MiB of blocks of 376: more than max_non_split_rounding_mb smaller,
// so every step of a new size takes blocks of its own, and the split limit
// costs more than it saves.
TEST(DecideTest, ASplitLimitFittedToTheWindowsSizesIsNotPushedWhenItLosesOnLargerOnes) {
  std::vector<uint64_t> marks;
  const Trace trace = SplitBufferSteps({300, 282, 300, 282, 300, 282, 300, 282}, marks);
  const Decision d = DecideWithoutExpandableSegments(trace, marks);
  EXPECT_NE(d.result, Decision::Result::kPropose) << d.why;
  EXPECT_NE(d.why.find("when the sizes grow by 25%"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("max_split_size_mb"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("a config fitted to the sizes seen can cost memory on sizes the job has "
                       "not shown yet, so it is not pushed"),
            std::string::npos)
      << d.why;
}

// The same steps with requests of one size: the split limit's blocks are
// reused whole at any size, and its gain holds when the sizes grow.
TEST(DecideTest, ASplitLimitWhoseGainHoldsWhenTheSizesGrowIsPushed) {
  std::vector<uint64_t> marks;
  const Trace trace = SplitBufferSteps(std::vector<uint64_t>(8, 300), marks);
  const Decision d = DecideWithoutExpandableSegments(trace, marks);
  ASSERT_EQ(d.result, Decision::Result::kPropose) << d.why;
  EXPECT_GT(SizeFittedSettings(d.to), 0) << d.to_config;
  EXPECT_NE(d.why.find("when the sizes grow by 25% it peaks"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("its gain does not depend on the window's exact sizes"), std::string::npos)
      << d.why;
}

// Expandable segments are fitted to no size: on the steps whose split
// limit is refused, they are pushed without a check on grown sizes.
TEST(DecideTest, ExpandableSegmentsAreFittedToNoSizeAndArePushed) {
  std::vector<uint64_t> marks;
  const Trace trace = SplitBufferSteps({300, 282, 300, 282, 300, 282, 300, 282}, marks);
  const Decision d = DecideWithoutExpandableSegments(trace, marks, /*pinned=*/false);
  ASSERT_EQ(d.result, Decision::Result::kPropose) << d.why;
  EXPECT_EQ(d.to_config, "expandable_segments:True") << d.why;
  EXPECT_EQ(d.why.find("when the sizes grow"), std::string::npos) << d.why;
}

TEST(LiveConfigStringTest, NamesWhatPersistsAcrossUpdates) {
  const AllocatorConfig running = *ParseAllocatorConfig("expandable_segments:True");
  const AllocatorConfig target = *ParseAllocatorConfig("max_split_size_mb:256");
  const std::string conf = LiveConfigString(target, running);
  EXPECT_EQ(*ParseAllocatorConfigUpdate(conf, running), target);
  EXPECT_EQ(*ParseAllocatorConfig(conf), target);
  // Where the canonical string suffices, it is the one.
  EXPECT_EQ(LiveConfigString(target, AllocatorConfig{}), "max_split_size_mb:256");
}

}  // namespace
}  // namespace allocd
