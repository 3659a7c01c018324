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
}

TEST(StartConfigTest, ThePriorIsWhatAtLeastThreeOfTheTenantsJobsSettledOn) {
  const std::string es = Canonical("expandable_segments:True");
  std::vector<std::pair<JobKey, LearnedConfig>> learned = {
      Learned("a", "j1", "expandable_segments:True"),
      Learned("a", "j2", es),
      Learned("a", "j3", "max_split_size_mb:512"),
  };
  // Two agree: no prior.
  EXPECT_FALSE(FindPrior(learned, "a", PriorSetting{}).has_value());
  learned.push_back(Learned("a", "j4", es));
  std::optional<Prior> prior = FindPrior(learned, "a", PriorSetting{});
  ASSERT_TRUE(prior.has_value());
  EXPECT_EQ(prior->config, es);
  EXPECT_EQ(prior->jobs, 3u);
  EXPECT_EQ(prior->scope, "tenant a");
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
  // 3 against 4: the larger wins; 4 against 4 would be none.
  EXPECT_EQ(FindPrior(tied, "g", PriorSetting{})->config, Canonical("max_split_size_mb:512"));
  tied.push_back(Learned("h", "j", "expandable_segments:True"));
  EXPECT_FALSE(FindPrior(tied, "g", PriorSetting{}).has_value());
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

}  // namespace
}  // namespace allocd
