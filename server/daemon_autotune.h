// DaemonAutotune: the daemon's side of the autotuner (server/autotune/). It
// feeds the Autotuner what DaemonCore's sessions report (as the core's
// SessionObserver), acts for it over DaemonCore's public calls (as its
// AutotuneActions: canary pushes, job configs, rollbacks), turns its
// decisions into metrics and config-history entries, and answers the Admin
// service's autotune calls in proto form.
//
// A job's policy comes in layers, highest first: the mode an admin set for
// it (allocctl autotune set), the config file's entry for it, what the job
// asked for when it registered (its mode, pinned keys, memory fraction),
// the daemon's default (--autotune, or allocctl autotune set without a job).
// Pinned keys are the union of the file's and the job's.
//
// What the job learned: a push kept for the whole job is recorded in the
// daemon's LearnedConfigs for the job (its tenant and label), and forgotten
// when it is rolled back; a new session of a job in apply mode is handed
// its learned config at registration (LearnedConfigFor).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_DAEMON_AUTOTUNE_H_
#define ALLOCD_SERVER_DAEMON_AUTOTUNE_H_

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
      const SessionIdentity& identity) override;
  void SessionStarted(const SessionIdentity& identity,
                      const AppliedConfig& running,
                      const std::optional<AppliedConfig>& learned,
                      const v1::AutotunePreferences& preferences) override;
  void SessionEnded(SessionId id) override;
  void Events(SessionId id, const v1::EventBatch& batch) override;
  void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
             uint64_t config_version) override;
  void Oom(SessionId id, uint64_t config_version) override;
  void Acked(SessionId id, uint64_t version, bool applied,
             const std::string& error) override;

  // --- AutotuneActions
  absl::StatusOr<uint64_t> PushToSession(SessionId session,
                                         const std::string& config,
                                         const std::string& reason,
                                         uint64_t predicted_peak_reserved) override;
  absl::StatusOr<uint64_t> SetJobConfig(const std::string& job,
                                        const std::string& config,
                                        const std::string& reason,
                                        uint64_t predicted_peak_reserved) override;
  absl::Status RollBackSession(SessionId session, const std::string& config,
                               const std::string& reason) override;
  void OnRun(const std::string& job) override;
  void OnDecision(const AutotuneDecision& decision) override;

  // --- Admin
  v1::AutotuneStatusResponse Status() const;
  v1::AutotuneHistoryResponse History(const std::string& job,
                                      uint32_t limit) const;
  // NotFound when the job has no session.
  absl::StatusOr<v1::AutotuneRunResponse> Run(const std::string& job);
  // Every learned config (allocctl autotune learned, export).
  v1::AutotuneLearnedResponse Learned() const;
  // An admin's mode for `job` (empty: the daemon's default).
  // InvalidArgument for a mode that is not off, recommend or apply.
  absl::Status SetMode(const std::string& job, const std::string& mode);
  // The config file's per-job policies (replacing the last file's) and its
  // default mode, if it sets one.
  void SetFilePolicies(std::optional<AutotuneMode> default_mode,
                       std::map<std::string, AutotuneFilePolicy> jobs);

  // Blocks until the autotuner has nothing queued or running (tests).
  void WaitIdle() { autotuner_->WaitIdle(); }

 private:
  JobPolicy EffectivePolicy(const std::string& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The effective policies of `jobs` (when empty: the default, as "", and
  // every job with a layer). Computed under the lock, handed to the
  // autotuner outside it (Publish), so no lock of ours is held while the
  // autotuner takes its own.
  std::vector<std::pair<std::string, JobPolicy>> Policies(
      std::set<std::string> jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(const std::vector<std::pair<std::string, JobPolicy>>& policies);
  // Records a push kept for the whole job in `learned_` (or its realised
  // peak, once known), or forgets a rolled-back one.
  void Learn(const AutotuneDecision& decision) ABSL_LOCKS_EXCLUDED(mu_);

  DaemonCore* const core_;
  Metrics* const metrics_;
  LearnedConfigs* const learned_;
  // --autotune.
  const AutotuneMode flag_mode_;
  mutable absl::Mutex mu_;
  AutotuneMode default_mode_ ABSL_GUARDED_BY(mu_);
  std::optional<AutotuneMode> file_default_mode_ ABSL_GUARDED_BY(mu_);
  std::optional<AutotuneMode> admin_default_mode_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AutotuneMode> admin_modes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AutotuneFilePolicy> file_policies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::AutotunePreferences> job_preferences_
      ABSL_GUARDED_BY(mu_);
  // The tenant of each live session, and of each decision's canary (taken
  // when the decision is first reported, while the canary lives): what a
  // job learns is its tenant's.
  std::map<SessionId, TenantId> session_tenants_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, TenantId> decision_tenants_ ABSL_GUARDED_BY(mu_);
  // Jobs the autotuner was given a policy of their own.
  std::set<std::string> policied_ ABSL_GUARDED_BY(mu_);
  // Per session: where its event stream should continue, so a batch that
  // never arrived shows as a gap.
  std::map<SessionId, uint64_t> next_sequence_ ABSL_GUARDED_BY(mu_);
  // Per decision id: the result last counted (metrics count changes).
  std::map<uint64_t, std::string> counted_ ABSL_GUARDED_BY(mu_);
  // Declared last: destroyed (workers joined) before what they use.
  std::unique_ptr<Autotuner> autotuner_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_DAEMON_AUTOTUNE_H_
