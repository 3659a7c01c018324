// PredictRollback: what rolling a pushed config back would leave a job
// with, so that neither a push nor its rollback leaves the job worse than
// not pushing.
//
// A rollback pushes the job's old config back and empties the cache. The
// segments made under the pushed config that still hold live blocks stay
// reserved until those blocks are freed (and the cache emptied again), and
// the old config reuses them only as its own rules allow (a small
// max_split_size_mb does not split a large block it finds). So a rollback
// can leave a job above keeping the push, and above never having pushed.
//
// The job's next steps are predicted as the window's events from the push
// (or the decision's switch point) on, once more (RepeatTail). Three
// replays of that trace are judged over the repeat: staying on the job's
// config throughout, keeping the pushed one, and rolling back at the
// window's end. A replay switches configs once, so keeping and rolling
// back run under the pushed config from the window's start: what the
// rollback finds is what the pushed config made, including for the
// allocations before the push that were still live at its end.
#ifndef ALLOCD_SERVER_AUTOTUNE_ROLLBACK_MODEL_H_
#define ALLOCD_SERVER_AUTOTUNE_ROLLBACK_MODEL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/trace.h"

namespace allocd {

// Peaks reserved over the repeat of the window's events from the push on.
struct RollbackPrediction {
  int64_t staying = 0;
  int64_t keeping = 0;
  int64_t rolled_back = 0;
  // Reserved right after the rollback's empty cache: what the push made
  // and its live blocks still hold.
  int64_t held_at_rollback = 0;
  uint64_t repeated_events = 0;
};

// `base`: capacity and memory fraction of the replays (its live_switch is
// ignored). `on_replay` (optional) is told +1/-1 around each replay.
// InvalidArgument when `from` is past the window's end; a replay's error
// otherwise.
absl::StatusOr<RollbackPrediction> PredictRollback(
    const Trace& window, uint64_t from, const AllocatorConfig& running,
    const AllocatorConfig& pushed, const ReplayOptions& base,
    const std::function<void(int)>& on_replay = nullptr);

// What a push's judgement concludes (Canary::Judged), from peaks reserved
// over the events the canary ran after the push: what the job realised,
// staying on its old config replayed on them, and the pushed config
// replayed on them from the push (`pushed_replayed`).
enum class PushVerdict {
  kKeepNoWorse,         // realised at most what staying would have cost
  kKeepRollbackNoBetter,  // a rollback is predicted no lower than keeping
  // The events do not account for what the job realised (it is above the
  // pushed config's replay on them by more than `margin`): the peak came
  // from events not recorded yet (a stats report runs ahead of the event
  // stream), and comparing it with staying on fewer events would blame the
  // push for steps staying was never replayed on. Judged again on more.
  kWaitForEvents,
  kRollBack,
};
// Keeping is the default: a push is rolled back only when it realised more
// than staying, the events explain that, and a rollback is predicted to
// leave the job lower than keeping.
PushVerdict JudgePush(int64_t realized, int64_t staying, int64_t pushed_replayed,
                      const RollbackPrediction& rollback, double margin);

// Whether a push whose rollback could leave the job above staying is worth
// making (Decide's last gate). `worst` = rolled_back - staying_repeat, what
// a rollback would cost over staying if the push missed. The push is made
// when that worst case is no more than the predicted `saving`; else when
// the job's GPU has room for it (`room`: device memory no session holds,
// known when the job's memory comes from the daemon's pool), since a miss
// then costs memory nobody needs, not an OOM; else on the expected cost:
// the chance of a miss weighs the worst case, and the push is made when
// miss_chance * worst <= saving.
//
// The chance of a miss comes from how closely staying's replay matched
// what the job realised on the steps it already ran (`replay_error`: |replay
// - realised| / realised of its peak reserved under the config it runs).
// A push misses when its real peak exceeds the prediction by more than the
// predicted saving (a share `saving_share` of staying's); with the replay's
// error known, Markov's bound gives P(error >= saving_share) <=
// error / saving_share. The error counts as at least kMinReplayError (a
// stats report and the event stream are read at slightly different points).
// Without an error (no realised peak to compare, or a window that does not
// start where the job did) the worst case counts as certain.
inline constexpr double kMinReplayError = 0.01;
struct RollbackRisk {
  bool push = false;
  double miss_chance = 1.0;
  int64_t expected_cost = 0;  // miss_chance * worst
  std::string why;            // for the decision's `why`
};
RollbackRisk WeighRollback(int64_t saving, int64_t staying_peak, int64_t rolled_back,
                           int64_t staying_repeat, std::optional<double> replay_error,
                           std::optional<uint64_t> room);

// `window` followed by its events from `from` on once more: allocations of
// the repeat get ids of their own, and frees of what the repeat did not
// allocate are left out (what was live at the window's end stays live).
Trace RepeatTail(const Trace& window, uint64_t from);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_ROLLBACK_MODEL_H_
