#include "server/autotune/start_config.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

AllocatorConfig Parse(const std::string& conf) {
  absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(conf);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : AllocatorConfig{};
}

std::string Canonical(const std::string& conf) { return FormatAllocatorConfig(Parse(conf)); }

std::pair<JobKey, LearnedConfig> Learned(const TenantId& tenant, const std::string& job,
                                         const std::string& config) {
  return {JobKey{.tenant = tenant, .job = job}, LearnedConfig{.config = config}};
}

TEST(StartConfigTest, SourcesAreNamedAsTheMetricAndStatsSayThem) {
  EXPECT_STREQ(StartConfigSourceName(StartConfigSource::kOwn), "own");
  EXPECT_STREQ(StartConfigSourceName(StartConfigSource::kLearned), "learned");
  EXPECT_STREQ(StartConfigSourceName(StartConfigSource::kPrior), "prior");
  EXPECT_STREQ(StartConfigSourceName(StartConfigSource::kReplaced), "replaced");
}

TEST(StartConfigTest, ALearnedRunStreamsOncePastItsPeakAndTheGrowthMargin) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  LearnedConfig learned{.config = "expandable_segments:True"};
  // Nothing known of its peak: it streams from the start.
  EXPECT_EQ(StreamFromReserved(learned, 0.10), 0u);
  learned.predicted_peak_switched = 10 * kGiB;
  EXPECT_EQ(StreamFromReserved(learned, 0.10), static_cast<uint64_t>(11 * kGiB));
  // The larger of what it reached and what was predicted.
  learned.realized_peak = 20 * kGiB;
  EXPECT_EQ(StreamFromReserved(learned, 0.10), static_cast<uint64_t>(22 * kGiB));
  learned.realized_peak = 5 * kGiB;
  EXPECT_EQ(StreamFromReserved(learned, 0.50), static_cast<uint64_t>(15 * kGiB));
  EXPECT_EQ(StreamFromReserved(learned, -1.0), static_cast<uint64_t>(10 * kGiB));
}

TEST(StartConfigTest, SmallMaxSplitWithoutExpandableSegmentsIsHarmful) {
  EXPECT_TRUE(IsHarmfulStartConfig(Parse("max_split_size_mb:64")));
  EXPECT_TRUE(IsHarmfulStartConfig(Parse("max_split_size_mb:128")));
  EXPECT_FALSE(IsHarmfulStartConfig(Parse("max_split_size_mb:256")));
  EXPECT_FALSE(IsHarmfulStartConfig(Parse("max_split_size_mb:64,expandable_segments:True")));
  EXPECT_FALSE(IsHarmfulStartConfig(Parse("")));
}

TEST(StartConfigTest, TheSaferConfigDropsMaxSplitAndAddsExpandableSegmentsKeepingTheRest) {
  EXPECT_EQ(FormatAllocatorConfig(SaferStartConfig(
                Parse("max_split_size_mb:64,garbage_collection_threshold:0.8"))),
            Canonical("expandable_segments:True,garbage_collection_threshold:0.8"));
}

TEST(StartConfigTest, TheFlagIsLearnedOffOrAConfigPyTorchAccepts) {
  EXPECT_EQ(ParsePriorSetting("learned")->kind, PriorSetting::Kind::kLearned);
  EXPECT_EQ(ParsePriorSetting("off")->kind, PriorSetting::Kind::kOff);
  absl::StatusOr<PriorSetting> fixed = ParsePriorSetting("expandable_segments:True");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->kind, PriorSetting::Kind::kFixed);
  EXPECT_EQ(fixed->config, Canonical("expandable_segments:True"));
  absl::StatusOr<PriorSetting> bad = ParsePriorSetting("max_split_size_mb:1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--autotune-prior"), std::string::npos)
      << bad.status();
  // Learned comes with the seed.
  EXPECT_EQ(ParsePriorSetting("learned")->seed, Canonical(kDefaultSeedPrior));
}

TEST(StartConfigTest, TheSeedFlagIsOffOrAConfigPyTorchAccepts) {
  absl::StatusOr<std::optional<std::string>> off = ParseSeedPrior("off");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->has_value());
  absl::StatusOr<std::optional<std::string>> seed =
      ParseSeedPrior("garbage_collection_threshold:0.8, expandable_segments:True");
  ASSERT_TRUE(seed.ok()) << seed.status();
  EXPECT_EQ(*seed, Canonical("expandable_segments:True,garbage_collection_threshold:0.8"));
  absl::StatusOr<std::optional<std::string>> bad = ParseSeedPrior("learned");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--autotune-seed-prior must be off or a "
                                        "PYTORCH_CUDA_ALLOC_CONF"),
            std::string::npos)
      << bad.status();
}

TEST(StartConfigTest, ThePriorIsWhatAtLeastThreeOfTheTenantsJobsSettledOn) {
  const std::string es = Canonical("expandable_segments:True");
  std::vector<std::pair<JobKey, LearnedConfig>> learned = {
      Learned("a", "j1", "expandable_segments:True"),
      Learned("a", "j2", es),
      Learned("a", "j3", "max_split_size_mb:512"),
  };
  // Two agree: no prior of the node's jobs, the seed.
  EXPECT_TRUE(FindPrior(learned, "a", PriorSetting{})->seed);
  EXPECT_FALSE(FindPrior(learned, "a", {.seed = std::nullopt}).has_value());
  learned.push_back(Learned("a", "j4", es));
  std::optional<Prior> prior = FindPrior(learned, "a", PriorSetting{});
  ASSERT_TRUE(prior.has_value());
  EXPECT_EQ(prior->config, es);
  EXPECT_EQ(prior->jobs, 3u);
  EXPECT_EQ(prior->scope, "tenant a");
  EXPECT_FALSE(prior->seed);
  EXPECT_FALSE(FindPrior(learned, "a", {.kind = PriorSetting::Kind::kOff}).has_value());
}

TEST(StartConfigTest, WithoutATenantPriorTheNodesJobsDecideAndTiesHaveNone) {
  const std::vector<std::pair<JobKey, LearnedConfig>> learned = {
      Learned("a", "j1", "expandable_segments:True"),
      Learned("b", "j1", "expandable_segments:True"),
      Learned("c", "j1", "expandable_segments:True"),
      Learned("c", "j2", "max_split_size_mb:512"),
  };
  std::optional<Prior> prior = FindPrior(learned, "c", PriorSetting{});
  ASSERT_TRUE(prior.has_value());
  EXPECT_EQ(prior->scope, "the node");
  EXPECT_EQ(prior->jobs, 3u);

  std::vector<std::pair<JobKey, LearnedConfig>> tied = learned;
  for (const char* t : {"d", "e", "f"}) tied.push_back(Learned(t, "j", "max_split_size_mb:512"));
  tied.push_back(Learned("g", "j", "garbage_collection_threshold:0.8"));
  // 3 against 4: the larger wins; 4 against 4 is none (the seed).
  EXPECT_EQ(FindPrior(tied, "g", PriorSetting{})->config, Canonical("max_split_size_mb:512"));
  tied.push_back(Learned("h", "j", "expandable_segments:True"));
  EXPECT_TRUE(FindPrior(tied, "g", PriorSetting{})->seed);
}

// A fresh node (issue 40): no learned configs agree, and a job on its own
// config would cut segments in its first steps that stay. It starts on the
// seed, saying so, unless its own config already holds it.
TEST(StartConfigTest, WithoutAgreementAJobStartsOnTheSeedUnlessItHoldsIt) {
  const std::vector<std::pair<JobKey, LearnedConfig>> fresh;
  const std::optional<Prior> seed = FindPrior(fresh, "a", PriorSetting{});
  ASSERT_TRUE(seed.has_value());
  EXPECT_TRUE(seed->seed);
  EXPECT_EQ(seed->config, Canonical("expandable_segments:True"));
  EXPECT_EQ(seed->jobs, 0u);
  EXPECT_EQ(seed->scope, "--autotune-seed-prior");
  EXPECT_FALSE(FindPrior(fresh, "a", {.seed = std::nullopt}).has_value());
  EXPECT_FALSE(FindPrior(fresh, "a", {.kind = PriorSetting::Kind::kOff}).has_value());

  const StartConfig defaults = ChooseStartConfig("", std::nullopt, seed);
  EXPECT_EQ(defaults.source, StartConfigSource::kPrior);
  EXPECT_EQ(defaults.config, seed->config);
  EXPECT_NE(defaults.why.find("started on the seed prior expandable_segments:True (fewer than "
                              "3 learned configs agree yet; set by --autotune-seed-prior) "
                              "instead of its own PyTorch's defaults"),
            std::string::npos)
      << defaults.why;
  // Like any prior, it replaces the job's config as a whole.
  EXPECT_EQ(ChooseStartConfig(Canonical("roundup_power2_divisions:4"), std::nullopt, seed).config,
            seed->config);
  // A harmful config gets the seed as it would the node's prior.
  const StartConfig harmful =
      ChooseStartConfig(Canonical("max_split_size_mb:64"), std::nullopt, seed);
  EXPECT_EQ(harmful.source, StartConfigSource::kPrior);
  EXPECT_EQ(harmful.config, seed->config);
  EXPECT_NE(harmful.why.find("instead of max_split_size_mb:64, known to be harmful"),
            std::string::npos)
      << harmful.why;
  // Own configs that already hold it are left alone, whatever else they set.
  for (const char* own : {"expandable_segments:True",
                          "expandable_segments:True,roundup_power2_divisions:4",
                          "max_split_size_mb:64,expandable_segments:True"}) {
    const StartConfig kept = ChooseStartConfig(Canonical(own), std::nullopt, seed);
    EXPECT_EQ(kept.source, StartConfigSource::kOwn) << own;
    EXPECT_EQ(kept.config, Canonical(own));
    EXPECT_EQ(kept.why, "") << own;
  }
  // A seed of several keys: held only when all of them are.
  const Prior two{.config = Canonical("expandable_segments:True,roundup_power2_divisions:4"),
                  .scope = "--autotune-seed-prior",
                  .seed = true};
  EXPECT_EQ(ChooseStartConfig(Canonical("expandable_segments:True"), std::nullopt, two).source,
            StartConfigSource::kPrior);
  EXPECT_EQ(ChooseStartConfig(Canonical("roundup_power2_divisions:4,expandable_segments:True,"
                                        "garbage_collection_threshold:0.6"),
                              std::nullopt, two)
                .source,
            StartConfigSource::kOwn);
  // A learned prior is no guess: a job holding it still starts on it.
  EXPECT_EQ(ChooseStartConfig(Canonical("expandable_segments:True,roundup_power2_divisions:4"),
                              std::nullopt,
                              Prior{.config = seed->config, .jobs = 3, .scope = "the node"})
                .source,
            StartConfigSource::kPrior);
}

// The seed goes through the same veto as any prior: a job whose process
// cannot combine it keeps its own config, or, harmful, the next choice.
TEST(StartConfigTest, AVetoedSeedFallsBackAsAVetoedPriorDoes) {
  const std::optional<Prior> seed = FindPrior({}, "a", PriorSetting{});
  ASSERT_TRUE(seed.has_value());
  const StartConfigVeto no_expandable = [](const AllocatorConfig& c) {
    return c.expandable_segments ? std::string("it shares CUDA tensors with another uid")
                                 : std::string();
  };
  const StartConfig own = ChooseStartConfig("", std::nullopt, seed, no_expandable);
  EXPECT_EQ(own.source, StartConfigSource::kOwn);
  EXPECT_EQ(own.config, "");
  EXPECT_EQ(own.why,
            "the seed prior expandable_segments:True was left out: it shares CUDA tensors with "
            "another uid");
  // Harmful: its split size alone goes. The safe config is the seed here,
  // left out once.
  const StartConfig split =
      ChooseStartConfig(Canonical("max_split_size_mb:64"), std::nullopt, seed, no_expandable);
  EXPECT_EQ(split.source, StartConfigSource::kReplaced);
  EXPECT_EQ(split.config, "expandable_segments:False");
  EXPECT_NE(split.why.find("the seed prior expandable_segments:True was left out"),
            std::string::npos)
      << split.why;
  EXPECT_EQ(split.why.find("was left out"), split.why.rfind("was left out")) << split.why;
  EXPECT_EQ(split.why.find("no prior"), std::string::npos) << split.why;
  // A key the job pinned is one the seed may not change.
  const std::string gc = Canonical("garbage_collection_threshold:0.6");
  EXPECT_EQ(ChooseStartConfig(gc, std::nullopt, seed,
                              KeepsPinnedKeys(gc, {"garbage_collection_threshold"}))
                .source,
            StartConfigSource::kOwn);
}

TEST(StartConfigTest, ALearnedConfigComesFirst) {
  const StartConfig start =
      ChooseStartConfig(Canonical("max_split_size_mb:64"),
                        LearnedConfig{.config = Canonical("max_split_size_mb:512")},
                        Prior{.config = Canonical("expandable_segments:True"), .jobs = 3});
  EXPECT_EQ(start.source, StartConfigSource::kLearned);
  EXPECT_EQ(start.config, Canonical("max_split_size_mb:512"));
}

TEST(StartConfigTest, AHarmfulStartConfigIsReplacedByThePriorElseMadeSafe) {
  const std::string own = Canonical("max_split_size_mb:64");
  const Prior prior{.config = Canonical("expandable_segments:True"), .jobs = 4,
                    .scope = "tenant X"};
  const StartConfig on_prior = ChooseStartConfig(own, std::nullopt, prior);
  EXPECT_EQ(on_prior.source, StartConfigSource::kPrior);
  EXPECT_EQ(on_prior.config, prior.config);
  EXPECT_NE(on_prior.why.find("4 jobs of tenant X agree"), std::string::npos) << on_prior.why;
  EXPECT_NE(on_prior.why.find("instead of max_split_size_mb:64, known to be harmful"),
            std::string::npos)
      << on_prior.why;

  const StartConfig replaced = ChooseStartConfig(own, std::nullopt, std::nullopt);
  EXPECT_EQ(replaced.source, StartConfigSource::kReplaced);
  EXPECT_EQ(replaced.config, Canonical("expandable_segments:True"));
}

TEST(StartConfigTest, AHarmlessConfigStartsOnThePriorOrStaysItsOwn) {
  const std::string own = Canonical("max_split_size_mb:512");
  EXPECT_EQ(ChooseStartConfig(own, std::nullopt, std::nullopt).source, StartConfigSource::kOwn);
  const StartConfig start = ChooseStartConfig(
      own, std::nullopt, Prior{.config = Canonical("expandable_segments:True"), .jobs = 3});
  EXPECT_EQ(start.source, StartConfigSource::kPrior);
  EXPECT_EQ(start.config, Canonical("expandable_segments:True"));
}

TEST(StartConfigTest, AVetoedReplacementFallsBack) {
  const std::string own = Canonical("max_split_size_mb:64");
  const StartConfigVeto no_expandable = [](const AllocatorConfig& c) {
    return c.expandable_segments ? std::string("it shares CUDA tensors with another uid")
                                 : std::string();
  };
  // The prior is vetoed and so is the safe config: the job's own without
  // its harmful split size (PyTorch's defaults here, spelled by the key
  // left out: "" would answer "none" to allocd run), saying why.
  const StartConfig split = ChooseStartConfig(
      own, std::nullopt, Prior{.config = Canonical("expandable_segments:True"), .jobs = 3},
      no_expandable);
  EXPECT_EQ(split.source, StartConfigSource::kReplaced);
  EXPECT_EQ(split.config, "expandable_segments:False");
  EXPECT_EQ(*ParseAllocatorConfig(split.config), AllocatorConfig{});
  EXPECT_NE(split.why.find("another uid"), std::string::npos) << split.why;
  // Vetoed too: the job keeps its own.
  const StartConfigVeto nothing = [](const AllocatorConfig&) { return std::string("no"); };
  const StartConfig kept = ChooseStartConfig(own, std::nullopt, std::nullopt, nothing);
  EXPECT_EQ(kept.source, StartConfigSource::kOwn);
  EXPECT_EQ(kept.config, own);
  EXPECT_NE(kept.why.find("known to be harmful"), std::string::npos) << kept.why;
  // A prior the veto allows is taken.
  EXPECT_EQ(ChooseStartConfig(own, std::nullopt,
                              Prior{.config = Canonical("max_split_size_mb:512"), .jobs = 3},
                              no_expandable)
                .source,
            StartConfigSource::kPrior);
}

TEST(StartConfigTest, AKeyTheJobPinnedIsNeverReplaced) {
  const std::string own = Canonical("max_split_size_mb:64");
  // Pinned expandable_segments: only the split size goes.
  const StartConfig kept = ChooseStartConfig(own, std::nullopt, std::nullopt,
                                             KeepsPinnedKeys(own, {"expandable_segments"}));
  EXPECT_EQ(kept.config, "expandable_segments:False");
  EXPECT_NE(kept.why.find("the job pinned expandable_segments"), std::string::npos) << kept.why;
  // Pinned both: its own, harmful as it is.
  EXPECT_EQ(ChooseStartConfig(own, std::nullopt, std::nullopt,
                              KeepsPinnedKeys(own, {"expandable_segments", "max_split_size_mb"}))
                .config,
            own);
  // Pinning another key leaves the replacement free.
  EXPECT_EQ(ChooseStartConfig(own, std::nullopt, std::nullopt,
                              KeepsPinnedKeys(own, {"roundup_power2_divisions"}))
                .source,
            StartConfigSource::kReplaced);
  EXPECT_EQ(KeepsPinnedKeys(own, {}), nullptr);
}

// Blocks of 130 MiB to 200 MiB allocated and freed in turn: a cache that
// cannot split large blocks makes a segment for each new size.
Trace GrowingSizes() {
  TraceBuilder b;
  for (int round = 0; round < 3; ++round) {
    for (uint64_t mib = 130; mib < 200; mib += 7) {
      const uint32_t a = b.Alloc(mib * kMiB);
      const uint32_t c = b.Alloc((mib + 3) * kMiB);
      b.Free(a);
      b.Free(c);
    }
  }
  return b.Build();
}

TEST(ReviewPriorTest, ThePriorIsKeptWhenItPeaksLowerAndTheJobReturnsWhenStayingWouldHave) {
  const AllocatorConfig harmful = Parse("max_split_size_mb:64");
  const AllocatorConfig safe = Parse("expandable_segments:True");
  absl::StatusOr<PriorReview> kept = ReviewPrior(GrowingSizes(), harmful, safe, ReplayOptions{});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_LT(kept->prior_peak, kept->own_peak) << kept->why;
  EXPECT_FALSE(kept->return_to_own);
  // The other way round: a job started on the harmful one as a prior goes
  // back to its own.
  absl::StatusOr<PriorReview> back = ReviewPrior(GrowingSizes(), safe, harmful, ReplayOptions{});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->return_to_own) << back->why;
}

// The seed is reviewed as any prior: a job whose events expandable
// segments serve worse than its own PyTorch's defaults goes back to them.
TEST(ReviewPriorTest, AJobTheSeedServesWorseReturnsToItsOwn) {
  // One 21 MiB tensor: PyTorch's defaults cut a 22 MiB segment for it,
  // expandable segments map it in whole 20 MiB pages.
  TraceBuilder b;
  b.Free(b.Alloc(21 * kMiB));
  const std::optional<Prior> seed = FindPrior({}, "a", PriorSetting{});
  ASSERT_TRUE(seed.has_value());
  absl::StatusOr<PriorReview> review =
      ReviewPrior(b.Build(), Parse(""), Parse(seed->config), ReplayOptions{});
  ASSERT_TRUE(review.ok()) << review.status();
  EXPECT_LT(review->own_peak, review->prior_peak) << review->why;
  EXPECT_TRUE(review->return_to_own) << review->why;
}

}  // namespace
}  // namespace allocd
