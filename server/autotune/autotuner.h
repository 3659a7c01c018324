// Autotuner: the daemon's online autotuning (issue 12). It keeps a bounded
// window of each job's allocation events, decides on triggers (first pass,
// fragmentation, alloc retry, OOM, a bad starting config, growth, an admin's
// run) whether a live switch to another allocator config would lower the
// job's peak reserved memory for the rest of its run, and acts on the
// decision per the job's mode: records it (recommend), or pushes it to a
// canary session, watches its real stats and then sets it for the whole
// job, rolling back on a NACK, an OOM or a realised peak worse than staying
// would have been on the same events (apply).
//
// When the first pass comes. A job that marks its steps (kStepMark: the
// Python client marks each optimizer step) is periodic by its marks: it is
// decided on once its window holds `first_pass_steps` marks (two whole steps
// after the first, which may be a warm-up), or two when it started on a
// config known to be harmful. A job whose client marks steps but that has
// marked none after `aperiodic_after_events` events runs no optimizer: it is
// aperiodic (inference, generation), decided on once its largest request so
// far has peaked; a repeat in its stream (a decoded token, a sampling step)
// is no step of it. A client that cannot mark (a C++ client, a replay): its
// job is periodic when FindStepPeriod finds its step, and aperiodic, as
// above, with none. Afterwards a job is decided on again,
// whatever the cooldown, when a request larger than any its last decision
// saw by `growth_margin` has peaked ("larger_request"), or when its reserved
// memory grows past what its last decision said its best config needs by
// `growth_margin` ("growth").
//
// A job is a label within a tenant (JobKey): another tenant's sessions
// under the same label are another job, with its own window, decisions and
// policy, and what is decided for one is pushed to its own sessions only.
//
// It knows nothing of the daemon's RPCs: the daemon feeds it sessions,
// events and stats, and it acts through AutotuneActions. Replays run on its
// own worker threads, never on the feeding thread.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/autotune/autotune_memory.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/job_key.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

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
  double min_saving = 0.05;  // of the predicted peak reserved on the current config
  uint64_t capacity = 0;     // device memory for replays (0: unlimited)
  uint64_t total_memory = 0;  // base of memory fractions (0: capacity)
  double fragmentation_ratio = 1.5;  // reserved/allocated above this ...
  absl::Duration fragmentation_for = absl::Seconds(30);  // ... for this long triggers a run
  // Watch the canary this long. A canary whose session ends first sets the
  // push for the job (and so its next runs) when a judgement kept it, or
  // its watch saw whole steps under it within the rollback margin.
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
  // The clock (tests inject one); empty: absl::Now.
  std::function<absl::Time()> now;
  // Called with +1 as a replay starts and -1 as it ends (metrics, tests).
  std::function<void(int)> on_replay;
};

// What the autotuner asks of the daemon; the daemon implements it over
// DaemonCore's public calls. Calls may come from the autotuner's worker
// threads; implementations are thread-safe and must not call back into the
// Autotuner synchronously.
class AutotuneActions {
 public:
  virtual ~AutotuneActions() = default;
  // Pushes `config` (canonical PYTORCH_CUDA_ALLOC_CONF) to one session only
  // (the canary) as a new config version, without making it the job's
  // config. Returns the version.
  virtual absl::StatusOr<uint64_t> PushToSession(SessionId session,
                                                 const std::string& config,
                                                 const std::string& reason,
                                                 uint64_t predicted_peak_reserved) = 0;
  // Makes `config` the job's config: pushed to every session of the job
  // (its tenant's sessions of its label, never another tenant's) that does
  // not run it yet. Returns the version.
  virtual absl::StatusOr<uint64_t> SetJobConfig(const JobKey& job,
                                                const std::string& config,
                                                const std::string& reason,
                                                uint64_t predicted_peak_reserved) = 0;
  // Pushes `config` back to the session as a rollback.
  virtual absl::Status RollBackSession(SessionId session, const std::string& config,
                                       const std::string& reason) = 0;
  // Observers for metrics and history: a run started for `job`; a decision
  // was recorded or updated (result changed, realised saving known).
  // `job` of OnRun: the label (metrics keep the label only).
  virtual void OnRun(const std::string& job) = 0;
  virtual void OnDecision(const AutotuneDecision& decision) = 0;
};

struct AutotuneJobStatus {
  std::string job;
  TenantId tenant;
  JobPolicy policy;
  size_t sessions = 0;
  uint64_t window_events = 0;
  uint64_t dropped_events = 0;  // events clients could not send (gaps in the window)
  uint64_t window_bytes = 0;    // daemon memory the window holds (~16 bytes an event)
  // Whether the recorded session's client marks its optimizer steps, and
  // the steps it marked in the window's stream: a client that marks none
  // runs no optimizer and is decided on as aperiodic.
  bool marks_steps = false;
  uint64_t steps_marked = 0;
  AutotuneJobState state = AutotuneJobState::kWatching;
  std::optional<AutotuneDecision> last;
};

class Autotuner {
 public:
  // `actions` outlives the autotuner. Starts one worker thread, niced by
  // `options.nice`, that runs one decision at a time on `options.threads`
  // replay threads (itself and threads-1 more, which inherit its
  // niceness): at most `threads` replays run at once, whatever the jobs.
  Autotuner(AutotuneOptions options, AutotuneActions* actions);
  ~Autotuner();  // stops and joins the workers; pending decisions are dropped
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // --- fed by the daemon (cheap: never replays on the caller's thread)
  // `config`/`config_version`: what the session runs now (a reconnecting
  // client re-declares the config it already runs, so a restarted daemon
  // does not push it again).
  // `tenant`: the session's; the session belongs to the job (tenant, job),
  // and the job's window is charged to that tenant's share of the
  // autotuner's memory. `marks_steps`: the client marks its optimizer steps
  // (AutotunePreferences.marks_steps); recorded, a session of it that has
  // marked none is decided on as aperiodic, never on a step found in its
  // stream.
  void SessionStarted(SessionId id, const std::string& job, const std::string& config,
                      uint64_t config_version, const TenantId& tenant = "",
                      bool marks_steps = false);
  // Session `id` was pushed `config` as `version` when it registered (its
  // job's or its learned config): once it ACKs that version it runs it, and
  // decisions replay from it, not from the config it started with.
  void Handed(SessionId id, uint64_t version, const std::string& config);
  void SessionEnded(SessionId id);
  // Events in order; `dropped_before`: events the client had to drop just
  // before these. `state_after` (optional): the client's allocator right
  // after the last of them, what a decision replays a switch from.
  void Events(SessionId id, const std::vector<EvidenceEvent>& events,
              uint64_t dropped_before, const AllocatorSnapshot* state_after = nullptr);
  // memory_stats() under PyTorch's names ("reserved_bytes.all.current",
  // "num_alloc_retries", ...).
  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version);
  void Oom(SessionId id, uint64_t config_version);
  void Acked(SessionId id, uint64_t version, bool applied, const std::string& error);

  // --- admin
  // Queues a run now for the job `job` of `tenant`, or with no tenant for
  // each tenant's job of that label; returns the decision id it will record
  // (with no tenant: the first tenant's that queued one). NotFound: no
  // session; FailedPrecondition: the job is off; Unavailable: it is busy.
  absl::StatusOr<uint64_t> RunNow(const std::string& job, const TenantId& tenant = "");
  // `job`'s policy; an empty label: the daemon default (for jobs without
  // their own).
  void SetPolicy(const JobKey& job, JobPolicy policy);
  std::vector<AutotuneJobStatus> Status() const;
  // Newest first, at most `limit`; empty job: every job; a label: its jobs
  // in every tenant (each decision names its tenant).
  std::vector<AutotuneDecision> History(const std::string& job, size_t limit) const;
  // Blocks until no run is queued or running (tests).
  void WaitIdle();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_
