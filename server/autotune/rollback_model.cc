#include "server/autotune/rollback_model.h"

#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"

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
    if (on_replay) on_replay(+1);
    absl::StatusOr<ReplayResult> r = Replay(trace, config, options);
    if (on_replay) on_replay(-1);
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
