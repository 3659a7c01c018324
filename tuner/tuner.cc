#include "tuner/tuner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/absl_string_view.h"

namespace allocd {
namespace {

// How many of the best candidates each refinement round explores around.
constexpr size_t kRefineAround = 4;

struct PointEvaluation {
  SpacePoint point;
  const Evaluation* evaluation;
};

// Lower is better; feasible before infeasible; equal scores go to the
// candidate with less peak memory, fewer device calls, then the shorter
// (simpler) config.
bool Better(const TuneReport& report, const Evaluation& a, const Evaluation& b) {
  const bool fa = report.Feasible(a);
  const bool fb = report.Feasible(b);
  if (fa != fb) return fa;
  const double sa = report.Score(a);
  const double sb = report.Score(b);
  if (sa != sb) return sa < sb;
  if (a.replay.peak_reserved != b.replay.peak_reserved) {
    return a.replay.peak_reserved < b.replay.peak_reserved;
  }
  const int64_t calls_a = a.replay.num_device_alloc + a.replay.num_device_free;
  const int64_t calls_b = b.replay.num_device_alloc + b.replay.num_device_free;
  if (calls_a != calls_b) return calls_a < calls_b;
  if (a.key.size() != b.key.size()) return a.key.size() < b.key.size();
  return a.key < b.key;
}

std::vector<SpacePoint> CoarseSweep(const SearchSpace& space) {
  std::vector<SpacePoint> points;
  for (size_t exp = 0; exp < space.expandable_segments.size(); ++exp) {
    SpacePoint base;
    base.expandable = exp;
    points.push_back(base);
    for (int d = 0; d < kSpaceDimensions; ++d) {
      // Expandable is the outer loop; rounding only matters once
      // max_split_size is set, which refinement explores.
      if (d == 1 || d == 3) continue;
      for (size_t v = 1; v < DimensionSize(space, d); ++v) {
        SpacePoint p = base;
        PointIndex(p, d) = v;
        points.push_back(p);
      }
    }
  }
  return points;
}

std::vector<SpacePoint> Neighbours(const SearchSpace& space,
                                   const std::vector<PointEvaluation>& top,
                                   const std::vector<PointEvaluation>& ranked) {
  std::vector<SpacePoint> out;
  auto add = [&](const SpacePoint& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const PointEvaluation& t : top) {
    for (int d = 0; d < kSpaceDimensions; ++d) {
      SpacePoint p = t.point;
      const size_t here = PointIndex(p, d);
      if (here > 0) {
        PointIndex(p, d) = here - 1;
        add(p);
      }
      if (here + 1 < DimensionSize(space, d)) {
        PointIndex(p, d) = here + 1;
        add(p);
      }
      // The value this dimension has in the other good candidates.
      for (size_t i = 0; i < std::min<size_t>(ranked.size(), 2 * kRefineAround); ++i) {
        SpacePoint q = t.point;
        SpacePoint other = ranked[i].point;
        PointIndex(q, d) = PointIndex(other, d);
        add(q);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Objective> ParseObjective(std::string_view name) {
  if (name == "peak") return Objective::kPeak;
  if (name == "capacity") return Objective::kCapacity;
  if (name == "device-allocs") return Objective::kDeviceAllocs;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown objective '", ToAbsl(name),
      "': use peak, capacity or device-allocs"));
}

const char* ObjectiveName(Objective objective) {
  switch (objective) {
    case Objective::kPeak: return "peak";
    case Objective::kCapacity: return "capacity";
    case Objective::kDeviceAllocs: return "device-allocs";
  }
  return "?";
}

const std::vector<std::string>& GuideConfigs() {
  static const auto* configs = new std::vector<std::string>{
      "max_split_size_mb:64",
      "max_split_size_mb:128",
      "max_split_size_mb:512",
      "expandable_segments:True",
      "garbage_collection_threshold:0.8,max_split_size_mb:128",
      "roundup_power2_divisions:4",
      "backend:cudaMallocAsync",
      "max_split_size_mb:64,roundup_power2:true,allocator:cudaMallocAsync",
      "max_split_size_mb:256,expandable_segments:true,garbage_collection_threshold:0.8",
  };
  return *configs;
}

namespace {

int64_t DeviceCalls(const ReplaySummary& r) {
  return r.num_device_alloc + r.num_device_free;
}

// At most `ratio` times the baseline's calls (0: no limit); a baseline
// without calls counts as one.
bool WithinCallRatio(const ReplaySummary& r, const ReplaySummary& baseline,
                     double ratio) {
  return ratio <= 0 ||
         static_cast<double>(DeviceCalls(r)) <=
             ratio * static_cast<double>(std::max<int64_t>(1, DeviceCalls(baseline)));
}

}  // namespace

bool TuneReport::Feasible(const Evaluation& e) const {
  // The guards every objective keeps, at the tuning capacity.
  const ReplaySummary& r = e.replay;
  const ReplaySummary& base = baseline.replay;
  if (r.num_ooms != 0 || r.num_alloc_retries > options.max_retries ||
      !WithinCallRatio(r, base, options.max_call_ratio)) {
    return false;
  }
  if (options.max_peak_ratio > 0 &&
      static_cast<double>(r.peak_reserved) >
          options.max_peak_ratio * static_cast<double>(base.peak_reserved)) {
    return false;
  }
  switch (objective) {
    case Objective::kPeak:
      return true;
    case Objective::kCapacity:
      // On its least device too it may not churn far more than the
      // defaults do on theirs.
      return e.min_capacity.has_value() &&
             (!baseline.min_capacity ||
              WithinCallRatio(e.at_min_capacity, baseline.at_min_capacity,
                              options.max_call_ratio));
    case Objective::kDeviceAllocs: {
      const uint64_t budget =
          options.memory_budget != 0 ? options.memory_budget : options.capacity;
      return budget == 0 || static_cast<uint64_t>(r.peak_reserved) <= budget;
    }
  }
  return false;
}

double TuneReport::Score(const Evaluation& e) const {
  switch (objective) {
    case Objective::kPeak:
      return static_cast<double>(e.replay.peak_reserved);
    case Objective::kCapacity:
      return e.min_capacity ? static_cast<double>(*e.min_capacity)
                            : std::numeric_limits<double>::infinity();
    case Objective::kDeviceAllocs:
      return static_cast<double>(DeviceCalls(e.replay));
  }
  return 0;
}

const Evaluation* TuneReport::robust() const {
  for (const Evaluation& e : ranked) {
    if (!Feasible(e)) return nullptr;  // feasible ones come first
    if (!e.candidate.memory_fraction) return &e;
  }
  return nullptr;
}

const Evaluation* TuneReport::capped() const {
  if (ranked.empty() || !Feasible(ranked[0]) ||
      !ranked[0].candidate.memory_fraction) {
    return nullptr;
  }
  return &ranked[0];
}

double TuneReport::CapGain() const {
  const Evaluation* with_cap = capped();
  const Evaluation* without = robust();
  if (with_cap == nullptr || without == nullptr || Score(*without) <= 0) return 0;
  return (Score(*without) - Score(*with_cap)) / Score(*without);
}

const Evaluation* TuneReport::recommended() const {
  const Evaluation* with_cap = capped();
  const Evaluation* without = robust();
  if (with_cap != nullptr &&
      (without == nullptr || CapGain() >= options.cap_threshold)) {
    return with_cap;
  }
  return without;
}

absl::StatusOr<TuneReport> Tune(const Trace& trace, const SearchSpace& space,
                                const TuneOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TuneReport report;
  report.objective = options.objective;
  report.options = options;
  report.grid_size = space.GridSize();

  // A bad trace fails here, once, with a clear error (a live switch's
  // caller has replayed it to find the switch point).
  if (!options.live_start) {
    ReplayOptions check;
    check.capacity = options.capacity;
    if (absl::StatusOr<ReplayResult> r = Replay(trace, AllocatorConfig{}, check); !r.ok()) {
      return r.status();
    }
  }

  const bool capacity_search = options.objective == Objective::kCapacity;
  Evaluator evaluator(trace, EvaluatorOptions{options.capacity, options.total_memory,
                                              capacity_search, options.jobs,
                                              options.live_start, options.on_replay});
  size_t planned = 0;
  auto progress = [&](size_t done) {
    if (options.progress) options.progress(done, std::max(planned, done));
  };

  const Evaluation* baseline =
      evaluator.Evaluate({options.baseline.value_or(Candidate{})})[0];
  report.baseline = *baseline;
  // Garbage collection needs a fraction of a known device; under the
  // capacity objective it is 0.99 of the (searched) device, since PyTorch
  // 2.11 takes a fraction of 1 as no cap and leaves GC off.
  const uint64_t total_memory =
      options.total_memory != 0 ? options.total_memory : options.capacity;
  auto candidate_of = [&](const SpacePoint& p) {
    Candidate c = MakeCandidate(space, p, baseline->replay.peak_allocated,
                                capacity_search ? 1 : total_memory);
    if (capacity_search && c.memory_fraction) c.memory_fraction = 0.99;
    return c;
  };

  std::vector<PointEvaluation> evaluated;
  std::set<std::string> seen_keys;
  auto run_points = [&](const std::vector<SpacePoint>& points) {
    std::vector<SpacePoint> fresh;
    std::vector<Candidate> candidates;
    for (const SpacePoint& p : points) {
      if (std::any_of(evaluated.begin(), evaluated.end(),
                      [&](const PointEvaluation& e) { return e.point == p; })) {
        continue;
      }
      Candidate c = candidate_of(p);
      const std::string key = CandidateKey(c);
      if (!seen_keys.contains(key) && seen_keys.size() >= options.budget) continue;
      seen_keys.insert(key);
      fresh.push_back(p);
      candidates.push_back(std::move(c));
    }
    planned = evaluator.evaluations() + candidates.size();
    const std::vector<const Evaluation*> results = evaluator.Evaluate(candidates, progress);
    for (size_t i = 0; i < fresh.size(); ++i) evaluated.push_back({fresh[i], results[i]});
    return !fresh.empty();
  };
  auto ranked_points = [&] {
    std::vector<PointEvaluation> sorted = evaluated;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](const PointEvaluation& a, const PointEvaluation& b) {
                       return Better(report, *a.evaluation, *b.evaluation);
                     });
    return sorted;
  };

  run_points(CoarseSweep(space));
  auto best_score = [&] {
    const std::vector<PointEvaluation> ranked = ranked_points();
    return ranked.empty() ? std::numeric_limits<double>::infinity()
                          : report.Score(*ranked[0].evaluation);
  };
  // Refine until two rounds in a row find nothing better.
  for (int stale_rounds = 0; stale_rounds < 2 && seen_keys.size() < options.budget;) {
    const double before = best_score();
    const std::vector<PointEvaluation> ranked = ranked_points();
    const std::vector<PointEvaluation> top(
        ranked.begin(), ranked.begin() + std::min(ranked.size(), kRefineAround));
    if (!run_points(Neighbours(space, top, ranked))) break;
    stale_rounds = best_score() < before ? 0 : stale_rounds + 1;
  }

  for (const std::string& conf : GuideConfigs()) {
    if (options.live_start) break;
    ReferenceConfig ref{conf, "", std::nullopt};
    absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(conf);
    if (!parsed.ok()) {
      ref.error = std::string(parsed.status().message());
    } else {
      ref.evaluation = *evaluator.Evaluate({Candidate{*parsed, std::nullopt}})[0];
    }
    report.references.push_back(std::move(ref));
  }

  // Rank every distinct evaluation the search made (references included:
  // a guide's config can be the best one).
  std::vector<const Evaluation*> all;
  for (const PointEvaluation& p : evaluated) all.push_back(p.evaluation);
  all.push_back(baseline);
  for (const ReferenceConfig& ref : report.references) {
    if (ref.evaluation && !ref.evaluation->replay.estimated) {
      all.push_back(evaluator.Find(ref.evaluation->key));
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::stable_sort(all.begin(), all.end(), [&](const Evaluation* a, const Evaluation* b) {
    return Better(report, *a, *b);
  });
  for (const Evaluation* e : all) report.ranked.push_back(*e);

  std::vector<size_t> by_peak;
  for (size_t i = 0; i < report.ranked.size(); ++i) {
    if (report.Feasible(report.ranked[i])) by_peak.push_back(i);
  }
  std::stable_sort(by_peak.begin(), by_peak.end(), [&](size_t a, size_t b) {
    return report.ranked[a].replay.peak_reserved < report.ranked[b].replay.peak_reserved;
  });
  int64_t fewest_calls = std::numeric_limits<int64_t>::max();
  for (size_t i : by_peak) {
    const ReplaySummary& r = report.ranked[i].replay;
    const int64_t calls = r.num_device_alloc + r.num_device_free;
    if (calls < fewest_calls) {
      report.pareto.push_back(i);
      fewest_calls = calls;
    }
  }

  report.evaluations = evaluator.evaluations();
  report.replays = evaluator.replays();
  report.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace allocd
