#include "server/autotune/decider.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/bytes.h"
#include "allocator/trace/replay.h"
#include "server/autotune/grown_sizes.h"
#include "server/autotune/rollback_model.h"
#include "server/autotune/step_period.h"
#include "tuner/search_space.h"
#include "tuner/tuner.h"

namespace allocd {
namespace {

// The values an online run tries: fewer than `allocd tune`'s default space,
// since a decision must come within seconds on a million events.
constexpr char kOnlineSpace[] =
    "max_split_size_mb=unset|128|256|512|1024,max_non_split_rounding_mb=20|256,"
    "roundup_power2_divisions=unset|4|8,garbage_collection_threshold=0.6|0.8";

bool Pinned(const JobPolicy& policy, const char* key) {
  return absl::c_linear_search(policy.pinned_keys, key);
}

// The online space narrowed to the job: unvaried keys keep the job's values,
// pinned keys have the job's value only, and without leave for a fraction
// garbage collection stays as the job has it.
SearchSpace JobSpace(const RunningConfig& running, const JobPolicy& policy) {
  SearchSpace space = *ApplySpaceSpec(DefaultSearchSpace(), kOnlineSpace);
  const AllocatorConfig& c = running.config;
  space.base = c;
  if (Pinned(policy, "max_split_size_mb")) {
    space.max_split_size_mb = {c.max_split_size == std::numeric_limits<size_t>::max()
                                   ? std::nullopt
                                   : std::optional<size_t>(c.max_split_size / kMiB)};
  }
  if (Pinned(policy, "max_split_size_mb") || Pinned(policy, "max_non_split_rounding_mb")) {
    space.max_non_split_rounding_mb = {c.max_non_split_rounding / kMiB};
  }
  if (Pinned(policy, "roundup_power2_divisions")) {
    space.roundup_power2_divisions = {c.roundup_power2_divisions};
  }
  if (Pinned(policy, "expandable_segments")) {
    space.expandable_segments = {c.expandable_segments};
  }
  if (!policy.allow_memory_fraction || Pinned(policy, "garbage_collection_threshold")) {
    space.garbage_collection = {GcSetting{}};
  }
  return space;
}

// Which pinned key `candidate` would change, or nullptr.
const char* BreaksPin(const Candidate& candidate, const RunningConfig& running,
                      const JobPolicy& policy) {
  return ChangedPinnedKey(candidate.config, running.config, policy.pinned_keys);
}

}  // namespace

const char* ChangedPinnedKey(const AllocatorConfig& a, const AllocatorConfig& b,
                             const std::vector<std::string>& pinned_keys) {
  struct Key {
    const char* name;
    bool same;
  };
  const Key keys[] = {
      {"max_split_size_mb", a.max_split_size == b.max_split_size},
      {"max_non_split_rounding_mb", a.max_non_split_rounding == b.max_non_split_rounding},
      {"roundup_power2_divisions", a.roundup_power2_divisions == b.roundup_power2_divisions},
      {"expandable_segments", a.expandable_segments == b.expandable_segments},
      {"garbage_collection_threshold",
       a.garbage_collection_threshold == b.garbage_collection_threshold},
      {"large_segment_size_mb", a.large_segment_size == b.large_segment_size},
  };
  for (const Key& key : keys) {
    if (!key.same && absl::c_linear_search(pinned_keys, key.name)) return key.name;
  }
  return nullptr;
}

namespace {

// Where to switch without marks: see the header.
uint64_t SwitchPoint(uint64_t events, std::optional<uint64_t> step) {
  if (!step) return events / 2;
  const uint64_t steps_after = events >= 3 * *step ? 2 : 1;
  return events - std::max(steps_after * *step, events / 4);
}

// With the job's marks: two whole steps after the switch when the window
// holds three marks, else one.
uint64_t MarkedSwitchPoint(const std::vector<uint64_t>& ends) {
  return ends[ends.size() >= 3 ? ends.size() - 3 : ends.size() - 2];
}

}  // namespace

int SizeFittedSettings(const Candidate& candidate) {
  const AllocatorConfig& c = candidate.config;
  const AllocatorConfig defaults;
  return (c.max_split_size != defaults.max_split_size) +
         (c.max_non_split_rounding != defaults.max_non_split_rounding) +
         (c.roundup_power2_divisions != defaults.roundup_power2_divisions) +
         (c.garbage_collection_threshold != defaults.garbage_collection_threshold) +
         (c.large_segment_size != defaults.large_segment_size) +
         (c.per_process_memory_fraction != defaults.per_process_memory_fraction ||
          candidate.memory_fraction.has_value());
}

const Evaluation* ChooseProposal(const std::vector<const Evaluation*>& passing,
                                 double simpler_within) {
  if (passing.empty()) return nullptr;
  const double limit =
      (1.0 + simpler_within) * static_cast<double>(passing.front()->replay.peak_reserved);
  const Evaluation* best = passing.front();
  for (const Evaluation* e : passing) {
    if (static_cast<double>(e->replay.peak_reserved) <= limit &&
        SizeFittedSettings(e->candidate) < SizeFittedSettings(best->candidate)) {
      best = e;
    }
  }
  return best;
}

const Evaluation* PreferUnlessBeaten(const std::vector<const Evaluation*>& passing,
                                     const Evaluation* best, const AllocatorConfig& preferred,
                                     double min_saving) {
  if (best == nullptr) return nullptr;
  for (const Evaluation* e : passing) {
    if (!e->candidate.memory_fraction && e->candidate.config == preferred) {
      return SavesAtLeast(e->replay.peak_reserved, best->replay.peak_reserved, min_saving)
                 ? best
                 : e;
    }
  }
  return best;
}

std::string LiveConfigString(const AllocatorConfig& target, const AllocatorConfig& running) {
  const std::string canonical = FormatAllocatorConfig(target);
  absl::StatusOr<AllocatorConfig> updated = ParseAllocatorConfigUpdate(canonical, running);
  if (updated.ok() && *updated == target) return canonical;
  return FormatAllocatorConfigUpdate(target);
}

namespace {

// What the job runs, as a candidate.
Candidate Staying(const RunningConfig& running) {
  return Candidate{running.config, running.memory_fraction};
}

struct GrownSizesVerdict {
  bool holds = true;
  // When it does not hold: the best of the candidates that pass the gates
  // with no more settings fitted to sizes than the job's config (nullptr:
  // none).
  const Evaluation* instead = nullptr;
  std::string why;  // what the check found, for the decision's why
};

// CheckGrownSizes of `best`, which adds settings fitted to sizes to the
// job's config, at GrowthFactors(`growth`), switched at `live_start`,
// against staying and the best of `passing` fitted no more than the job's
// config.
GrownSizesVerdict JudgeOnGrownSizes(const Trace& window, const Evaluation& best,
                                    const std::vector<const Evaluation*>& passing,
                                    const RunningConfig& running, std::optional<double> growth,
                                    const LiveStart& live_start, const DecideOptions& options) {
  const Candidate staying = Staying(running);
  std::vector<const Evaluation*> fitted_no_more;
  for (const Evaluation* e : passing) {
    if (SizeFittedSettings(e->candidate) <= SizeFittedSettings(staying)) fitted_no_more.push_back(e);
  }
  GrownSizesVerdict verdict;
  verdict.instead = ChooseProposal(fitted_no_more, options.simpler_within);
  std::optional<Candidate> simpler;
  if (verdict.instead != nullptr && CandidateKey(verdict.instead->candidate) != CandidateKey(staying)) {
    simpler = verdict.instead->candidate;
  }
  const GrownSizesOptions grown_options{
      .replays = EvaluatorOptions{.capacity = options.capacity,
                                  .total_memory = options.total_memory,
                                  .jobs = options.threads,
                                  .live_start = live_start,
                                  .on_replay = options.on_replay},
      .min_saving = options.min_saving,
      .factors = GrowthFactors(growth)};
  const GrownSizesCheck check =
      CheckGrownSizes(window, staying, best.candidate, simpler, grown_options);
  verdict.holds = check.holds;
  const auto growth_words = [&](double factor) {
    if (factor == kGrowBy) return absl::StrCat("by ", GrowthPercent(factor));
    return absl::StrCat("by ", GrowthPercent(factor), " (the job's newest step asked for ",
                        GrowthPercent(*growth), " more than the steps before it",
                        *growth > factor ? ", tested at most doubled)" : ")");
  };
  if (check.holds) {
    for (const GrownPeaks& p : check.grown) {
      absl::StrAppend(&verdict.why, verdict.why.empty() ? "; when the sizes grow " : ", and ",
                      growth_words(p.factor),
                      absl::StrFormat(" it peaks %s against %s staying",
                                      GiB(p.candidate.peak_reserved),
                                      GiB(p.staying.peak_reserved)));
    }
    absl::StrAppend(&verdict.why, " (each with the cache emptied at the switch): its gain does "
                                  "not depend on the window's exact sizes");
    return verdict;
  }
  const GrownPeaks& p = check.grown[*check.failed];
  const int64_t grown_saving = p.staying.peak_reserved - p.candidate.peak_reserved;
  absl::StrAppend(
      &verdict.why,
      absl::StrFormat("; %s peaks %s on the window's sizes but %s against %s staying",
                      ConfigName(LiveConfigString(best.candidate.config, running.config)),
                      GiB(best.replay.peak_reserved), GiB(p.candidate.peak_reserved),
                      GiB(p.staying.peak_reserved)),
      simpler ? absl::StrFormat(" and %s under %s", GiB(p.simpler.peak_reserved),
                                ConfigName(LiveConfigString(simpler->config, running.config)))
              : std::string(),
      " when the sizes grow ", growth_words(p.factor),
      " (each with the cache emptied at the switch)",
      p.candidate.num_ooms > std::min(p.staying.num_ooms, p.simpler.num_ooms)
          ? absl::StrFormat(", and runs out of memory %d times there", p.candidate.num_ooms)
          : std::string(),
      grown_saving > 0 && p.candidate.peak_reserved <= p.simpler.peak_reserved
          ? absl::StrFormat(" (it saves %.1f%% there, less than the %.0f%% a push needs)",
                            100.0 * static_cast<double>(grown_saving) /
                                static_cast<double>(std::max<int64_t>(1, p.staying.peak_reserved)),
                            100 * options.min_saving)
          : std::string(),
      ": a config fitted to the sizes seen can cost memory on sizes the job has not shown yet, "
      "so it is not pushed");
  return verdict;
}

}  // namespace

Decision Decide(const Trace& window, const RunningConfig& running, const JobPolicy& policy,
                const DecideOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Decision d;
  auto finish = [&](Decision::Result result, std::string why) {
    d.result = result;
    d.why = std::move(why);
    d.replay_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return d;
  };
  const uint64_t n = window.events.size();
  if (n < options.min_events) {
    return finish(Decision::Result::kSkip,
                  absl::StrFormat("the window holds %d events, fewer than the %d a decision "
                                  "needs",
                                  n, options.min_events));
  }
  if (running.config.backend == AllocatorBackend::kCudaMallocAsync) {
    return finish(Decision::Result::kSkip,
                  "the job runs backend:cudaMallocAsync, which a running process cannot leave");
  }

  std::vector<uint64_t> marks;
  for (uint64_t end : options.step_ends) {
    if (end <= n) marks.push_back(end);
  }
  const bool marked = marks.size() >= 2;
  std::string evidence = absl::StrFormat("window of %d events; ", n);
  if (marked) {
    d.step_events = marks.back() - marks[marks.size() - 2];
    absl::StrAppend(&evidence, absl::StrFormat("the job marked %d steps, the last of %d events",
                                               marks.size(), *d.step_events));
  } else {
    d.step_events = options.step_events ? *options.step_events
                                        : FindStepPeriod(window, options.max_shift);
    absl::StrAppend(&evidence,
                    d.step_events ? absl::StrFormat("a step found in the stream takes %d events",
                                                    *d.step_events)
                                  : std::string("no repeating step found"));
  }
  if (options.switch_event && *options.switch_event < n) {
    d.switch_event = *options.switch_event;
  } else {
    d.switch_event = marked ? MarkedSwitchPoint(marks) : SwitchPoint(n, d.step_events);
    if (options.cover_from && *options.cover_from < d.switch_event) {
      d.switch_event = *options.cover_from;
    }
  }
  const uint64_t steps_covered =
      marked ? static_cast<uint64_t>(absl::c_count_if(
                   marks, [&](uint64_t end) { return end > d.switch_event; }))
             : 0;
  absl::StrAppend(
      &evidence,
      absl::StrFormat("; the prediction covers the %d events after event %d", n - d.switch_event,
                      d.switch_event),
      marked ? absl::StrFormat(" (%d whole steps the job marked)", steps_covered)
      : options.cover_from && d.switch_event <= *options.cover_from
          ? std::string(" (the job's largest request so far)")
      : d.step_events ? std::string(" (whole steps found in the stream)")
                      : std::string(" (the window's second half: no step known)"),
      window.partial.state_before_first_event && d.switch_event == 0
          ? absl::StrFormat(", replayed from the allocator's real state the client sent there "
                            "(%d segments, %d blocks held)",
                            window.partial.segments.size(), window.partial.blocks.size())
          : std::string(", replayed from the state the window rebuilds there"),
      "; steps that allocate more later need more under every config");

  ReplayOptions stay_options;
  stay_options.capacity = options.capacity;
  stay_options.total_memory = options.total_memory;
  stay_options.memory_fraction = running.memory_fraction;
  stay_options.live_switch = LiveSwitch{d.switch_event, std::nullopt, std::nullopt};
  absl::StatusOr<ReplayResult> stay = [&] {
    CountedReplay counted(options.on_replay);
    return Replay(window, running.config, stay_options);
  }();
  if (!stay.ok()) {
    return finish(Decision::Result::kSkip,
                  absl::StrCat(evidence, "; the window does not replay: ", stay.status().message()));
  }
  const ReplayPhase& stayed = *stay->after_switch;
  d.predicted_peak_current = stayed.peak_reserved;
  d.predicted_peak_allocated = stayed.peak_allocated;
  d.predicted_peak_requested = stayed.peak_requested;
  const std::string running_conf = FormatAllocatorConfig(running.config);
  absl::StrAppend(&evidence, absl::StrFormat("; staying on %s peaks at %s after it",
                                             ConfigName(running_conf), GiB(stayed.peak_reserved)));

  TuneOptions tune;
  tune.capacity = options.capacity;
  tune.total_memory = options.total_memory;
  tune.budget = options.budget;
  tune.jobs = options.threads;
  tune.max_retries = stayed.num_alloc_retries;
  tune.max_call_ratio = options.max_call_ratio;
  // A switch's empty cache makes the job rebuild its cache: device calls are
  // judged against switching to the job's own config, which pays the same.
  tune.baseline = Staying(running);
  tune.live_start = LiveStart{running.config, running.memory_fraction, d.switch_event};
  tune.on_replay = options.on_replay;
  SearchSpace space = JobSpace(running, policy);
  // A key the job's features rule out is not searched: the budget goes to
  // configs that can be pushed. (Each candidate is checked again below.)
  if (!running.config.expandable_segments) {
    AllocatorConfig expandable = running.config;
    expandable.expandable_segments = true;
    if (std::optional<std::string> why = ConfigIncompatibility(
            options.features, running.config, expandable, /*live=*/true)) {
      space.expandable_segments = {false};
      d.left_out.push_back(LeftOutConfig{"expandable_segments:True", *std::move(why)});
    }
  }
  absl::StatusOr<TuneReport> report = Tune(window, space, tune);
  if (!report.ok()) {
    return finish(Decision::Result::kSkip,
                  absl::StrCat(evidence, "; the search failed: ", report.status().message()));
  }
  d.candidates = report->evaluations;
  const ReplaySummary& rebuilt = report->baseline.replay;
  const int64_t rebuilt_calls = rebuilt.num_device_alloc + rebuilt.num_device_free;

  // The candidates that pass every gate, best first; the better ones that
  // failed are counted by gate.
  int pinned = 0, fraction = 0, oom = 0, retries = 0, calls = 0, invalid = 0, breaks = 0;
  const auto failed_gate = [&](const Evaluation& e) -> int* {
    const ReplaySummary& r = e.replay;
    if (BreaksPin(e.candidate, running, policy) != nullptr) return &pinned;
    if (std::optional<std::string> why = ConfigIncompatibility(
            options.features, running.config, e.candidate.config, /*live=*/true)) {
      std::string config = ConfigName(LiveConfigString(e.candidate.config, running.config));
      if (absl::c_none_of(d.left_out, [&](const LeftOutConfig& l) { return l.config == config; })) {
        d.left_out.push_back(LeftOutConfig{std::move(config), *std::move(why)});
      }
      return &breaks;
    }
    if (e.candidate.memory_fraction && !policy.allow_memory_fraction) return &fraction;
    if (r.num_ooms > 0) return &oom;
    if (r.num_alloc_retries > stayed.num_alloc_retries) return &retries;
    if (options.max_call_ratio > 0 &&
        static_cast<double>(r.num_device_alloc + r.num_device_free) >
            options.max_call_ratio * static_cast<double>(std::max<int64_t>(1, rebuilt_calls))) {
      return &calls;
    }
    if (!ParseAllocatorConfig(LiveConfigString(e.candidate.config, running.config)).ok()) {
      return &invalid;
    }
    return nullptr;
  };
  std::vector<const Evaluation*> passing;
  for (const Evaluation& e : report->ranked) {
    if (int* gate = failed_gate(e); gate == nullptr) {
      passing.push_back(&e);
    } else if (passing.empty()) {
      ++*gate;
    }
  }
  const Evaluation* const lowest_fitted = ChooseProposal(passing, options.simpler_within);
  const Evaluation* best =
      options.preferred && !marked
          ? PreferUnlessBeaten(passing, lowest_fitted, *options.preferred, options.min_saving)
          : lowest_fitted;
  const bool took_preferred = best != lowest_fitted;
  std::string gates;
  for (const auto& [count, what] :
       {std::pair{pinned, "change a pinned key"}, std::pair{fraction, "need a memory fraction"},
        std::pair{oom, "run out of memory"}, std::pair{retries, "flush the cache more often"},
        std::pair{calls, "make too many device calls"},
        std::pair{invalid, "are rejected by PyTorch"},
        std::pair{breaks, "would break what the job does"}}) {
    if (count > 0) absl::StrAppend(&gates, gates.empty() ? "" : ", ", count, " ", what);
  }
  if (!gates.empty()) gates = absl::StrCat("; better candidates that ", gates, " were left out");
  if (!d.left_out.empty()) {
    // Each config and its reason are in `left_out`; the text names the first.
    absl::StrAppend(&gates, "; left out for what the job does (", FeatureNames(options.features),
                    "): ", d.left_out.front().config, " (", d.left_out.front().why, ")",
                    d.left_out.size() > 1
                        ? absl::StrFormat(" and %d more configs", d.left_out.size() - 1)
                        : "");
  }


  absl::StrAppend(&evidence, absl::StrFormat("; %d candidates replayed", d.candidates), gates);
  if (best == nullptr) {
    return finish(Decision::Result::kKeep,
                  absl::StrCat(evidence, "; no candidate passes the gates"));
  }

  // A candidate fitted to sizes more than the job's config, which the
  // window's steps would push, must keep its gain when the sizes grow.
  const Evaluation* const chosen = best;
  std::string grown_note;
  if (SizeFittedSettings(best->candidate) > SizeFittedSettings(Staying(running)) &&
      SavesAtLeast(stayed.peak_reserved, best->replay.peak_reserved, options.min_saving)) {
    const std::optional<double> growth =
        options.size_growth ? options.size_growth : StepGrowth(window, marks, d.step_events);
    GrownSizesVerdict verdict =
        JudgeOnGrownSizes(window, *best, passing, running, growth, *tune.live_start, options);
    if (verdict.holds) {
      grown_note = std::move(verdict.why);
    } else {
      absl::StrAppend(&evidence, verdict.why);
      best = verdict.instead;
      if (best == nullptr) {
        return finish(Decision::Result::kKeep,
                      absl::StrCat(evidence, "; no candidate with no more settings fitted to sizes "
                                   "than ", ConfigName(running_conf), " passes the gates"));
      }
    }
  }

  d.to = best->candidate;
  d.to_config = LiveConfigString(best->candidate.config, running.config);
  d.predicted_peak_switched = best->replay.peak_reserved;
  const int64_t saving = d.predicted_peak_current - d.predicted_peak_switched;
  const std::string fraction_note =
      d.to.memory_fraction ? absl::StrFormat(" with memory fraction %g", *d.to.memory_fraction)
                           : std::string();
  absl::StrAppend(&evidence,
                  absl::StrFormat("; best: %s%s peaks at %s (saves %s, %.1f%%; no OOM, %d "
                                  "retries, %d device calls against %d for emptying the "
                                  "cache on the same config)",
                                  ConfigName(d.to_config), fraction_note,
                                  GiB(d.predicted_peak_switched), GiB(saving),
                                  100.0 * static_cast<double>(saving) /
                                      static_cast<double>(std::max<int64_t>(1, d.predicted_peak_current)),
                                  best->replay.num_alloc_retries,
                                  best->replay.num_device_alloc + best->replay.num_device_free,
                                  rebuilt_calls));
  if (took_preferred && best == chosen) {
    absl::StrAppend(
        &evidence,
        absl::StrFormat("; chosen over %s, which peaks %s: less than the %.0f%% that "
                        "picks another config than %s, the safe one for the job's harmful "
                        "start, on a window without two steps the job marked",
                        ConfigName(LiveConfigString(lowest_fitted->candidate.config,
                                                    running.config)),
                        best->replay.peak_reserved > lowest_fitted->replay.peak_reserved
                            ? absl::StrCat(FormatSize(static_cast<uint64_t>(
                                               best->replay.peak_reserved -
                                               lowest_fitted->replay.peak_reserved)),
                                           " lower")
                            : std::string("as low"),
                        100 * options.min_saving, ConfigName(d.to_config)));
  } else if (best == chosen && best != passing.front()) {
    const Evaluation& lowest = *passing.front();
    absl::StrAppend(
        &evidence,
        absl::StrFormat("; chosen over %s, which peaks %s lower with %d more setting(s) "
                        "fitted to sizes: within %.0f%%, the one fitted less to the window's sizes",
                        ConfigName(LiveConfigString(lowest.candidate.config, running.config)),
                        FormatSize(static_cast<uint64_t>(best->replay.peak_reserved -
                                                         lowest.replay.peak_reserved)),
                        SizeFittedSettings(lowest.candidate) -
                            SizeFittedSettings(best->candidate),
                        100 * options.simpler_within));
  }
  absl::StrAppend(&evidence, grown_note);
  if (d.to.config == running.config &&
      (!d.to.memory_fraction || d.to.memory_fraction == running.memory_fraction)) {
    return finish(Decision::Result::kKeep,
                  absl::StrCat(evidence, "; that is the config the job runs"));
  }
  if (!SavesAtLeast(d.predicted_peak_current, d.predicted_peak_switched, options.min_saving)) {
    return finish(Decision::Result::kKeep,
                  absl::StrCat(evidence, absl::StrFormat("; less than the %.0f%% a push needs",
                                                         100 * options.min_saving)));
  }
  ReplayOptions rollback_options = stay_options;
  rollback_options.live_switch.reset();
  absl::StatusOr<RollbackPrediction> rollback =
      PredictRollback(window, d.switch_event, running.config, d.to.config, rollback_options,
                      options.on_replay);
  if (!rollback.ok()) {
    return finish(Decision::Result::kKeep,
                  absl::StrCat(evidence, "; its rollback could not be predicted (",
                               rollback.status().message(), "): not pushed"));
  }
  d.predicted_peak_rolled_back = rollback->rolled_back;
  d.predicted_peak_staying_repeat = rollback->staying;
  absl::StrAppend(&evidence,
                  absl::StrFormat("; were it rolled back at the window's end, the job would "
                                  "peak at %s over those events again (%s made under it still "
                                  "reserved at the rollback) against %s staying",
                                  GiB(rollback->rolled_back), GiB(rollback->held_at_rollback),
                                  GiB(rollback->staying)));
  // Staying's replay over the whole window (before and after the switch)
  // against the peak the job realised over the same steps.
  std::optional<double> replay_error;
  if (options.realized_peak_reserved && *options.realized_peak_reserved > 0) {
    const int64_t replayed =
        std::max(stay->before_switch ? stay->before_switch->peak_reserved : 0,
                 stayed.peak_reserved);
    replay_error = std::abs(static_cast<double>(replayed - *options.realized_peak_reserved)) /
                   static_cast<double>(*options.realized_peak_reserved);
  }
  const RollbackRisk risk =
      WeighRollback(saving, d.predicted_peak_current, rollback->rolled_back, rollback->staying,
                    replay_error, options.device_room);
  d.miss_chance = risk.miss_chance;
  absl::StrAppend(&evidence, "; ", risk.why);
  return finish(risk.push ? Decision::Result::kPropose : Decision::Result::kKeep, evidence);
}

}  // namespace allocd
