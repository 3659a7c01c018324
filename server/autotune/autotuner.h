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
// above, with none. The early decision on a harmful start, made on fewer
// than two steps the job marked, proposes its safe config unless another
// peaks clearly lower (DecideOptions::preferred). Afterwards a job is decided on again,
// whatever the cooldown, when a request larger than any its last decision
// saw by `growth_margin` has peaked ("larger_request"), or when its reserved
// memory grows past what its last decision said its best config needs by
// `growth_margin` ("growth").
//
// A job is a label within a tenant (JobKey): another tenant's sessions
// under the same label are another job, with its own window, decisions and
// policy, and what is decided for one is pushed to its own sessions only.
// The ranks of a job of several processes are one job, by the run id they
// share (JobKey::run): one decision, on the canary rank's stream, pushed
// to every rank once the canary's first step under it is judged, and
// rolled back on every rank (Canary::Push::lockstep).
//
// It knows nothing of the daemon's RPCs: the daemon feeds it sessions,
// events and stats, and it acts through AutotuneActions. Replays run on its
// own worker threads, never on the feeding thread.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/autotune/autotune_options.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/job_key.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

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
  // (its tenant's sessions of its label, never another tenant's; a run's
  // sessions for a job of several ranks) that does not run it yet.
  // Returns the version.
  virtual absl::StatusOr<uint64_t> SetJobConfig(const JobKey& job,
                                                const std::string& config,
                                                const std::string& reason,
                                                uint64_t predicted_peak_reserved) = 0;
  // Device memory on `session`'s GPU that no session holds, when the
  // daemon knows it (the session's memory comes from its pool); a push
  // whose rollback's worst case fits in it is made (WeighRollback).
  virtual std::optional<uint64_t> DeviceRoom(SessionId /*session*/) { return std::nullopt; }
  // Pushes `config` back to the session as a rollback.
  virtual absl::Status RollBackSession(SessionId session, const std::string& config,
                                       const std::string& reason) = 0;
  // Tells session `session` what the autotuner reads of its allocation
  // stream (StreamDemand): `from_reserved` 0, all of it now; else nothing
  // until its reserved memory passes that (kStreamNotRead: not at all).
  virtual void DemandStream(SessionId /*session*/, uint64_t /*from_reserved*/,
                            std::string /*reason*/) {}
  // Observers for metrics and history: a run started for `job`; a decision
  // was recorded or updated (result changed, realised saving known).
  // `job` of OnRun: the label (metrics keep the label only).
  virtual void OnRun(const std::string& job) = 0;
  virtual void OnDecision(const AutotuneDecision& decision) = 0;
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
  // stream. `rank`: its place in a job of several processes; the
  // sessions of one run (SessionRank::run, within the tenant) are one job
  // (JobKey::run), whose pushes reach every rank once the canary rank's
  // first step under them is judged, and roll back on every rank.
  void SessionStarted(SessionId id, const std::string& job, const std::string& config,
                      uint64_t config_version, const TenantId& tenant = "",
                      bool marks_steps = false, const SessionRank& rank = {});
  // Session `id` was pushed `config` as `version` when it registered (its
  // job's or its learned config): once it ACKs that version it runs it, and
  // decisions replay from it, not from the config it started with.
  void Handed(SessionId id, uint64_t version, const std::string& config);
  // Session `id` starts on a config the daemon chose instead of its own
  // `own` (the node's prior or the seed, or its harmful config made safe;
  // `why` says which): the job's first pass reviews that choice first
  // (ReviewPrior, trigger start_review) and returns the job to `own` when
  // staying on it would have peaked lower.
  void StartedInstead(SessionId id, const std::string& own, const std::string& why);
  void SessionEnded(SessionId id);
  // Session `id` does `features` (at registration, or since it last said):
  // its job's decisions leave out what would break them, and a push under
  // way that would is rolled back.
  void Features(SessionId id, const JobFeatures& features);
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
  // their own). A job it turns off or on has its recorded session told
  // what of its stream is read now (DemandStream).
  void SetPolicy(const JobKey& job, JobPolicy policy);
  // What `tenant`'s jobs of label `job` were seen doing, ended runs still
  // kept included (JobRegistry::FeaturesOf).
  JobFeatures FeaturesOf(const TenantId& tenant, const std::string& job) const;
  std::vector<AutotuneJobStatus> Status() const;
  // Newest first, at most `limit`; empty job: every job; a label: its jobs
  // in every tenant (each decision names its tenant).
  std::vector<AutotuneDecision> History(const std::string& job, size_t limit) const;
  // What of session `id`'s allocation stream the autotuner reads, as
  // RegisterResponse.stream_from_reserved says it: 0, all of it (a session
  // the autotuner does not know too); kStreamNotRead, none (its job is
  // decided on one session's stream, another's; when that session ends,
  // the next one's is, and DemandStream tells it; also while its job's
  // autotune mode is off, and DemandStream tells it when the mode changes);
  // else only once its reserved memory passes that: its job settled at a
  // first pass before it started and no push is under way (GrownPast of the
  // settled need, as for the session that takes over a settled job's
  // stream).
  uint64_t StreamReadFrom(SessionId id) const;
  // Blocks until no run is queued or running (tests).
  void WaitIdle();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNER_H_
