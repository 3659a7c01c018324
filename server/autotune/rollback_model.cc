#include "server/autotune/rollback_model.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "server/autotune/autotune_types.h"

namespace allocd {

Trace RepeatTail(const Trace& window, uint64_t from) {
  Trace out = window;
  const uint64_t n = window.events.size();
  if (from >= n) return out;
  out.events.reserve(n + (n - from));
  absl::flat_hash_map<uint32_t, uint32_t> repeated;  // the window's id -> the repeat's
  for (uint64_t i = from; i < n; ++i) {
    TraceEvent e = window.events[i];
    if (e.op == TraceOp::kAlloc) {
      repeated[e.id] = out.num_ids;
      e.id = out.num_ids++;
    } else {
      auto it = repeated.find(e.id);
      if (it == repeated.end()) continue;
      e.id = it->second;
    }
    out.events.push_back(e);
  }
  return out;
}

PushVerdict JudgePush(int64_t realized, int64_t staying, int64_t pushed_replayed,
                      const RollbackPrediction& rollback, double margin) {
  if (realized <= staying) return PushVerdict::kKeepNoWorse;
  if (rollback.rolled_back >= rollback.keeping) return PushVerdict::kKeepRollbackNoBetter;
  if (static_cast<double>(realized) >
      static_cast<double>(pushed_replayed) * (1.0 + margin)) {
    return PushVerdict::kWaitForEvents;
  }
  return PushVerdict::kRollBack;
}

RollbackRisk WeighRollback(int64_t saving, int64_t staying_peak, int64_t rolled_back,
                           int64_t staying_repeat, std::optional<double> replay_error,
                           std::optional<uint64_t> room) {
  RollbackRisk risk;
  const int64_t worst = std::max<int64_t>(0, rolled_back - staying_repeat);
  risk.expected_cost = worst;
  if (worst <= saving) {
    risk.push = true;
    risk.why = absl::StrFormat("a rollback's worst case (%s above staying) is no more than the "
                               "push saves",
                               GiB(worst));
    return risk;
  }
  if (room && *room >= static_cast<uint64_t>(worst)) {
    risk.push = true;
    risk.why = absl::StrFormat("a rollback could cost %s above staying, more than the push saves, "
                               "but the job's GPU has %s free: room for that worst case",
                               GiB(worst), GiB(static_cast<int64_t>(*room)));
    return risk;
  }
  if (!replay_error || saving <= 0 || staying_peak <= 0) {
    risk.why = absl::StrFormat(
        "a rollback would cost more than the push saves (%s above staying, against %s saved; "
        "%s): not pushed",
        GiB(worst), GiB(saving),
        replay_error ? std::string("nothing is saved")
                     : std::string("no realised peak to measure the replay against, so the worst "
                                   "case counts as certain"));
    return risk;
  }
  const double error = std::max(*replay_error, kMinReplayError);
  const double saving_share = static_cast<double>(saving) / static_cast<double>(staying_peak);
  risk.miss_chance = std::min(1.0, error / saving_share);
  risk.expected_cost = static_cast<int64_t>(risk.miss_chance * static_cast<double>(worst));
  risk.push = risk.expected_cost <= saving;
  risk.why = absl::StrFormat(
      "staying's replay matched the job's realised peak within %.1f%%, against a predicted saving "
      "of %.1f%%: the push misses with a chance of at most %.0f%%, so a rollback's %s above "
      "staying is expected to cost %s, %s the %s it saves%s",
      100 * *replay_error, 100 * saving_share, 100 * risk.miss_chance, GiB(worst),
      GiB(risk.expected_cost), risk.push ? "no more than" : "more than", GiB(saving),
      risk.push ? "" : ": not pushed");
  return risk;
}

absl::StatusOr<RollbackPrediction> PredictRollback(
    const Trace& window, uint64_t from, const AllocatorConfig& running,
    const AllocatorConfig& pushed, const ReplayOptions& base,
    const std::function<void(int)>& on_replay) {
  const uint64_t n = window.events.size();
  if (from > n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the push at event %d is past the window's %d events", from, n));
  }
  const Trace trace = RepeatTail(window, from);
  // Each replay splits at the window's end: its peak after it is the repeat's.
  auto after_end = [&](const AllocatorConfig& config,
                       std::optional<AllocatorConfig> switch_to) -> absl::StatusOr<ReplayPhase> {
    ReplayOptions options = base;
    options.live_switch = LiveSwitch{n, std::move(switch_to), std::nullopt};
    absl::StatusOr<ReplayResult> r = [&] {
      CountedReplay counted(on_replay);
      return Replay(trace, config, options);
    }();
    if (!r.ok()) return r.status();
    return *r->after_switch;
  };
  absl::StatusOr<ReplayPhase> staying = after_end(running, std::nullopt);
  if (!staying.ok()) return staying.status();
  absl::StatusOr<ReplayPhase> keeping = after_end(pushed, std::nullopt);
  if (!keeping.ok()) return keeping.status();
  absl::StatusOr<ReplayPhase> rolled_back = after_end(pushed, running);
  if (!rolled_back.ok()) return rolled_back.status();
  return RollbackPrediction{.staying = staying->peak_reserved,
                            .keeping = keeping->peak_reserved,
                            .rolled_back = rolled_back->peak_reserved,
                            .held_at_rollback = rolled_back->reserved_at_start,
                            .repeated_events = trace.events.size() - n};
}

}  // namespace allocd
