#include "server/autotune/start_config.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/bytes.h"
#include "allocator/config_check.h"
#include "server/autotune/decider.h"

namespace allocd {
namespace {

constexpr size_t kHarmfulMaxSplit = 128 * kMiB;

std::string ConfName(const std::string& conf) {
  return conf.empty() ? "PyTorch's defaults" : conf;
}

// The config most of `learned` agree on once canonical, when at least
// kPriorMinJobs do and no other config has as many.
std::optional<std::pair<std::string, size_t>> Agreed(
    const std::vector<const LearnedConfig*>& learned) {
  std::map<std::string, size_t> count;
  for (const LearnedConfig* l : learned) {
    if (std::optional<std::string> c = CanonicalAllocatorConfig(l->config)) ++count[*c];
  }
  std::optional<std::pair<std::string, size_t>> best;
  bool tied = false;
  for (const auto& [config, n] : count) {
    if (!best || n > best->second) {
      best = {config, n};
      tied = false;
    } else if (n == best->second) {
      tied = true;
    }
  }
  if (!best || tied || best->second < kPriorMinJobs) return std::nullopt;
  return best;
}

// `value`, given to `flag` (which also takes `words`), as a canonical
// config; InvalidArgument naming the flag and PyTorch's objection.
absl::StatusOr<std::string> FlagConfig(std::string_view flag, std::string_view words,
                                       std::string_view value) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(value);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(flag), " must be ", std::string(words),
        " or a PYTORCH_CUDA_ALLOC_CONF PyTorch 2.11 accepts; \"", std::string(value),
        "\" is not: ", ConfigRejection(std::string(value), parsed.status())));
  }
  return FormatAllocatorConfig(*parsed);
}

// Whether `own` sets every key of `seed` as `seed` does: `seed` written
// after it (PyTorch takes a key named twice at its last value) changes
// nothing.
bool Holds(const AllocatorConfig& own, const std::string& seed) {
  if (seed.empty()) return true;
  const std::string own_conf = FormatAllocatorConfig(own);
  absl::StatusOr<AllocatorConfig> both =
      ParseAllocatorConfig(own_conf.empty() ? seed : absl::StrCat(own_conf, ",", seed));
  return both.ok() && *both == own;
}

// The prior as a start's why names it.
std::string PriorName(const Prior& prior) {
  return absl::StrCat(prior.seed ? "the seed prior " : "the node's prior ",
                      ConfName(prior.config));
}

}  // namespace

absl::StatusOr<PriorSetting> ParsePriorSetting(std::string_view flag) {
  if (flag == "learned") return PriorSetting{};
  if (flag == "off") return PriorSetting{.kind = PriorSetting::Kind::kOff};
  absl::StatusOr<std::string> config = FlagConfig("--autotune-prior", "learned, off", flag);
  if (!config.ok()) return config.status();
  return PriorSetting{.kind = PriorSetting::Kind::kFixed, .config = *std::move(config)};
}

absl::StatusOr<std::optional<std::string>> ParseSeedPrior(std::string_view flag) {
  if (flag == "off") return std::nullopt;
  absl::StatusOr<std::string> config = FlagConfig("--autotune-seed-prior", "off", flag);
  if (!config.ok()) return config.status();
  return *std::move(config);
}

bool IsHarmfulStartConfig(const AllocatorConfig& config) {
  return config.max_split_size <= kHarmfulMaxSplit && !config.expandable_segments;
}

AllocatorConfig SaferStartConfig(const AllocatorConfig& own) {
  AllocatorConfig safer = own;
  safer.max_split_size = AllocatorConfig{}.max_split_size;
  safer.expandable_segments = true;
  return safer;
}

std::optional<Prior> FindPrior(const std::vector<std::pair<JobKey, LearnedConfig>>& learned,
                               const TenantId& tenant, const PriorSetting& setting) {
  switch (setting.kind) {
    case PriorSetting::Kind::kOff:
      return std::nullopt;
    case PriorSetting::Kind::kFixed:
      return Prior{.config = setting.config, .jobs = 0, .scope = "--autotune-prior"};
    case PriorSetting::Kind::kLearned:
      break;
  }
  std::vector<const LearnedConfig*> tenants, node;
  for (const auto& [key, l] : learned) {
    node.push_back(&l);
    if (key.tenant == tenant) tenants.push_back(&l);
  }
  if (auto agreed = Agreed(tenants)) {
    return Prior{.config = agreed->first,
                 .jobs = agreed->second,
                 .scope = absl::StrCat("tenant ", tenant.empty() ? "(default)" : tenant)};
  }
  if (auto agreed = Agreed(node)) {
    return Prior{.config = agreed->first, .jobs = agreed->second, .scope = "the node"};
  }
  if (setting.seed.has_value()) {
    return Prior{.config = *setting.seed, .scope = "--autotune-seed-prior", .seed = true};
  }
  return std::nullopt;
}

StartConfigVeto KeepsPinnedKeys(const std::string& own, const std::vector<std::string>& pinned) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(own);
  if (!parsed.ok() || pinned.empty()) return nullptr;
  return [own = *parsed, pinned](const AllocatorConfig& c) -> std::string {
    const char* key = ChangedPinnedKey(c, own, pinned);
    return key == nullptr ? std::string() : absl::StrCat("the job pinned ", key);
  };
}

uint64_t StreamFromReserved(const LearnedConfig& learned, double growth_margin) {
  return GrownPast(std::max(learned.realized_peak.value_or(0), learned.predicted_peak_switched),
                   growth_margin);
}

uint64_t GrownPast(int64_t peak, double growth_margin) {
  if (peak <= 0) return 0;
  return static_cast<uint64_t>(static_cast<double>(peak) * (1.0 + std::max(0.0, growth_margin)));
}

StartConfig ChooseStartConfig(const std::string& own,
                              const std::optional<LearnedConfig>& learned,
                              const std::optional<Prior>& prior, const StartConfigVeto& veto) {
  if (learned.has_value()) {
    return {.config = learned->config, .source = StartConfigSource::kLearned};
  }
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(own);
  if (!parsed.ok()) return {.config = own};
  // Why `config` may not be started on ("": it may).
  auto vetoed = [&](const std::string& config) -> std::string {
    if (!veto) return "";
    absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(config);
    return c.ok() ? veto(*c) : std::string("it does not parse");
  };
  const bool harmful = IsHarmfulStartConfig(*parsed);
  const std::string harm =
      harmful ? absl::StrCat(" instead of ", ConfName(own),
                             ", known to be harmful: max_split_size_mb <= 128 without "
                             "expandable segments keeps the cache from splitting the large "
                             "blocks it holds")
              : absl::StrCat(" instead of its own ", ConfName(own),
                             ", which a review of its first steps returns it to if staying "
                             "would have peaked lower");
  std::string vetoes;
  // The prior's veto, when it had one.
  std::string prior_vetoed;
  if (prior.has_value() && prior->config != own &&
      !(prior->seed && Holds(*parsed, prior->config))) {
    prior_vetoed = vetoed(prior->config);
    if (prior_vetoed.empty()) {
      const std::string agree =
          prior->jobs > 0
              ? absl::StrFormat("%d jobs of %s agree", prior->jobs, prior->scope)
          : prior->seed ? absl::StrCat("fewer than ", kPriorMinJobs,
                                       " learned configs agree yet; set by ", prior->scope)
                        : absl::StrCat("set by ", prior->scope);
      return {.config = prior->config,
              .source = StartConfigSource::kPrior,
              .why = absl::StrCat("started on ", PriorName(*prior), " (", agree, ")", harm)};
    }
    vetoes = absl::StrCat("; ", PriorName(*prior), " was left out: ", prior_vetoed);
  }
  if (!harmful) return {.config = own, .why = vetoes.empty() ? "" : vetoes.substr(2)};
  std::string safer = FormatAllocatorConfig(SaferStartConfig(*parsed));
  // The safe config may be the prior just left out (the seed, for a job
  // with no other keys): its veto is said once.
  const bool was_prior = !prior_vetoed.empty() && safer == prior->config;
  if (const std::string why_not = was_prior ? prior_vetoed : vetoed(safer); !why_not.empty()) {
    // Without expandable segments (what the job's process cannot combine
    // them with, e.g. CUDA IPC to another uid), the split size alone.
    AllocatorConfig split = *parsed;
    split.max_split_size = AllocatorConfig{}.max_split_size;
    if (!was_prior) absl::StrAppend(&vetoes, "; ", safer, " was left out: ", why_not);
    safer = FormatAllocatorConfig(split);
    // PyTorch's defaults, spelled by the key left out: "" answers "no
    // start config" to allocd run and allocd.enable() (LearnedConfig),
    // which would then start the job on its harmful own.
    if (safer.empty()) safer = "expandable_segments:False";
    if (const std::string also = vetoed(safer); !also.empty()) {
      return {.config = own,
              .why = absl::StrCat("kept ", ConfName(own), " although it is known to be harmful: ",
                                  ConfName(safer), " would break the job too (", also, ")",
                                  vetoes)};
    }
  }
  return {.config = safer,
          .source = StartConfigSource::kReplaced,
          .why = absl::StrCat("started on ", ConfName(safer), harm,
                              // A prior left out says so in `vetoes`.
                              prior_vetoed.empty()
                                  ? absl::StrCat(" (no prior: fewer than ", kPriorMinJobs,
                                                 " learned configs agree)")
                                  : "",
                              vetoes)};
}

absl::StatusOr<PriorReview> ReviewPrior(const Trace& window, const AllocatorConfig& own,
                                        const AllocatorConfig& prior,
                                        const ReplayOptions& base) {
  ReplayOptions options = base;
  options.live_switch.reset();
  absl::StatusOr<ReplayResult> staying = Replay(window, own, options);
  if (!staying.ok()) return staying.status();
  absl::StatusOr<ReplayResult> ran = Replay(window, prior, options);
  if (!ran.ok()) return ran.status();
  PriorReview review{.own_peak = staying->peak_reserved, .prior_peak = ran->peak_reserved};
  // An OOM under either is judged as a peak beyond capacity: the one that
  // ran out is the worse.
  const bool own_oom = staying->num_ooms > 0, prior_oom = ran->num_ooms > 0;
  review.return_to_own = own_oom != prior_oom ? prior_oom : review.own_peak < review.prior_peak;
  review.why = absl::StrFormat(
      "the job's %d events since it started replayed under its own %s peak at %s%s, under "
      "%s at %s%s: %s",
      window.events.size(), ConfigName(FormatAllocatorConfig(own)),
      GiB(review.own_peak), own_oom ? " (out of memory)" : "",
      FormatAllocatorConfig(prior), GiB(review.prior_peak), prior_oom ? " (out of memory)" : "",
      review.return_to_own ? "staying would have been better, the job goes back to its own"
                           : "the start config is kept");
  return review;
}

}  // namespace allocd
