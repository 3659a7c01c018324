// Whether a candidate's gain holds on sizes the job has not shown yet.
//
// A config fitted to the sizes a job allocated (SizeFittedSettings:
// max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions,
// ...) can cost memory on sizes its window does not hold. On the H200 a
// 2-rank DDP job with varying shapes, running expandable segments, was
// pushed max_split_size_mb:256,max_non_split_rounding_mb:256 with them when
// a larger shape arrived, predicted 12.3% below staying on the window; the
// next, larger shape peaked 11% above expandable segments alone. So before
// a push that adds such settings, the window's events after the switch are
// replayed again with every request grown (GrowRequests) from the same
// state, under the candidate, under staying and under the best candidate
// fitted no more to sizes than the job's config, and the push stands only
// if the candidate still wins there (CheckGrownSizes).
#ifndef ALLOCD_SERVER_AUTOTUNE_GROWN_SIZES_H_
#define ALLOCD_SERVER_AUTOTUNE_GROWN_SIZES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/trace.h"
#include "tuner/candidate.h"
#include "tuner/evaluator.h"

namespace allocd {

// `trace` with every allocation from event `from` on asking `factor` times
// its size (to the nearest byte), its frees alike. What was allocated before
// `from` keeps its size: the state a switch there finds (the prelude, a
// client's state, the steps before it, and the cache they left) is the
// job's own, as it will be when its next, larger steps come.
Trace GrowRequests(const Trace& trace, uint64_t from, double factor);

// How much more the newest whole step of `trace` asked for than the steps
// before it: each step counted by the most its own allocations held above
// what was held at its start (the model's weights and optimizer state are
// the same in every step; what a step adds grows with its shapes). The
// steps are those between `marks` (indices of the first event after a
// step's end) when there are three or more marks; else, with a `step` of
// events, the trace's last periods of it. nullopt: fewer than two whole
// steps, or earlier steps that added nothing.
std::optional<double> StepGrowth(const Trace& trace, const std::vector<uint64_t>& marks,
                                 std::optional<uint64_t> step);

// The growths a candidate is checked at: a quarter, the least that takes a
// request past the rounding and split limits its size was fitted between
// (roundup_power2_divisions:4 rounds to quarters of a power of two), and
// the window's own growth (StepGrowth) when it is larger, at most doubled:
// a doubled batch or sequence is the next bucket of a job that buckets its
// shapes by powers of two, and past it the replay is of another job (on a
// device's capacity, of OOMs that every config meets).
inline constexpr double kGrowBy = 1.25;
inline constexpr double kMaxGrowth = 2.0;
std::vector<double> GrowthFactors(std::optional<double> window_growth);

// The peaks after the switch with requests grown by `factor`.
struct GrownPeaks {
  double factor = 1.0;
  ReplaySummary staying;
  ReplaySummary candidate;
  ReplaySummary simpler;  // staying's when the simpler alternative is staying
};

struct GrownSizesCheck {
  // At every growth the candidate is at least as good as staying and the
  // simpler alternative (no more OOMs, no higher peak), and still saves
  // `min_saving` of staying's peak.
  bool holds = true;
  std::vector<GrownPeaks> grown;  // one per factor, in order, up to the failed one
  // The first growth at which it does not hold (an index into `grown`).
  std::optional<size_t> failed;
  double seconds = 0;  // wall time of the replays
};

struct GrownSizesOptions {
  // How each replay switches (live_start: the job's config and the switch
  // point) and how many run at once (jobs).
  EvaluatorOptions replays;
  double min_saving = 0.05;
  std::vector<double> factors;
};

// Replays `window` grown by each of `options.factors` from the switch point
// on, switched there to `staying` (the job's own config), to `candidate`
// and to `simpler` (nullopt: staying is the simpler alternative): three
// replays a growth, `jobs` at a time, until one growth refuses it. Each
// empties the cache at the switch, staying's too: with the sizes grown,
// what the cache held before is of sizes the job no longer asks for,
// which a switch releases and staying would keep, so staying as it is
// would lose to any push; what is checked is the configs on the sizes.
GrownSizesCheck CheckGrownSizes(const Trace& window, const Candidate& staying,
                                const Candidate& candidate, const std::optional<Candidate>& simpler,
                                const GrownSizesOptions& options);

// `factor` as a decision's why writes a growth: "25%".
std::string GrowthPercent(double factor);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_GROWN_SIZES_H_
