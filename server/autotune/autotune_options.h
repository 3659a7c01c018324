// AutotuneOptions: how the autotuner (autotuner.h) decides, watches a push
// and bounds what it keeps; --autotune-* flags and the config file set them.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_OPTIONS_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "server/autotune/autotune_memory.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/start_config.h"

namespace allocd {

struct AutotuneOptions {
  JobPolicy default_policy;                // for jobs without their own
  int threads = 1;                         // replay threads: --autotune-threads
  int nice = 10;                           // niceness added to the worker threads
  size_t window_events = size_t{1} << 20;  // per job: bounds daemon memory
  // What all windows hold together (--autotune-memory) and one tenant's
  // windows (--autotune-memory-per-tenant), with where a window trimmed or
  // stopped to fit is told (AutotuneMemory).
  AutotuneMemoryOptions memory;
  // Of the predicted peak reserved on the current config. Also how much
  // lower than a push set for the job, replayed from the window's first
  // event, what the run had without it must peak for the job's next runs to
  // start on that instead (learn_check.h): a decision at the run's start
  // would not have left it for less.
  double min_saving = 0.05;
  uint64_t capacity = 0;     // device memory for replays (0: unlimited)
  uint64_t total_memory = 0;  // base of memory fractions (0: capacity)
  double fragmentation_ratio = 1.5;  // reserved/allocated above this ...
  absl::Duration fragmentation_for = absl::Seconds(30);  // ... for this long triggers a run
  // Watch the canary this long. A canary whose session ends first sets the
  // push for the job (and, once checked from the window's first event, its
  // next runs: learn_check.h) when a judgement kept it, or its watch saw
  // whole steps under it within the rollback margin. A
  // canary that is one of several ranks sets it for every rank once its
  // first step under it is judged (Canary::Push::lockstep), not after this.
  absl::Duration canary_window = absl::Seconds(10);
  // A push is judged when its realised peak reserved is above the predicted
  // one by more than this and has lost at least half the predicted saving
  // (it is nearer to what staying would cost than to the prediction: a push
  // that kept most of its promise is not questioned for missing it by a
  // little, as when the job got it later in a step than predicted). Both
  // predictions are first scaled by how much more the job allocated than it
  // did in the window (later steps of a job with dynamic shapes need more
  // under any config: that is not the config's doing): measured on the
  // canary's stream after the push where it has sent one, else on PyTorch's
  // peak in its stats reports, which a job that resets it every step shows
  // only in part.
  //
  // Judged on the canary's events after the push where the window holds
  // them: a replay of staying on those same events says what not pushing
  // would have cost, and the push is rolled back only when the job
  // realised more than that, the pushed config replayed on those events
  // accounts for what it realised (within this margin; else the peak came
  // from events not recorded yet, and it is judged again once the canary
  // has run twice as many events after the push), and a rollback (the
  // segments made under the push stay reserved until their blocks are
  // freed) is predicted to leave the job lower than keeping the push.
  // Without those events (another session is recorded), it is rolled back
  // on the prediction alone. Once judged and kept, it is judged again when
  // its realised peak grows by this much more. A config rolled back on
  // what the job realised is proposed again only once the job requests
  // more than it had then by growth_margin (that judgement saw no larger
  // request); one rolled back on a NACK or an OOM, never.
  double rollback_margin = 0.10;
  // A window whose clients lost at most this fraction of its events is
  // replayed anyway: the window repairs what a few lost events break (frees
  // of unseen ids left out, an id allocated again freed first), and an
  // advisor, which reads PyTorch's history between rounds, loses a handful
  // of events on any busy job. Above it, runs wait for the window to move
  // past the gap.
  double max_lost_fraction = 0.001;

  // --- additions of the core (not in the first contract)
  // The first pass runs once the window holds this many events and two
  // repetitions of the job's step (or is full); no run decides on fewer.
  size_t first_pass_min_events = 2000;
  // Step marks a marked job's window holds at its first pass (see above).
  size_t first_pass_steps = 3;
  // Events after which a job with no step marks and no step found is
  // decided on as aperiodic.
  size_t aperiodic_after_events = size_t{1} << 16;
  // How much larger a request, or reserved memory than the best config's
  // need, must be to decide again (see above).
  double growth_margin = 0.10;
  // After a run for a job, triggers other than admin and OOM wait this long.
  absl::Duration cooldown = absl::Minutes(5);
  // Decisions kept per job for History().
  size_t history_per_job = 64;
  // Jobs with no session left whose state (decisions, first pass) is kept,
  // the most recently ended: a flood of job labels cannot grow the daemon
  // without bound. A job with a push or review still under way is dropped
  // once it is through (a push applied for the job is through); a dropped
  // job that comes back starts afresh (its learned config, kept by the
  // daemon, still starts it).
  size_t ended_jobs_kept = 256;
  // Candidates a run replays at most, and the device-call gate (see
  // decider.h).
  size_t budget = 32;
  double max_call_ratio = 2.0;
  // --autotune-prior and --autotune-seed-prior: what a job in apply mode
  // without a learned config starts on (start_config.h). Off (`allocd
  // serve` defaults to learned, then the seed): a daemon built in code
  // decides nothing before a job's first allocation but hand it its
  // learned config.
  PriorSetting prior{.kind = PriorSetting::Kind::kOff};
  // The clock (tests inject one); empty: absl::Now.
  std::function<absl::Time()> now;
  // Called with +1 as a replay starts and -1 as it ends (metrics, tests).
  std::function<void(int)> on_replay;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_OPTIONS_H_
