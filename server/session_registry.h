// Sessions: one per registered client process. A session is bound to the
// pid, uid and tenant the kernel reported for the connection that
// registered it (SO_PEERCRED), never to what the client claims, and to a
// secret only that client is told; it lives until its lease
// connection closes (the process exited or dropped it).
//
// Each session has a control queue: the config pushes and reclaim requests
// that its WatchConfig stream delivers, in order. Thread-safe.
#ifndef ALLOCD_SERVER_SESSION_REGISTRY_H_
#define ALLOCD_SERVER_SESSION_REGISTRY_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocd.pb.h"
#include "server/autotune/job_key.h"
#include "server/session_id.h"
#include "server/session_secret.h"
#include "server/tenant_id.h"

namespace allocd {

// What a session was registered with; fixed for its life.
struct SessionIdentity {
  SessionId id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  // Who it belongs to (server/tenant.h): its memory, job label and quotas
  // are that tenant's.
  TenantId tenant;
  std::string job;
  // The client's CUDA ordinal, as it reported it.
  int device = 0;
  // The node's device whose pool serves the session (DevicePools).
  int node_device = 0;
  std::string gpu_uuid;
  std::string client;
  std::string initial_config;
  absl::Time registered_at;
  // Its place in a job of several processes (RegisterRequest.rank).
  SessionRank rank;
};

// A config a session ran: version 0 is its initial config.
struct AppliedConfig {
  uint64_t version = 0;
  std::string config;
};

class Session {
 public:
  // `secret` proves the session (server/session_secret.h).
  explicit Session(SessionIdentity identity,
                   std::string secret = NewSessionSecret());

  const SessionIdentity& identity() const { return identity_; }
  SessionId id() const { return identity_.id; }
  // Told to the registering client only (RegisterResponse.session_secret).
  const std::string& secret() const { return secret_; }
  // Whether `secret` is this session's (in constant time: SameSecret).
  bool ProvenBy(absl::string_view secret) const;

  // Queues a message for the WatchConfig stream. No-op once closed. A
  // config's version is offered to the session: it may answer it
  // (MayAnswer).
  void Push(v1::ControlMessage message);
  // Waits up to `timeout` for the next message. False on timeout or once
  // the session is closed and the queue drained.
  bool WaitNext(v1::ControlMessage* message, absl::Duration timeout);
  // Ends the session: watchers return, pushes are dropped.
  void Close();
  bool closed() const;

  // The lease connection proved the process is there.
  void MarkLeased();
  bool leased() const;

  // An AcquireChunks of this session is in flight: its client waits for it
  // and cannot answer a reclaim request until it returns.
  void BeginAcquire();
  void EndAcquire();
  bool acquiring() const;

  // The daemon refused this session memory (node pool short, quota): the
  // OOM the client reports next is the node's doing, not its config's.
  // TakeAcquireRefused() tells and forgets.
  void NoteAcquireRefused();
  bool TakeAcquireRefused();

  // Config bookkeeping for ACK/NACK and rollback. `Acked` makes `config` the
  // one the session runs, remembering the one before it; `RollBackTarget`
  // is the config to return to after an OOM under a pushed version (nullopt
  // when the session runs its initial config: nothing to roll back to).
  void Acked(AppliedConfig config);
  // Whether the session may ACK or NACK `version`: one pushed to it and not
  // answered yet (the newest kMaxOffered), or a config it ran. A client
  // cannot make the daemon keep versions that were never its own.
  static constexpr size_t kMaxOffered = 64;
  bool MayAnswer(uint64_t version) const;
  // It NACKed `version`: no longer offered.
  void Refused(uint64_t version);
  // A config pushed to it is not answered yet.
  bool awaits_answer() const;
  AppliedConfig Current() const;
  // The versions of every config it ran and may return to (a rollback
  // pops back to one): what the config store must keep.
  std::vector<uint64_t> AppliedVersions() const;
  std::optional<AppliedConfig> RollBackTarget() const;
  // Forgets the current config after a rollback was pushed, so a second OOM
  // before the client ACKs the rollback does not roll back twice.
  void StartRollBack();
  bool rolling_back() const;

  void SetStats(std::map<std::string, int64_t> stats);
  std::map<std::string, int64_t> Stats() const;
  // How many times SetStats ran: a change says fresh telemetry came.
  uint64_t stats_version() const;
  // The segment sizes the session last reported holding at its peak
  // (TelemetryReport.working_set), in the order it asked for them.
  void SetWorkingSet(std::vector<uint64_t> segment_bytes);
  std::vector<uint64_t> WorkingSet() const;
  // Where the config it started on came from, decided at registration
  // (RegisterResponse.start_config_source): "own", "learned", "prior",
  // "replaced".
  void SetStartConfigSource(std::string source);
  std::string start_config_source() const;
  // Returns the OOM count after this one.
  uint64_t CountOom();
  uint64_t ooms() const;

 private:
  const SessionIdentity identity_;
  const std::string secret_;
  mutable absl::Mutex mu_;
  std::deque<v1::ControlMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string start_config_source_ ABSL_GUARDED_BY(mu_) = "own";
  bool leased_ ABSL_GUARDED_BY(mu_) = false;
  int acquiring_ ABSL_GUARDED_BY(mu_) = 0;
  bool acquire_refused_ ABSL_GUARDED_BY(mu_) = false;
  // Oldest first; the back is what the session runs now.
  std::vector<AppliedConfig> applied_ ABSL_GUARDED_BY(mu_);
  // Versions pushed and not answered yet, oldest first.
  std::deque<uint64_t> offered_ ABSL_GUARDED_BY(mu_);
  bool rolling_back_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int64_t> stats_ ABSL_GUARDED_BY(mu_);
  uint64_t stats_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> working_set_ ABSL_GUARDED_BY(mu_);
  uint64_t ooms_ ABSL_GUARDED_BY(mu_) = 0;
};

class SessionRegistry {
 public:
  // A new session with the next id (ids are never reused) and a fresh
  // secret.
  std::shared_ptr<Session> Create(SessionIdentity identity);
  // nullptr when no such live session.
  std::shared_ptr<Session> Find(SessionId id) const;
  // Removes and returns the session (nullptr if gone already), so exactly
  // one caller ends it.
  std::shared_ptr<Session> Remove(SessionId id);
  std::vector<std::shared_ptr<Session>> List() const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  SessionId last_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<SessionId, std::shared_ptr<Session>> sessions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_REGISTRY_H_
