// ConfigPusher: the node's allocator configs (ConfigStore) on their way to
// the sessions. A config set for a job (or as the node default) is pushed
// to each session it applies to, over its control queue; the client
// applies it and ACKs, or NACKs with PyTorch's words. Every step is
// recorded in the store's history.
//
// Rules:
// - an OOM under a pushed config rolls the session back to the config it
//   ran before (pushed as a rollback), once per OOM'd version, unless the
//   daemon had refused the session memory (any config would have met that
//   OOM);
// - a client that reconnects declares the config it runs: it is adopted
//   under the version this daemon knows it by (a new one after a restart),
//   not pushed again;
// - a session is pushed each version of its job's config once: a
//   registration and a job's fan-out hold one lock (fanout_mu()).
//
// Thread-safe.
#ifndef ALLOCD_SERVER_CONFIG_PUSHER_H_
#define ALLOCD_SERVER_CONFIG_PUSHER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "allocd.pb.h"
#include "server/config_store.h"
#include "server/metrics.h"
#include "server/session_id.h"
#include "server/session_registry.h"
#include "server/tenant_id.h"

namespace allocd {

// The canonical form (FormatAllocatorConfig) of a config a client sent in
// `field`; InvalidArgument, naming the field, for one PyTorch 2.11 rejects.
absl::StatusOr<std::string> CanonicalClientConfig(absl::string_view field,
                                                  const std::string& config);
// `record` as the wire's ConfigVersion.
void FillConfigVersion(const ConfigRecord& record, v1::ConfigVersion* out);

class ConfigPusher {
 public:
  // `sessions` and `metrics` outlive this.
  ConfigPusher(const SessionRegistry* sessions, Metrics* metrics);

  ConfigStore& store() { return configs_; }

  // Held by a registration from its session's creation to its config at
  // registration (Register), and by a job config's fan-out to the sessions
  // it applies to: otherwise a session created during a Set is pushed the
  // new version by both, applies it twice and ACKs twice.
  absl::Mutex& fanout_mu() ABSL_LOCK_RETURNED(fanout_mu_) {
    return fanout_mu_;
  }

  // A registering session's config.
  struct AtRegistration {
    // What it runs: its initial config (version 0), or the config its
    // client re-declared.
    AppliedConfig running;
    // Its job's config, pushed to it unless it runs that already.
    std::optional<ConfigRecord> config;
    // The job's learned config it was handed (`config`, or what it runs
    // already), under its version.
    std::optional<AppliedConfig> learned;
  };
  // A config the autotuner learned for a job in an earlier run
  // (LearnedConfigs): `config` canonical, `author` says which decision.
  struct Learned {
    std::string config;
    std::string author;
    // Why it was chosen: "learned", "prior" or "replaced"
    // (StartConfigSourceName).
    std::string source = "learned";
    // For a learned config: RegisterResponse.stream_from_reserved (0: none).
    uint64_t stream_from_reserved = 0;
  };
  // `session` just registered; its client declared it runs
  // `current_config` (canonical) under `current_version` (0: its initial
  // config). Adopts that config, then pushes the job's: its own (an
  // admin's), else `learned` (recorded as a version of its own, its event
  // its source: "learned", "prior", "replaced"), else the default.
  // `started_on_learned`: the client started on `current_config` (version
  // 0) as the job's learned config; when that is `learned` it is recorded
  // as what the session runs and nothing is pushed; otherwise (forgotten
  // meanwhile, or the job got a config of its own) it is adopted as what
  // the session runs and the job's config is pushed over it.
  AtRegistration Register(Session& session, const std::string& current_config,
                          uint64_t current_version,
                          const std::optional<Learned>& learned = std::nullopt,
                          bool started_on_learned = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fanout_mu_);
  // Whether `job` in `tenant` has a config of its own (an admin's, for the
  // label in every tenant or in this one), which a learned config never
  // replaces.
  bool HasOwnConfig(absl::string_view job, const TenantId& tenant) const;
  // `session`'s client applied a version (ACK) or not (NACK): recorded,
  // and an ACKed one becomes what it runs. InvalidArgument for an unknown
  // version or a NACK's error over kMaxOomMessage bytes.
  absl::Status Ack(Session& session, const v1::ConfigAck& r);
  // `session` ran out of memory asking for `requested_bytes`: rolls it back
  // by the rules above. True when it pushed a rollback.
  bool RollBackAfterOom(Session& session, uint64_t requested_bytes);

  // The config that applies to `key` (a label, or LABEL@TENANT:
  // TenantJobKey): its own, else the label's, else the default; an empty
  // response when none does.
  v1::GetConfigResponse Get(absl::string_view key) const;
  // Sets the config of `key` (a label in every tenant, "LABEL@TENANT" in
  // one, the empty key the default) and pushes it to the sessions it
  // applies to: a label's reaches its sessions in the tenants without a
  // config of their own for it. `author` says who;
  // `predicted_peak_reserved_bytes`: allocd tune's prediction for the job
  // under `config` (0: none), exported for dashboards. ConfigStore::Set's
  // errors.
  absl::StatusOr<v1::SetConfigResponse> Set(
      absl::string_view job, absl::string_view config,
      absl::string_view author, uint64_t predicted_peak_reserved_bytes)
      ABSL_LOCKS_EXCLUDED(fanout_mu_);
  // Removes the config of `key` (as Set's); its sessions are pushed what
  // applies to them then (the label's, or the default), if any.
  void Clear(absl::string_view job, absl::string_view author)
      ABSL_LOCKS_EXCLUDED(fanout_mu_);
  // Pushes `config` to session `id` as a new version that is not its job's
  // config (an autotuner's canary). Returns the version; NotFound for no
  // live session.
  absl::StatusOr<uint64_t> PushToSession(
      SessionId id, absl::string_view config, absl::string_view author,
      std::string reason, uint64_t predicted_peak_reserved_bytes);
  // Pushes `config` as one new version to `tenant`'s sessions of `job`
  // that do not run it already (the canary does), without making it the
  // job's config: an autotuner's kept push or its rollback. A label
  // names a job within its tenant only, so another tenant's sessions of
  // the label are never pushed it; this tenant's later sessions are handed
  // what the autotuner learned instead (Register's `learned`). Returns the
  // version; ConfigStore::AddVersion's errors.
  absl::StatusOr<uint64_t> PushToTenantJob(
      const TenantId& tenant, absl::string_view job, absl::string_view config,
      absl::string_view author, uint64_t predicted_peak_reserved_bytes)
      ABSL_LOCKS_EXCLUDED(fanout_mu_);
  // Pushes `config` as one new version (recorded for the label `job`) to
  // the live `sessions` that do not run it already, without making it a
  // job's config: an autotuner's kept push or rollback for a job of
  // several ranks, whose ranks may give other labels (JobKey::run).
  // Returns the version; ConfigStore::AddVersion's errors.
  absl::StatusOr<uint64_t> PushToSessions(
      absl::string_view job, const std::vector<SessionId>& sessions,
      absl::string_view config, absl::string_view author,
      uint64_t predicted_peak_reserved_bytes) ABSL_LOCKS_EXCLUDED(fanout_mu_);
  // Tells session `id` what the daemon reads of its allocation stream
  // (StreamDemand: `from_reserved`, `reason`), if it runs `running`
  // (canonical or not; nullopt: whatever it runs). Whether it was told.
  bool DemandStream(SessionId id, std::optional<absl::string_view> running,
                    uint64_t from_reserved, std::string reason);
  // Pushes `config` back to session `id` as a rollback, unless it is
  // rolling back already (an OOM did it), or runs `config` with no push
  // unanswered (an OOM did it, and the client ACKed). The version is the
  // one the session ran `config` under, when it did.
  absl::Status RollBackSession(SessionId id, absl::string_view config,
                               std::string reason);
  // The newest `limit` (0: 100; at most 10000) history entries of `job`
  // (empty: of every job).
  v1::HistoryResponse History(absl::string_view job, uint32_t limit) const;

 private:
  // The config that applies to `job` in `tenant`: the tenant's own for the
  // label, else the label's, else the default.
  std::optional<ConfigRecord> EffectiveIn(const TenantId& tenant,
                                          absl::string_view job) const;
  // Whether the config of a job's `key` is what `session` runs by (Set's
  // and Clear's fan-out): a label's reaches its sessions in the tenants
  // without a config of their own for it, LABEL@TENANT that tenant's.
  bool JobKeyReaches(const ConfigKey& key, const Session& session) const;
  void Push(Session& session, const ConfigRecord& record, bool rollback,
            std::string reason);
  // PushToTenantJob's and PushToSessions' one version of `config`, pushed
  // to the sessions `of_job` picks that do not run it already.
  absl::StatusOr<uint64_t> PushToJob(
      absl::string_view job, absl::string_view config, absl::string_view author,
      uint64_t predicted_peak_reserved_bytes,
      absl::FunctionRef<bool(const Session&)> of_job) ABSL_LOCKS_EXCLUDED(fanout_mu_);
  // Pushes `target` to `session` as a rollback and records it.
  void PushRollBack(Session& session, const ConfigRecord& target,
                    std::string reason);
  // The version under which this daemon records the config (canonical) a
  // registering client declared it runs under `declared_version`: that
  // version when this daemon set it, else a new one (a restarted daemon).
  AppliedConfig AdoptRunningConfig(absl::string_view job,
                                   const std::string& config,
                                   uint64_t declared_version, SessionId id);

  const SessionRegistry* const sessions_;
  Metrics* const metrics_;
  // What the node keeps of its configs: the history's newest entries, and
  // of the versions no job's config or live session refers to (each
  // registration that declares an unknown config adds one), the newest.
  static constexpr size_t kHistoryLimit = 10000;
  static constexpr size_t kVersionLimit = 1024;
  ConfigStore configs_;
  absl::Mutex fanout_mu_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_CONFIG_PUSHER_H_
