// ConfigStore: the node's versioned allocator configs, one line of versions
// per job label (the empty label is the node default), and the history of
// what happened to each version: set, pushed, ACKed, NACKed, rolled back.
//
// Versions are node-wide and strictly increasing, so "version 7" names one
// config whatever job it was set for. Each registration that declares a
// config the store does not know adds a version, so versions are bounded:
// Prune forgets old ones nothing refers to any more, and the history keeps
// its newest entries only. Thread-safe.
#ifndef ALLOCD_SERVER_CONFIG_STORE_H_
#define ALLOCD_SERVER_CONFIG_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include "proto/protocol.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace allocd {

struct ConfigRecord {
  uint64_t version = 0;
  std::string job;
  // Canonical PYTORCH_CUDA_ALLOC_CONF (FormatAllocatorConfig).
  std::string config;
  absl::Time set_at;
  std::string author;
  // allocd tune's prediction of the job's peak reserved bytes under
  // `config`; 0 when none was given.
  uint64_t predicted_peak_reserved_bytes = 0;
};

struct HistoryRecord {
  absl::Time at;
  // "set", "clear", "ack", "nack", "rollback"; "push" (a version for one
  // session), "adopt" (a config a reconnecting client runs), "autotune"
  // (a decision of the autotuner).
  std::string event;
  uint64_t version = 0;
  std::string job;
  std::string config;
  uint64_t session_id = 0;
  std::string detail;
};

// A job label: 1-128 bytes of [A-Za-z0-9_.:/-], or empty for the default.
absl::Status ValidateJobLabel(absl::string_view job);

// What a config is kept under in the store: its key (proto/protocol.h's
// TenantJobKey), a label's config in every tenant or "LABEL@TENANT" in one;
// a tenant's wins over the label's there.
struct ConfigKey {
  absl::string_view job;
  // Empty: every tenant.
  absl::string_view tenant;
};
ConfigKey SplitConfigKey(absl::string_view key);
// A label (ValidateJobLabel), or a non-empty label, '@' and a tenant of
// 1-128 bytes of [A-Za-z0-9_.:-] ("uid:1001", "pod:<uid>", "node").
absl::Status ValidateConfigKey(absl::string_view key);

class ConfigStore {
 public:
  // The versions live sessions run, or may ACK or roll back to.
  using InUse = std::function<absl::flat_hash_set<uint64_t>()>;

  // Keeps the newest `history_limit` history records, and of the versions
  // that are neither a job's own config nor `in_use()` (called without the
  // store's lock; empty: none), the newest `version_limit`: once twice as
  // many are stored, a new version prunes the others (Prune), which costs
  // O(1) per version stored.
  explicit ConfigStore(size_t history_limit = 10000,
                       size_t version_limit = 1024, InUse in_use = nullptr);

  // Validates `config` as PyTorch 2.11 would at process start and stores its
  // canonical form as a new version for `job`, with the peak reserved
  // bytes `allocd tune` predicted for it (0: none). InvalidArgument with
  // PyTorch's words for a config it rejects, or for a bad job label.
  absl::StatusOr<ConfigRecord> Set(absl::string_view job,
                                   absl::string_view config,
                                   absl::string_view author,
                                   uint64_t predicted_peak_reserved_bytes = 0);

  // Like Set, but the version is not the job's config: it names a config
  // one session runs (an autotuner's canary push, a config a reconnecting
  // client re-declared). Recorded in the history as `event`.
  absl::StatusOr<ConfigRecord> AddVersion(absl::string_view job,
                                          absl::string_view config,
                                          absl::string_view author,
                                          absl::string_view event,
                                          uint64_t predicted_peak_reserved_bytes = 0);

  // Forgets `job`'s own config (the empty job: the default), so its
  // sessions fall back to the default. False when it had none.
  bool Clear(absl::string_view job, absl::string_view author);

  // The version that applies to a session of `job`: the job's own newest,
  // else the default's; nullopt when neither was ever set.
  std::optional<ConfigRecord> Effective(absl::string_view job) const;

  // The config set as `version`; nullopt for an unknown version.
  std::optional<ConfigRecord> Find(uint64_t version) const;

  // True when `job` has a config of its own (a default push skips it).
  bool HasOwnConfig(absl::string_view job) const;

  // Forgets every version but the newest version_limit, each job's own
  // config and those in_use(). Returns how many it forgot.
  size_t Prune() ABSL_LOCKS_EXCLUDED(mu_);

  // Versions kept (Find knows them).
  size_t version_count() const;

  void Record(HistoryRecord record);

  // Newest first, at most `limit`; an empty `job` means every job.
  std::vector<HistoryRecord> History(absl::string_view job,
                                     size_t limit) const;

 private:
  // Set and AddVersion: `effective` makes the version the job's config.
  absl::StatusOr<ConfigRecord> Store(absl::string_view job,
                                     absl::string_view config,
                                     absl::string_view author,
                                     absl::string_view event, bool effective,
                                     uint64_t predicted_peak_reserved_bytes);

  const size_t history_limit_;
  const size_t version_limit_;
  const InUse in_use_;
  mutable absl::Mutex mu_;
  uint64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, ConfigRecord> newest_by_job_
      ABSL_GUARDED_BY(mu_);
  // The versions kept (Prune): an ACK or a rollback may name an old one.
  absl::flat_hash_map<uint64_t, ConfigRecord> by_version_
      ABSL_GUARDED_BY(mu_);
  std::deque<HistoryRecord> history_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_CONFIG_STORE_H_
