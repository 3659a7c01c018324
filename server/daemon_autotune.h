// DaemonAutotune: the daemon's side of the autotuner (server/autotune/). It
// feeds the Autotuner what DaemonCore's sessions report (as the core's
// SessionObserver), acts for it over DaemonCore's public calls (as its
// AutotuneActions: canary pushes, job configs, rollbacks), turns its
// decisions into metrics and config-history entries, and answers the Admin
// service's autotune calls in proto form.
//
// A job is a label within a tenant (JobKey): the autotuner keeps a window,
// decisions and a policy per (tenant, label), so a session of another
// tenant under a victim's label neither drives the victim's decisions nor
// changes its mode, and is pushed nothing decided on the victim's events.
//
// A job's policy comes in layers. An admin's mode for the label (allocctl
// autotune mode --job), else the config file's entry for it, applies to
// the label in every tenant and is a ceiling: the job may ask, when it
// registers, for a lower mode (apply -> recommend -> off), never a higher
// one. Without either, the job's own mode applies, else the daemon's
// default (--autotune, the file's default, or allocctl autotune mode
// without a job). What the job asks for is its own (tenant, label)'s only.
// Pinned keys are the union of the file's and the job's.
//
// A push kept for the whole job is pushed to its tenant's sessions of the
// label only (DaemonCore::PushToTenantJob): the label's config, which an
// admin sets for every tenant, is left as it is.
//
// What the job learned: a push kept for the whole job is recorded in the
// daemon's LearnedConfigs for the job (its tenant and label) once the
// autotuner checked it as the next runs use it, from their first
// allocation (AutotuneDecision::learned: the push, or what the run had
// without it when that replayed lower from the start), and forgotten
// when it is rolled back; a new session of a job in apply mode is handed
// its learned config at registration (LearnedConfigFor), or without one
// the node's prior (the seed while none agrees), and a harmful start
// config is replaced
// (start_config.h): the autotuner reviews such a start at the job's first
// pass (Autotuner::StartedInstead).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_DAEMON_AUTOTUNE_H_
#define ALLOCD_SERVER_DAEMON_AUTOTUNE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocd.pb.h"
#include "server/autotune/autotuner.h"
#include "server/autotune/learned_configs.h"
#include "server/autotune/start_config.h"
#include "server/config_file.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/session_observer.h"

namespace allocd {

class DaemonAutotune final : public SessionObserver, public AutotuneActions {
 public:
  // `core`, `metrics` and `learned` outlive this; starts the autotuner's
  // workers. Then core->SetObserver(this).
  DaemonAutotune(AutotuneOptions options, DaemonCore* core, Metrics* metrics,
                 LearnedConfigs* learned);
  // Stops the autotuner (its workers) before anything it calls goes.
  ~DaemonAutotune() override;

  // --- SessionObserver
  // The job's learned config when its mode is apply (a job an admin set to
  // recommend or off is pushed nothing, learned or not).
  std::optional<ConfigPusher::Learned> LearnedConfigFor(
      const SessionIdentity& identity, const v1::AutotunePreferences& preferences,
      const v1::JobFeatures& features) override;
  void SessionStarted(const SessionIdentity& identity,
                      const AppliedConfig& running,
                      const std::optional<AppliedConfig>& learned,
                      const std::optional<AppliedConfig>& pushed,
                      const v1::AutotunePreferences& preferences) override;
  void SessionEnded(SessionId id) override;
  void Events(SessionId id, const v1::EventBatch& batch) override;
  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version) override;
  void Oom(SessionId id, uint64_t config_version) override;
  void Features(SessionId id, const v1::JobFeatures& features) override;
  void Acked(SessionId id, uint64_t version, bool applied,
             const std::string& error) override;

  // --- AutotuneActions
  absl::StatusOr<uint64_t> PushToSession(SessionId session,
                                         const std::string& config,
                                         const std::string& reason,
                                         uint64_t predicted_peak_reserved) override;
  absl::StatusOr<uint64_t> SetJobConfig(const JobKey& job,
                                        const std::string& config,
                                        const std::string& reason,
                                        uint64_t predicted_peak_reserved) override;
  std::optional<uint64_t> DeviceRoom(SessionId session) override;
  absl::Status RollBackSession(SessionId session, const std::string& config,
                               const std::string& reason) override;
  void OnRun(const std::string& job) override;
  void OnDecision(const AutotuneDecision& decision) override;
  void DemandStream(SessionId session, uint64_t from_reserved, std::string reason) override;
  uint64_t StreamReadFrom(SessionId id) const override {
    return autotuner_->StreamReadFrom(id);
  }

  // --- Admin
  v1::AutotuneStatusResponse Status() const;
  v1::AutotuneHistoryResponse History(const std::string& job,
                                      uint32_t limit) const;
  // Runs the label's job in each tenant that has a session of it (the
  // response names the first tenant's decision). NotFound when none has.
  absl::StatusOr<v1::AutotuneRunResponse> Run(const std::string& job);
  // Every learned config (allocctl autotune learned, export).
  v1::AutotuneLearnedResponse Learned() const;
  // An admin's mode for the label `job` in every tenant (empty: the
  // daemon's default); a job may lower it for itself, never raise it.
  // InvalidArgument for a mode that is not off, recommend or apply.
  absl::Status SetMode(const std::string& job, const std::string& mode);
  // The config file's per-job policies (replacing the last file's), each
  // for its label in every tenant, and its default mode, if it sets one.
  void SetFilePolicies(std::optional<AutotuneMode> default_mode,
                       std::map<std::string, AutotuneFilePolicy> jobs);

  // The config file's job configs (replacing the last file's): learned
  // configs imported from the ConfigMap (`allocctl autotune export`), which
  // count toward the node's prior as learned configs of the node's jobs
  // (a label not among the learned ones), whatever tenant.
  void SetFileJobConfigs(std::map<std::string, std::string> configs);

  // Blocks until the autotuner has nothing queued or running (tests).
  void WaitIdle() { autotuner_->WaitIdle(); }

  // How many entries the per-job state holds (tests: it must stay bounded
  // by the live sessions, whatever labels clients registered and ended).
  struct JobStateSizes {
    // Jobs with a live session.
    size_t live_jobs = 0;
    // What jobs asked for (job_preferences_).
    size_t preferences = 0;
    // Jobs given a policy of their own (policied_).
    size_t policied = 0;
    // Versions set for a job (job_versions_), live jobs' and ended jobs'
    // kept ones together.
    size_t versions = 0;
  };
  JobStateSizes JobStateSizesForTest() const;

  // How many ended jobs keep the version last set for them: a decision on
  // that push can still come after the job's last session ended (it was
  // promoted as the session went), and is learned only if its version is
  // known.
  static constexpr size_t kEndedJobVersionsKept = 1024;

 private:
  // What a session of `identity` starts on (StartConfig), with the
  // author its config version names; nullopt: its own (or not in apply
  // mode).
  struct Start {
    StartConfig chosen;
    std::string author;
    uint64_t stream_from_reserved = 0;  // StreamFromReserved, for a learned one
  };
  // `features`: what the job's process said at registration it does with
  // CUDA memory; a start they would break is left out (ConfigIncompatibility,
  // as at start: not live).
  std::optional<Start> StartFor(const SessionIdentity& identity,
                                const v1::AutotunePreferences& preferences,
                                const v1::JobFeatures& features) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's policy by its layers (see above); `asked`, when it asks
  // anything, is what the job asks instead of what its sessions asked
  // (a session registering).
  JobPolicy EffectivePolicy(const JobKey& job,
                            const v1::AutotunePreferences* asked = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The effective policies of every known job of the label `label`, or
  // with no label of the default (as the empty label) and every known job.
  // Computed under the lock, handed to the autotuner outside it (Publish),
  // so no lock of ours is held while the autotuner takes its own.
  std::vector<std::pair<JobKey, JobPolicy>> Policies(
      const std::optional<std::string>& label)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(const std::vector<std::pair<JobKey, JobPolicy>>& policies);
  // The job of a registering session: its label within its tenant, or,
  // for a rank of a run (SessionRank::run), that run's, under the label
  // of the run's live sessions (its first rank's) whatever label it gave.
  JobKey KeyOf(const SessionIdentity& identity) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's last session ended: drops what it asked for and its policy,
  // and queues its version with the ended jobs' (QueueEndedJobVersion).
  void ForgetEndedJob(const JobKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the version of a job with no live session (if it has one and is
  // not queued yet), dropping the oldest ended job's past
  // kEndedJobVersionsKept.
  void QueueEndedJobVersion(const JobKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells session `decided_on` (a decision's), if it runs `config`, that
  // it may stop its allocation stream until its reserved memory passes
  // `from` bytes (StreamDemand; none for 0: a peak not known); `why` names
  // what settled it.
  void PauseStreams(SessionId decided_on, const std::string& config, uint64_t from,
                    absl::string_view why);
  // Records what a push kept for the whole job teaches (its `learned`, once
  // checked) in `learned_` (or the push's realised peak, once known), or
  // forgets a rolled-back push.
  void Learn(const AutotuneDecision& decision) ABSL_LOCKS_EXCLUDED(mu_);

  DaemonCore* const core_;
  Metrics* const metrics_;
  LearnedConfigs* const learned_;
  // --autotune-prior, --autotune-seed-prior.
  const PriorSetting prior_;
  // The autotuner's growth margin: a learned run's stream_from_reserved.
  const double growth_margin_;
  // --autotune.
  const AutotuneMode flag_mode_;
  mutable absl::Mutex mu_;
  AutotuneMode default_mode_ ABSL_GUARDED_BY(mu_);
  std::optional<AutotuneMode> file_default_mode_ ABSL_GUARDED_BY(mu_);
  std::optional<AutotuneMode> admin_default_mode_ ABSL_GUARDED_BY(mu_);
  // By label: an admin's layers apply to the label in every tenant.
  std::map<std::string, AutotuneMode> admin_modes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AutotuneFilePolicy> file_policies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> file_job_configs_ ABSL_GUARDED_BY(mu_);
  // The job's entries are dropped as its last session ends: what it asked
  // for and its policy are a client's, and a label flood must not grow
  // them past the live sessions (which --max-sessions bounds). What an
  // admin set is by label (admin_modes_, file_policies_) and stays.
  //
  // By session: its job, for SessionEnded (which is given the id only), and
  // the GPU it runs on, for the status of a job's ranks.
  struct SessionOfJob {
    JobKey job;
    std::string gpu_uuid;
  };
  std::map<SessionId, SessionOfJob> session_jobs_ ABSL_GUARDED_BY(mu_);
  // What LearnedConfigFor chose for a registering session, until its
  // SessionStarted reads it (its source, and why, for the metric, the log
  // and the autotuner's review).
  std::map<SessionId, Start> chosen_starts_ ABSL_GUARDED_BY(mu_);
  // By job: how many of its sessions are live.
  std::map<JobKey, size_t> live_sessions_ ABSL_GUARDED_BY(mu_);
  // By job: what a job asked for is its tenant's job's only. Its newest
  // session speaks for it while any is live; a job that ends and comes
  // back asks again.
  std::map<JobKey, v1::AutotunePreferences> job_preferences_
      ABSL_GUARDED_BY(mu_);
  // Live jobs the autotuner was given a policy of their own (each job, as
  // its first session starts), to be given it again when an admin's layer
  // changes. An ended job's comes again when it starts again.
  std::set<JobKey> policied_ ABSL_GUARDED_BY(mu_);
  // The version the autotuner last set as each job's config (SetJobConfig):
  // a decision under that version was kept for the whole job. A live job's
  // is kept; an ended job's for the last kEndedJobVersionsKept ended jobs.
  std::map<JobKey, uint64_t> job_versions_ ABSL_GUARDED_BY(mu_);
  // Ended jobs that keep their version, oldest ending first (by an ending
  // count, so that a job that starts again leaves the queue at once), and
  // each such job's place in it.
  std::map<uint64_t, JobKey> ended_versions_ ABSL_GUARDED_BY(mu_);
  std::map<JobKey, uint64_t> ended_version_order_ ABSL_GUARDED_BY(mu_);
  uint64_t endings_ ABSL_GUARDED_BY(mu_) = 0;
  // Per session: where its event stream should continue, so a batch that
  // never arrived shows as a gap.
  std::map<SessionId, uint64_t> next_sequence_ ABSL_GUARDED_BY(mu_);
  // Per decision id: the result last counted (metrics count changes).
  std::map<uint64_t, std::optional<AutotuneResult>> counted_ ABSL_GUARDED_BY(mu_);
  // Declared last: destroyed (workers joined) before what they use.
  std::unique_ptr<Autotuner> autotuner_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_DAEMON_AUTOTUNE_H_
