#include "server/autotune/learn_check.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "server/autotune/decision_inputs.h"

namespace allocd {
namespace {

// `config` replayed from the trace's first event as a run started on it.
absl::StatusOr<ReplayResult> ReplayFromStart(const Trace& trace, const std::string& config,
                                             const ReplayOptions& base) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
  if (!parsed.ok()) return parsed.status();
  ReplayOptions options = base;
  options.live_switch.reset();
  options.memory_fraction = RunningConfigOf(*parsed).memory_fraction;
  return Replay(trace, *parsed, options);
}

}  // namespace

absl::StatusOr<LearnedFromPush> CheckLearned(const LearnCheckInput& in, double min_saving,
                                             const ReplayOptions& base) {
  LearnedFromPush learned{.config = in.pushed};
  if (in.alternatives.empty()) {
    learned.why = absl::StrCat("learned ", ConfigName(in.pushed),
                               ": the run had no other config to start its next runs on");
    return learned;
  }
  absl::StatusOr<ReplayResult> pushed = ReplayFromStart(in.trace, in.pushed, base);
  if (!pushed.ok()) return pushed.status();
  const bool pushed_oom = pushed->num_ooms > 0;
  learned.pushed_peak = pushed->peak_reserved;
  learned.peak = pushed->peak_reserved;
  // The alternative that peaks lowest, and what each replayed to.
  std::optional<std::string> best;
  int64_t best_peak = 0;
  std::string replayed;
  for (const std::string& alternative : in.alternatives) {
    absl::StatusOr<ReplayResult> r = ReplayFromStart(in.trace, alternative, base);
    absl::StrAppend(&replayed, ", ", ConfigName(alternative), " ");
    if (!r.ok()) {
      absl::StrAppend(&replayed, "does not replay (", r.status().message(), ")");
      continue;
    }
    if (r->num_ooms > 0) {
      absl::StrAppend(&replayed, "runs out of memory");
      continue;
    }
    absl::StrAppend(&replayed, "at ", GiB(r->peak_reserved));
    if (!best || r->peak_reserved < best_peak) {
      best = alternative;
      best_peak = r->peak_reserved;
    }
  }
  const std::string evidence = absl::StrFormat(
      "replayed from the window's first event (%d events), as a next run starts on it, %s "
      "peaks at %s%s%s",
      in.trace.events.size(), ConfigName(in.pushed), GiB(pushed->peak_reserved),
      pushed_oom ? " (out of memory)" : "", replayed);
  const bool alternative_wins =
      best.has_value() &&
      (pushed_oom || static_cast<double>(best_peak) <
                         (1.0 - min_saving) * static_cast<double>(pushed->peak_reserved));
  if (!alternative_wins) {
    learned.why = absl::StrFormat(
        "learned %s: %s; no config the run had without it peaks lower by more than %.0f%%",
        ConfigName(in.pushed), evidence, 100 * min_saving);
    return learned;
  }
  learned.config = *best;
  learned.peak = best_peak;
  learned.why = absl::StrFormat(
      "learned %s instead of the push's %s: %s; the push was judged as a switch in the middle "
      "of the run, on top of the segments cut before it, and from the start it %s",
      ConfigName(*best), ConfigName(in.pushed), evidence,
      pushed_oom ? "runs out of memory"
                 : absl::StrFormat("peaks %.1f%% above %s",
                                   100.0 * (static_cast<double>(pushed->peak_reserved) /
                                                static_cast<double>(best_peak) -
                                            1.0),
                                   ConfigName(*best)));
  return learned;
}

}  // namespace allocd
