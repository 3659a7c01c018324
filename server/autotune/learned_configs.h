// LearnedConfigs: the allocator configs the autotuner learned for jobs, so
// that a job's next run starts with what its last run was tuned to (issue
// 30). A config is learned when an autotune push was kept (its canary's
// watch passed and it became the job's config) and forgotten when a later
// rollback undoes that config. Keyed by (tenant, job label): a label names
// a job within its tenant only, so one tenant's learning never configures
// another's job.
//
// A store opened on a state directory keeps its entries in
// DIR/learned_configs.json (JSON, written to a temporary file and renamed
// over the old one, so a crash leaves the old file or the new one, never a
// torn one) and reads them back when the daemon starts again. A file that
// does not parse is moved aside (learned_configs.json.corrupt) and the
// store starts empty: a daemon never fails to start over what it learned.
//
// Bounded: past `max_jobs` entries the one learned longest ago goes.
// Thread-safe.
#ifndef ALLOCD_SERVER_AUTOTUNE_LEARNED_CONFIGS_H_
#define ALLOCD_SERVER_AUTOTUNE_LEARNED_CONFIGS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/autotune/job_key.h"

namespace allocd {

struct LearnedConfig {
  // Canonical PYTORCH_CUDA_ALLOC_CONF: what the job's next run starts with.
  std::string config;
  // What the job ran when the autotuner decided to leave it.
  std::string from_config;
  // The decision that pushed it (ids restart with the daemon: it names the
  // decision in the history of the daemon that learned it).
  uint64_t decision_id = 0;
  absl::Time learned_at;
  // The decision's predictions (AutotuneDecision): peak reserved staying on
  // from_config and under `config`, the job's need in allocated and in
  // requested bytes over the same events. A run that starts with `config`
  // is judged against them, as the push was.
  int64_t predicted_peak_current = 0;
  int64_t predicted_peak_switched = 0;
  int64_t predicted_peak_allocated = 0;
  int64_t predicted_peak_requested = 0;
  // The peak reserved the job realised under it, when known.
  std::optional<int64_t> realized_peak;

  bool operator==(const LearnedConfig&) const = default;
};

class LearnedConfigs {
 public:
  static constexpr size_t kDefaultMaxJobs = 4096;
  static constexpr char kFileName[] = "learned_configs.json";

  // A store in memory only: what it learns ends with the daemon.
  explicit LearnedConfigs(size_t max_jobs = kDefaultMaxJobs);

  // A store kept in `state_dir` (created, mode 0700, if missing), with what
  // it holds read back. `warning` (when not null) is set to a line for the
  // log when the file was corrupt and moved aside. FailedPrecondition,
  // naming the directory and what to do, when it cannot be created or
  // written.
  static absl::StatusOr<std::unique_ptr<LearnedConfigs>> Open(
      const std::string& state_dir, size_t max_jobs = kDefaultMaxJobs,
      std::string* warning = nullptr);

  // Records `learned` as `key`'s config (replacing any earlier one) and
  // writes the file. Kept in memory even when the write fails: the error
  // says why the next daemon will not know it.
  absl::Status Record(const JobKey& key, LearnedConfig learned)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `key`'s learned config if it is `config` (a rollback undid it;
  // a rollback of another config leaves the learned one). True when it
  // forgot one; the write's error as for Record.
  absl::StatusOr<bool> Forget(const JobKey& key, const std::string& config)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<LearnedConfig> Find(const JobKey& key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every entry, by tenant then job.
  std::vector<std::pair<JobKey, LearnedConfig>> List() const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Where the entries are kept ("" in memory only).
  const std::string& path() const { return path_; }

 private:
  LearnedConfigs(size_t max_jobs, std::string path);
  absl::Status Save() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_jobs_;
  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<JobKey, LearnedConfig> learned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_LEARNED_CONFIGS_H_
