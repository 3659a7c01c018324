// The learn check: which config a push set for the whole job teaches its
// next runs (issue 40). A push is decided, watched and judged as a switch in
// the middle of a run, on top of the segments the run cut under the config
// it replaced; a learned config is used from the first allocation of the
// next run, which none of that judged. On an H200 a DDP job's growth push of
// max_split_size_mb:1024 with expandable segments, watched within the
// margin over the run's last two steps, was learned, and its next run
// peaked 30.9% above expandable segments alone from step 0.
//
// So before a push is learned, the job's window is replayed from its first
// event under the push and under what the run had without it. Pure: no
// I/O, no lock; the autotuner's worker runs it.
#ifndef ALLOCD_SERVER_AUTOTUNE_LEARN_CHECK_H_
#define ALLOCD_SERVER_AUTOTUNE_LEARN_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/trace/replay_types.h"
#include "allocator/trace/trace.h"
#include "server/autotune/autotune_types.h"

namespace allocd {

// What a learn check replays: the job's window from its first event (the
// oldest it still holds: the run's first unless the window trimmed it,
// JobWindow::ToTrace), and the configs it replays it under.
struct LearnCheckInput {
  Trace trace;
  std::string pushed;  // canonical: the push set for the job
  // Canonical, each once and none of them `pushed`: what the run had
  // without the push (the config the push replaced, then the one the run
  // started on).
  std::vector<std::string> alternatives;
};

// The config the job's next runs start on, each config replayed from the
// trace's first event (no live switch: a next run starts on it). The
// pushed config, unless an alternative peaks below it by more than
// `min_saving` of its peak (the saving a decision needs to move a job off
// its config: one made at the run's start would not have left that
// alternative for the push), or the pushed config runs out of memory where
// an alternative does not: then the alternative that peaks lowest. An
// alternative that does not parse, replay, or fit (an OOM) is left out;
// without alternatives the pushed config is learned unreplayed. `base`: the
// device the replays run on (its live switch ignored; each config's own
// memory fraction applies). The pushed config's replay error when it does
// not parse or replay.
absl::StatusOr<LearnedFromPush> CheckLearned(const LearnCheckInput& in, double min_saving,
                                             const ReplayOptions& base);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_LEARN_CHECK_H_
