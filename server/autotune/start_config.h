// StartConfig: the allocator config a job in apply mode starts on, decided
// before its first allocation (issue 40): at registration, at the
// LearnedConfig RPC that `allocd run` and allocd.enable() ask before the
// program starts, or at advise() (its registration). Decided on before the
// first step, a config costs nothing to change; after it, the segments cut
// under the old one stay.
//
// In order:
// - the job's learned config (LearnedConfigs), whatever it started on;
// - else, a start config known to be harmful (IsHarmfulStartConfig) is
//   replaced: by the node's prior when there is one, else by the job's own
//   config made safe (SaferStartConfig);
// - else the node's prior (FindPrior), when there is one;
// - else the job's own config.
// Every replacement goes through one StartConfigVeto (a filter that knows
// what the job's process can combine, e.g. expandable segments with CUDA
// IPC to another uid): a vetoed prior falls back to the next choice, a
// vetoed safe config to the job's own.
//
// The prior is what the kept decisions of the node's jobs settled on: the
// canonical config that at least kPriorMinJobs learned configs of the
// job's tenant agree on (the same canonical config), else of every tenant;
// ties have none. Learned configs imported from the ConfigMap count as any.
// Until they agree, the prior is the seed (--autotune-seed-prior, default
// expandable_segments:True, the best config of every job measured for
// issue 40): on a fresh node a job started on its own config runs it until
// its first decision, and the segments cut in those first steps stay (a
// DDP rank from PyTorch's defaults ended 8% above the best config from its
// first step). The seed is left out for a job whose own config already
// holds it. A prior, like a push, is judged on the job's own events at its
// first decision (ReviewPrior), and the job goes back to its own config
// when staying on it would have peaked lower.
#ifndef ALLOCD_SERVER_AUTOTUNE_START_CONFIG_H_
#define ALLOCD_SERVER_AUTOTUNE_START_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/trace.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/job_key.h"
#include "server/autotune/learned_configs.h"

namespace allocd {

// Where a job's start config came from (the metric's `source` label, the
// client's stats() `start_config_source`).
enum class StartConfigSource { kOwn, kLearned, kPrior, kReplaced };
inline constexpr NamedValue<StartConfigSource> kStartConfigSources[] = {
    {StartConfigSource::kOwn, "own"},
    {StartConfigSource::kLearned, "learned"},
    {StartConfigSource::kPrior, "prior"},
    {StartConfigSource::kReplaced, "replaced"},
};
constexpr const char* StartConfigSourceName(StartConfigSource source) {
  return NameIn(kStartConfigSources, source);
}

// Learned configs that must agree before they are a prior: one job's
// learned config is that job's; three that settled on the same config are
// a pattern of the node's workloads.
inline constexpr size_t kPriorMinJobs = 3;

// The seed prior unless --autotune-seed-prior says otherwise (canonical).
inline constexpr char kDefaultSeedPrior[] = "expandable_segments:True";

// --autotune-prior: "learned" (FindPrior), "off", or a fixed
// PYTORCH_CUDA_ALLOC_CONF every job without a learned config starts on.
// Off: nothing is decided before a job's first allocation but its learned
// config (no seed either); a harmful start config is left to the job's
// first steps (the bad_start_config trigger's early push).
struct PriorSetting {
  enum class Kind { kLearned, kOff, kFixed };
  Kind kind = Kind::kLearned;
  std::string config;  // kFixed: canonical
  // kLearned: the prior while no learned configs agree (canonical;
  // --autotune-seed-prior), nullopt for none.
  std::optional<std::string> seed = kDefaultSeedPrior;
};
// --autotune-prior's kind and config (the seed at its default).
// InvalidArgument, naming the flag and PyTorch's objection, for a config
// PyTorch 2.11 rejects.
absl::StatusOr<PriorSetting> ParsePriorSetting(std::string_view flag);
// --autotune-seed-prior: "off" (nullopt) or a config, canonical; errors as
// ParsePriorSetting's, naming this flag.
absl::StatusOr<std::optional<std::string>> ParseSeedPrior(std::string_view flag);

// max_split_size_mb <= 128 without expandable segments: the cache cannot
// split the large blocks it caches, and every size a little larger than a
// freed block gets a segment of its own (the guides' 64 and 128 cost
// llama_lora several times its memory; issue 40's jobs 10-44% more over
// their first steps).
bool IsHarmfulStartConfig(const AllocatorConfig& config);

// `own` without max_split_size_mb and with expandable_segments:True: what
// a harmful start config becomes without a prior (its other keys kept).
AllocatorConfig SaferStartConfig(const AllocatorConfig& own);

struct Prior {
  std::string config;  // canonical
  size_t jobs = 0;     // how many learned configs agree on it
  // "tenant T", "the node", "--autotune-prior" or "--autotune-seed-prior".
  std::string scope;
  // The seed: no learned configs agree yet (see above).
  bool seed = false;
};
// The prior for a job of `tenant` (see above), the seed when no learned
// configs agree; nullopt for none, or with `setting` off.
std::optional<Prior> FindPrior(const std::vector<std::pair<JobKey, LearnedConfig>>& learned,
                               const TenantId& tenant, const PriorSetting& setting);

// Why `config` would break the job ("" when it would not): the seam where
// what the job's process does (its reported features) vetoes a config.
using StartConfigVeto = std::function<std::string(const AllocatorConfig& config)>;

// A veto of configs that change a key of `own` the job pinned (JobPolicy's
// pinned_keys: it set them on purpose); no veto for an `own` that does not
// parse or no pins.
StartConfigVeto KeepsPinnedKeys(const std::string& own, const std::vector<std::string>& pinned);

struct StartConfig {
  std::string config;  // canonical: what the job starts on
  StartConfigSource source = StartConfigSource::kOwn;
  // For a replacement: what it replaced and why, as the config version's
  // author and the decision's `why` say it.
  std::string why;
};
// The reserved bytes up to which a run started on `learned` does what the
// job was learned on (RegisterResponse.stream_from_reserved): the peak
// reserved the job reached under it (or, not known, was predicted to reach
// under it), plus `growth_margin` of it; the autotuner decides on growth
// past the same margin. 0 (the run streams from its start) when neither is
// known.
uint64_t StreamFromReserved(const LearnedConfig& learned, double growth_margin);
// `peak` reserved bytes plus `growth_margin` of them: where a run that
// peaks at `peak` has grown (0 for a peak not known, <= 0).
uint64_t GrownPast(int64_t peak, double growth_margin);

// The start config of a job whose own is `own` (canonical, "" for
// PyTorch's defaults), with `learned` and `prior` as found; `veto` may be
// empty. A config `own` that does not parse is kept as it is; a seed prior
// that `own` already holds (it sets every key the seed sets, as the seed
// sets it) is no prior for it.
StartConfig ChooseStartConfig(const std::string& own,
                              const std::optional<LearnedConfig>& learned,
                              const std::optional<Prior>& prior,
                              const StartConfigVeto& veto = nullptr);

// A prior's review: the job's window (its own events since it started on
// the prior) replayed under its own config (staying, had it not been
// replaced) and under the prior it ran.
struct PriorReview {
  int64_t own_peak = 0;
  int64_t prior_peak = 0;
  bool return_to_own = false;  // staying would have peaked lower
  std::string why;
};
// A replay's error when either config does not replay.
absl::StatusOr<PriorReview> ReviewPrior(const Trace& window, const AllocatorConfig& own,
                                        const AllocatorConfig& prior,
                                        const ReplayOptions& base);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_START_CONFIG_H_
