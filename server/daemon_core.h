// DaemonCore: what `allocd serve` does, in plain C++ — sessions, chunks,
// leases, telemetry, config push with ACK/NACK/rollback, quotas — with the
// caller's kernel-reported credentials as an argument. The gRPC services
// and the side socket are thin adapters over it, so every rule here is
// tested without a network.
//
// Rules:
// - a session belongs to the pid/uid that registered it; a call naming a
//   session from any other pid is PermissionDenied;
// - a session that has not opened its lease within `lease_grace` of
//   registering, or whose lease closed, ends: its chunks return to the pool;
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
//
// Thread-safe.
#ifndef ALLOCD_SERVER_DAEMON_CORE_H_
#define ALLOCD_SERVER_DAEMON_CORE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocd.pb.h"
#include "ipc/unix_socket.h"
#include "server/adoption_window.h"
#include "server/config_store.h"
#include "server/metrics.h"
#include "server/pool/device_pools.h"
#include "server/pool/node_pool.h"
#include "server/session_observer.h"
#include "server/session_registry.h"

namespace allocd {

// A device's memory when the daemon started, for fitting its pool's
// capacity after a restart (DaemonCore::SettleAdoption).
struct DeviceAtStart {
  // cuMemGetInfo's free at start; nullopt: no device (sim), nothing fitted.
  std::optional<uint64_t> free_memory;
  // The capacity was derived from `free_memory` (free minus --headroom, no
  // --capacity): the chunks surviving clients hold were in use at start,
  // so the capacity grows by what the pool adopts. Otherwise (--capacity
  // given) it is clipped, with a warning, to `free_memory` plus what the
  // pool adopted.
  bool capacity_from_free = false;
};

struct DaemonCoreOptions {
  // "sim" or "cuda": reported to clients and admins.
  std::string backend = "sim";
  // Where clients open their lease and claim FDs.
  std::string fd_socket;
  absl::Duration lease_grace = absl::Seconds(5);
  absl::Duration reclaim_wait = absl::Seconds(1);
  // uids allowed to call the Admin service besides root and the daemon's.
  std::vector<uid_t> admin_uids;
  // Largest single AcquireChunks.
  uint64_t max_acquire_bytes = uint64_t{1} << 40;
  // When cached chunks go back to the device (TrimIdle).
  TrimPolicy trim;
  // Where the pids of live sessions are kept for the next daemon (see
  // AdoptionWindow); empty: nowhere, and no adoption window.
  std::string sessions_file;
  // The longest AcquireChunks waits after a restart for the sessions of
  // the daemon before to re-declare their chunks.
  absl::Duration adopt_window = absl::Seconds(5);
  // Each device's memory when the daemon started, by node device (missing
  // ones: no device, as in sim). Once the adoption window closes each
  // pool's capacity is fitted to it (DeviceAtStart): the pool never
  // promises what the device does not have.
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
  absl::Status AckConfig(const PeerCredentials& peer, const v1::ConfigAck& r);
  // The session a WatchConfig stream serves (checked against `peer`).
  absl::StatusOr<std::shared_ptr<Session>> Watch(const PeerCredentials& peer,
                                                 SessionId id);

  // Gives back a grant nobody will claim: its client gave up on its
  // AcquireChunks before the answer reached it (deadline, cancellation), or
  // its claim on the lease failed. `why` ends the log line. Returns the
  // bytes given back: 0 when the token was unknown or used already.
  uint64_t AbandonGrant(absl::string_view claim_token, absl::string_view why);

  // --- side socket
  absl::Status Lease(const PeerCredentials& peer, SessionId id);
  // A reconnecting session's chunks from the daemon before (a frame of its
  // SideRequest.declare; `last`: its declaration is complete). Refusals
  // are logged; NotFound/PermissionDenied as for any call on the session.
  absl::StatusOr<AdoptOutcome> DeclareChunks(const PeerCredentials& peer,
                                             SessionId id,
                                             std::vector<DeclaredChunk> chunks,
                                             bool last);
  // The memory of chunks session `id` made itself (one FD each, in order),
  // for its pool to hold: NodePool::GiveMemory, and its errors.
  absl::Status GiveMemory(const PeerCredentials& peer, SessionId id,
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
  // `skip_running`: sessions that run `config` already (a canary) get no
  // push.
  absl::StatusOr<v1::SetConfigResponse> SetConfig(
      absl::string_view job, absl::string_view config,
      absl::string_view author, uint64_t predicted_peak_reserved_bytes = 0,
      bool skip_running = false);
  // Pushes `config` to one session as a new version that is not its job's
  // config (an autotuner's canary). Returns the version.
  absl::StatusOr<uint64_t> PushToSession(SessionId id, absl::string_view config,
                                         absl::string_view author,
                                         std::string reason,
                                         uint64_t predicted_peak_reserved_bytes);
  // Pushes `config` back to a session as a rollback, unless it is rolling
  // back already (an OOM did it). The version is the one the session ran
  // `config` under, when it did.
  absl::Status RollBackSession(SessionId id, absl::string_view config,
                               std::string reason);
  // Records an entry in the config history (the autotuner's decisions).
  void RecordHistory(HistoryRecord record) { configs_.Record(std::move(record)); }
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
  v1::HistoryResponse History(absl::string_view job, uint32_t limit) const;

  // Ends every session (shutdown).
  void EndAll();
  size_t session_count() const { return sessions_.size(); }
  const DevicePools& pools() const { return *pools_; }
  ConfigStore& configs() { return configs_; }

 private:
  // The pool serving `session` (its device's).
  NodePool& PoolOf(const Session& session) const;
  // AcquireChunks; nullopt where it would wait and `may_wait` is false.
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> Acquire(
      const PeerCredentials& peer, const v1::AcquireChunksRequest& r,
      bool may_wait);
  absl::StatusOr<std::shared_ptr<Session>> OwnedSession(
      const PeerCredentials& peer, SessionId id) const;
  void Push(Session& session, const ConfigRecord& record, bool rollback,
            std::string reason);
  // Pushes `target` to `session` as a rollback and records it.
  void PushRollBack(Session& session, const ConfigRecord& target,
                    std::string reason);
  // The version under which this daemon records the config (canonical) a
  // registering client declared it runs under `declared_version`: that
  // version when this daemon set it, else a new one (a restarted daemon).
  AppliedConfig AdoptRunningConfig(absl::string_view job,
                                   const std::string& config,
                                   uint64_t declared_version, SessionId id);
  // Exports the device's pool (PublishPool(session): the session's).
  void PublishPool(const DevicePool& device);
  void PublishPool(const Session& session);
  // Logs the sessions a restart waits for, settles an adoption with
  // nothing to wait for, and publishes every pool (both constructors).
  void Start();
  // Once the adoption window has closed (at most once): fits each device's
  // capacity to its memory (options_.devices_at_start).
  void SettleAdoption();
  // Fits device `device`'s capacity to its free memory at start plus what
  // its pool adopted (SettleAdoption, under settle_mu_).
  void FitCapacity(const DevicePool& device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(settle_mu_);
  // Writes the sessions file: the pids of live sessions, and of the daemon
  // before's sessions still awaited.
  void SaveSessions();
  // Wakes Reclaim()s waiting for memory to come back.
  void SignalReleased();
  // Asks every session of `except`'s device but `except` that caches
  // memory and is not itself waiting in an acquire to release it, then
  // waits until `shortfall` bytes (ShortfallBytes of the refusal: short of
  // the pool's capacity, or of the device's memory) came back or
  // reclaim_wait passes.
  void Reclaim(const Session& except, uint64_t shortfall);

  const DaemonCoreOptions options_;
  // Set by the one-pool constructor only.
  std::unique_ptr<DevicePools> owned_pools_;
  const DevicePools* const pools_;
  Metrics* const metrics_;
  const absl::Time started_ = absl::Now();
  SessionRegistry sessions_;
  ConfigStore configs_;
  SessionObserver* observer_ = nullptr;
  AdoptionWindow adoption_{
      options_.sessions_file.empty()
          ? SessionsByPid{}
          : ReadSessionsFile(options_.sessions_file, ProcessAlive),
      started_ + options_.adopt_window};
  // Set by EndAll: the sessions file keeps the sessions a shutdown ends,
  // whose processes live on and will declare their chunks to the next
  // daemon.
  std::atomic<bool> shutting_down_{false};
  absl::Mutex settle_mu_;
  bool settled_ ABSL_GUARDED_BY(settle_mu_) = false;
  // By node device, once SettleAdoption fitted its capacity: the most a
  // late declaration (after the fit) grows it to (the --capacity it
  // clipped, or unbounded for a capacity derived from free memory).
  std::map<int, uint64_t> capacity_ceiling_ ABSL_GUARDED_BY(settle_mu_);
  absl::Mutex sessions_file_mu_;
  // Held by a registration from its session's creation to its config at
  // registration, and by a job config's fan-out to the sessions it applies
  // to: otherwise a session created during a SetConfig is pushed the new
  // version by both, applies it twice and ACKs twice.
  absl::Mutex fanout_mu_;

  // The working set an ended session reported, kept for the job's next
  // session on the device (RegisterResponse.working_set); by job label
  // and node device, the last one to end. In memory only: a restarted
  // daemon hands over nothing until a session of the job ends again.
  absl::Status ValidateWorkingSet(const v1::WorkingSet& set,
                                  uint64_t chunk_bytes) const;
  void RememberWorkingSet(const Session& ended);
  std::vector<uint64_t> LastWorkingSet(const std::string& job,
                                       int node_device) const;
  mutable absl::Mutex working_sets_mu_;
  std::map<std::pair<std::string, int>, std::vector<uint64_t>> working_sets_
      ABSL_GUARDED_BY(working_sets_mu_);

  // Signalled whenever chunks return to the pool.
  absl::Mutex released_mu_;
  absl::CondVar released_cv_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_DAEMON_CORE_H_
