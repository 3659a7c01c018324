// DaemonCore: what `allocd serve` does, in plain C++ — sessions, chunks,
// leases, telemetry, config push with ACK/NACK/rollback, quotas — with the
// caller's kernel-reported credentials as an argument. The gRPC services
// and the side socket are thin adapters over it, so every rule here is
// tested without a network.
//
// The core serves sessions, leases and chunks itself, and wires together
// the parts that hold the other concepts (each locks its own state):
// SessionAccess (who may act on a session, who may administer),
// request_limits.h and Quotas, ConfigPusher (set, push, ACK, rollback),
// Reclaimer (asking other sessions to give memory back), RestartAdoption
// (after a restart: the window, capacity fitting, the sessions file) and
// WorkingSetStore (an ended session's working set for its job's next).
//
// Rules:
// - a session belongs to the process (pid, uid) that registered it and to
//   its tenant (SessionAccess, --tenancy), and is proven by the secret
//   handed at registration; a call naming a session it does not prove is
//   NotFound, as for a session that never was;
// - a session that has not opened its lease within `lease_grace` of
//   registering, or whose lease closed, ends: its chunks return to the pool;
// - a tenant has at most so many sessions, and so many registered and not
//   leased yet; the daemon too, over all tenants (SessionLimits): a
//   registration past a bound is ResourceExhausted, saying which;
// - when the pool is short, the daemon asks the other sessions to release
//   cached segments and waits up to `reclaim_wait` before answering
//   ResourceExhausted;
// - a session belongs to one device (the GPU whose UUID it registered
//   with): its chunks come from that device's pool only, reclaims ask only
//   sessions of that device, and a process using several GPUs has a
//   session per device;
// - an OOM under a pushed config rolls the session back to the config it
//   ran before (pushed as a rollback), once per OOM'd version;
// - after a restart, sessions that reconnect re-declare the chunks they
//   still hold (DeclareChunks, NodePool::Adopt), and AcquireChunks waits
//   until the sessions of the daemon before have done so or adopt_window
//   has passed (AdoptionWindow): memory they map is never promised twice.
//   Only chunks the daemon's own sessions file lists for the session's
//   tenant are adopted, inside that window, within the capacity and every
//   quota (RestartAdoption::Declare); others are refused, their FDs closed.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_DAEMON_CORE_H_
#define ALLOCD_SERVER_DAEMON_CORE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocd.pb.h"
#include "ipc/unix_socket.h"
#include "server/config_pusher.h"
#include "server/config_store.h"
#include "server/metrics.h"
#include "server/pool/device_pools.h"
#include "server/pool/node_pool.h"
#include "server/quotas.h"
#include "server/reclaimer.h"
#include "server/restart_adoption.h"
#include "server/session_access.h"
#include "server/session_id.h"
#include "server/session_limits.h"
#include "server/session_observer.h"
#include "server/session_registry.h"
#include "server/tenant.h"
#include "server/working_set_store.h"

namespace allocd {

struct DaemonCoreOptions {
  // "sim" or "cuda": reported to clients and admins.
  std::string backend = "sim";
  // Where clients open their lease and claim FDs.
  std::string fd_socket;
  absl::Duration lease_grace = absl::Seconds(5);
  absl::Duration reclaim_wait = absl::Seconds(1);
  // What a tenant is (server/tenant.h).
  Tenancy tenancy = Tenancy::kUid;
  // uids allowed to call the Admin service besides root and the daemon's,
  // and a group whose members may.
  std::vector<uid_t> admin_uids;
  std::optional<gid_t> admin_gid;
  // Largest single AcquireChunks.
  uint64_t max_acquire_bytes = uint64_t{1} << 40;
  // Sessions, and registrations waiting for their lease, per tenant and in
  // total.
  SessionLimitsOptions session_limits = kDefaultSessionLimits;
  // When cached chunks go back to the device (TrimIdle).
  TrimPolicy trim;
  // Where the pids of live sessions and the chunks they hold are kept for
  // the next daemon (see AdoptionWindow), private to the daemon; empty:
  // nowhere, and no adoption window.
  std::string sessions_file;
  // The longest AcquireChunks waits after a restart for the sessions of
  // the daemon before to re-declare their chunks.
  absl::Duration adopt_window = absl::Seconds(5);
  // Each device's memory when the daemon started, by node device (missing
  // ones: no device, as in sim). Once the adoption window closes each
  // pool's capacity is fitted to it (DeviceAtStart, RestartAdoption): the
  // pool never promises what the device does not have.
  std::vector<DeviceAtStart> devices_at_start;
};

class DaemonCore {
 public:
  // `pools` (one per device, at least one) and `metrics` outlive the core.
  DaemonCore(DaemonCoreOptions options, const DevicePools* pools,
             Metrics* metrics);
  // One device, SimDeviceUuid(0), served from `pool` (which outlives the
  // core): tests and benchmarks.
  DaemonCore(DaemonCoreOptions options, NodePool* pool, Metrics* metrics);

  // Tells `observer` (which outlives the core, or is reset to null first)
  // what sessions report. Call before serving.
  void SetObserver(SessionObserver* observer) { observer_ = observer; }

  // --- Allocd service
  absl::StatusOr<v1::RegisterResponse> Register(const PeerCredentials& peer,
                                                const v1::RegisterRequest& r);
  absl::StatusOr<v1::AcquireChunksResponse> AcquireChunks(
      const PeerCredentials& peer, const v1::AcquireChunksRequest& r);
  // AcquireChunks for the lease's thread, which serves every session's
  // claims and so never waits: nullopt, with nothing granted, where
  // AcquireChunks would wait (the adoption window after a restart is open,
  // or the node is short and other sessions must give memory back).
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> AcquireChunksNow(
      const PeerCredentials& peer, const v1::AcquireChunksRequest& r);
  absl::StatusOr<v1::ReleaseChunksResponse> ReleaseChunks(
      const PeerCredentials& peer, const v1::ReleaseChunksRequest& r);
  // Sharing chunks with other sessions (NodePool::Share, OpenShare,
  // CloseShare).
  absl::StatusOr<v1::ShareChunksResponse> ShareChunks(
      const PeerCredentials& peer, const v1::ShareChunksRequest& r);
  absl::StatusOr<v1::AcquireChunksResponse> OpenShare(
      const PeerCredentials& peer, const v1::OpenShareRequest& r);
  absl::StatusOr<v1::CloseShareResponse> CloseShare(
      const PeerCredentials& peer, const v1::CloseShareRequest& r);
  absl::Status Telemetry(const PeerCredentials& peer,
                         const v1::TelemetryReport& r);
  absl::StatusOr<v1::OomResponse> ReportOom(const PeerCredentials& peer,
                                            const v1::OomReport& r);
  // The config a session of `r.job()` in the caller's tenant would be
  // handed at registration as learned (empty: none), for a job to start
  // on before its first allocation (allocd run). InvalidArgument for a bad
  // label; the tenant's errors as for Register.
  absl::StatusOr<v1::LearnedConfigResponse> LearnedConfig(
      const PeerCredentials& peer, const v1::LearnedConfigRequest& r)
      ABSL_LOCKS_EXCLUDED(config_pusher_.fanout_mu());
  absl::Status AckConfig(const PeerCredentials& peer, const v1::ConfigAck& r);
  // The session a WatchConfig stream serves (proven by `peer` and
  // `secret`).
  absl::StatusOr<std::shared_ptr<Session>> Watch(const PeerCredentials& peer,
                                                 SessionId id,
                                                 absl::string_view secret);

  // Gives back a grant nobody will claim: its client gave up on its
  // AcquireChunks before the answer reached it (deadline, cancellation), or
  // its claim on the lease failed. `why` ends the log line. Returns the
  // bytes given back: 0 when the token was unknown or used already.
  uint64_t AbandonGrant(absl::string_view claim_token, absl::string_view why);

  // --- side socket
  // The tenant `peer` belongs to (SessionAccess::TenantOf and its errors).
  absl::StatusOr<TenantId> TenantOf(const PeerCredentials& peer) const {
    return access_.TenantOf(peer);
  }
  // Every call naming a session proves it with its `secret`, as the gRPC
  // requests' session_secret does.
  absl::Status Lease(const PeerCredentials& peer, SessionId id,
                     absl::string_view secret);
  // A reconnecting session's chunks from the daemon before (a frame of its
  // SideRequest.declare; `last`: its declaration is complete), adopted as
  // RestartAdoption::Declare and NodePool::Adopt say. Refusals are logged;
  // NotFound as for any call on the session.
  absl::StatusOr<AdoptOutcome> DeclareChunks(const PeerCredentials& peer,
                                             SessionId id,
                                             absl::string_view secret,
                                             std::vector<DeclaredChunk> chunks,
                                             bool last);
  // The memory of chunks session `id` made itself (one FD each, in order),
  // for its pool to hold: NodePool::GiveMemory, and its errors.
  absl::Status GiveMemory(const PeerCredentials& peer, SessionId id,
                          absl::string_view secret,
                          absl::Span<const uint64_t> chunk_ids,
                          std::vector<UniqueFd> fds);
  // The FDs of a grant, for SCM_RIGHTS, in batches (NodePool::Claim).
  absl::Status Claim(const PeerCredentials& peer, absl::string_view token,
                     size_t batch_size, NodePool::ClaimSink sink);
  // The session's process is gone (lease EOF) or never leased: everything
  // it held goes back to the pool. `why` is logged.
  void EndSession(SessionId id, absl::string_view why);
  // Ends sessions that registered more than lease_grace ago and never
  // opened a lease. Called periodically.
  void ExpireUnleased(absl::Time now);
  // Gives cached chunks back to the device as options.trim says. Called
  // periodically; returns the bytes trimmed.
  uint64_t TrimIdle();

  // --- Admin service (every call checks the caller may administer)
  absl::Status CheckAdmin(const PeerCredentials& peer) const;
  v1::StatusResponse Status() const;
  v1::ListSessionsResponse ListSessions() const;
  v1::GetConfigResponse GetConfig(absl::string_view job) const;
  // Also how a config file sets configs: `author` says who.
  // `predicted_peak_reserved_bytes`: allocd tune's prediction for the job
  // under `config` (0: none), exported for dashboards.
  absl::StatusOr<v1::SetConfigResponse> SetConfig(
      absl::string_view job, absl::string_view config,
      absl::string_view author, uint64_t predicted_peak_reserved_bytes = 0);
  // Device memory of session `id`'s pool that no session holds (capacity
  // less what sessions hold), when its memory comes from that pool (it
  // holds chunks of it); nullopt otherwise (an advisor's PyTorch allocates
  // beside the pool, which then does not know the GPU's free memory).
  std::optional<uint64_t> DeviceRoom(SessionId id) const;
  // Pushes `config` to one session as a new version that is not its job's
  // config (an autotuner's canary). Returns the version.
  absl::StatusOr<uint64_t> PushToSession(SessionId id, absl::string_view config,
                                         absl::string_view author,
                                         std::string reason,
                                         uint64_t predicted_peak_reserved_bytes);
  // ConfigPusher::PushToTenantJob: `config` for `tenant`'s sessions of
  // `job` only (the autotuner's job config).
  absl::StatusOr<uint64_t> PushToTenantJob(const TenantId& tenant,
                                           absl::string_view job,
                                           absl::string_view config,
                                           absl::string_view author,
                                           uint64_t predicted_peak_reserved_bytes);
  // ConfigPusher::PushToSessions: `config` for `sessions` only (the
  // autotuner's config for a job of several ranks).
  absl::StatusOr<uint64_t> PushToSessions(absl::string_view job,
                                          const std::vector<SessionId>& sessions,
                                          absl::string_view config,
                                          absl::string_view author,
                                          uint64_t predicted_peak_reserved_bytes);
  // ConfigPusher::DemandStream: what the daemon reads of session `id`'s
  // allocation stream, if it runs `running`.
  bool DemandStream(SessionId id, std::optional<absl::string_view> running,
                    uint64_t from_reserved, std::string reason);
  // Pushes `config` back to a session as a rollback, unless it is rolling
  // back already (an OOM did it). The version is the one the session ran
  // `config` under, when it did.
  absl::Status RollBackSession(SessionId id, absl::string_view config,
                               std::string reason);
  // Records an entry in the config history (the autotuner's decisions).
  void RecordHistory(HistoryRecord record) {
    configs().Record(std::move(record));
  }
  // Removes `job`'s own config (the config file dropped its entry); its
  // sessions get the default, if one is set.
  void ClearConfig(absl::string_view job, absl::string_view author);
  absl::Status SetQuota(const v1::SetQuotaRequest& r);
  // `allocctl pool trim [--device D]`: every cached chunk of device `device`
  // (a UUID or index; empty: of every device) back to the device now.
  // NotFound for an unknown device.
  absl::StatusOr<v1::TrimPoolResponse> TrimPool(absl::string_view device = "");
  // A uid quota (nullopt: none) on every device: what the uid's sessions on
  // one GPU may hold together.
  void SetUidQuota(uid_t uid, std::optional<uint64_t> bytes);
  // A tenant quota (nullopt: none, the default's if one is set) on every
  // device: what the tenant's sessions on one GPU may hold together.
  void SetTenantQuota(const TenantId& tenant, std::optional<uint64_t> bytes);
  v1::HistoryResponse History(absl::string_view job, uint32_t limit) const;

  // Ends every session (shutdown).
  void EndAll();
  size_t session_count() const { return sessions_.size(); }
  const DevicePools& pools() const { return *pools_; }
  Tenancy tenancy() const { return options_.tenancy; }
  ConfigStore& configs() { return config_pusher_.store(); }

 private:
  // The pool serving `session` (its device's).
  NodePool& PoolOf(const Session& session) const;
  // AcquireChunks; nullopt where it would wait and `may_wait` is false.
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> Acquire(
      const PeerCredentials& peer, const v1::AcquireChunksRequest& r,
      bool may_wait);
  // `grant` went to `session`: listed for the next daemon before it is
  // answered (RestartAdoption::Granted).
  void Granted(const Session& session, const Grant& grant);
  // Chunks went back to `session`'s pool: wakes reclaims waiting for them
  // and publishes the pool.
  void Released(const Session& session);
  // Exports every pool (at start), or `session`'s (PublishPool).
  void PublishPools();
  void PublishPoolOf(const Session& session);

  const DaemonCoreOptions options_;
  // Set by the one-pool constructor only.
  std::unique_ptr<DevicePools> owned_pools_;
  const DevicePools* const pools_;
  Metrics* const metrics_;
  const absl::Time started_ = absl::Now();
  SessionRegistry sessions_;
  SessionLimits session_limits_{options_.session_limits};
  SessionObserver* observer_ = nullptr;
  SessionAccess access_{&sessions_,
                        {.tenancy = options_.tenancy,
                         .admin_uids = options_.admin_uids,
                         .admin_gid = options_.admin_gid}};
  Quotas quotas_{pools_, &sessions_, options_.tenancy};
  ConfigPusher config_pusher_{&sessions_, metrics_};
  Reclaimer reclaimer_{&sessions_, metrics_, options_.reclaim_wait};
  WorkingSetStore working_sets_{options_.max_acquire_bytes};
  RestartAdoption adoption_{{.sessions_file = options_.sessions_file,
                             .window = options_.adopt_window,
                             .devices_at_start = options_.devices_at_start},
                            started_,
                            pools_,
                            &sessions_,
                            metrics_};
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_DAEMON_CORE_H_
