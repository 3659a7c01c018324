#include "server/daemon_core.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "proto/protocol.h"
#include "server/log.h"

namespace allocd {
namespace {

constexpr size_t kMaxClientDescription = 256;
constexpr size_t kMaxGpuUuid = 128;
constexpr size_t kMaxOomMessage = 4096;
constexpr size_t kMaxStats = 1024;

int64_t UnixMicros(absl::Time t) { return absl::ToUnixMicros(t); }

v1::AcquireChunksResponse ResponseOf(const Grant& grant) {
  v1::AcquireChunksResponse response;
  for (uint64_t id : grant.chunk_ids) response.add_chunk_ids(id);
  response.set_bytes(grant.bytes);
  response.set_claim_token(grant.token);
  response.set_reused_chunks(grant.reused_chunks);
  const size_t first_made = grant.chunk_ids.size() - grant.client_made;
  for (size_t i = first_made; i < grant.chunk_ids.size(); ++i) {
    response.add_client_made_ids(grant.chunk_ids[i]);
    response.add_client_made_sizes(grant.chunk_sizes[i]);
  }
  return response;
}

// What a session could give back, by its last telemetry: what its
// allocator caches (reserved, not allocated) and what its client read
// ahead and has not mapped.
uint64_t CachedBytes(const std::map<std::string, int64_t>& stats) {
  auto reserved = stats.find("reserved_bytes.all.current");
  auto allocated = stats.find("allocated_bytes.all.current");
  auto read_ahead = stats.find(kReadAheadStat);
  int64_t cached = 0;
  if (reserved != stats.end() && allocated != stats.end()) {
    cached += std::max<int64_t>(reserved->second - allocated->second, 0);
  }
  if (read_ahead != stats.end()) {
    cached += std::max<int64_t>(read_ahead->second, 0);
  }
  return static_cast<uint64_t>(cached);
}

// An event batch's columns are one length, within bounds, of known ops.
absl::Status ValidateEvents(const v1::EventBatch& b) {
  const int n = b.ops_size();
  if (b.sizes_size() != n || b.ids_size() != n || b.streams_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event batch columns differ in length: ", n, " ops, ", b.sizes_size(),
        " sizes, ", b.ids_size(), " ids, ", b.streams_size(), " streams"));
  }
  if (static_cast<size_t>(n) > kMaxEventsPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event batch holds ", n, " events; at most ", kMaxEventsPerBatch));
  }
  for (uint32_t op : b.ops()) {
    if (op > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "event op ", op, " is not 0 (alloc), 1 (free_requested) or 2 "
          "(free_completed)"));
    }
  }
  return absl::OkStatus();
}

// A config in canonical form; as given when it does not parse (then it
// equals no canonical config).
std::string Canonical(absl::string_view config) {
  absl::StatusOr<AllocatorConfig> parsed =
      ParseAllocatorConfig(std::string(config));
  return parsed.ok() ? FormatAllocatorConfig(*parsed) : std::string(config);
}

void Fill(const ConfigRecord& record, v1::ConfigVersion* out) {
  out->set_version(record.version);
  out->set_job(record.job);
  out->set_config(record.config);
  out->set_set_unix_micros(UnixMicros(record.set_at));
  out->set_author(record.author);
  out->set_predicted_peak_reserved_bytes(record.predicted_peak_reserved_bytes);
}

std::unique_ptr<DevicePools> OneDevice(NodePool* pool,
                                       const std::string& backend) {
  auto pools = std::make_unique<DevicePools>();
  // A new DevicePools takes any first UUID.
  (void)pools->AddBorrowed(SimDeviceUuid(0), backend, pool);
  return pools;
}

}  // namespace

DaemonCore::DaemonCore(DaemonCoreOptions options, const DevicePools* pools,
                       Metrics* metrics)
    : options_(std::move(options)), pools_(pools), metrics_(metrics) {
  Start();
}

DaemonCore::DaemonCore(DaemonCoreOptions options, NodePool* pool,
                       Metrics* metrics)
    : options_(std::move(options)),
      owned_pools_(OneDevice(pool, options_.backend)),
      pools_(owned_pools_.get()),
      metrics_(metrics) {
  Start();
}

NodePool& DaemonCore::PoolOf(const Session& session) const {
  return *pools_->at(session.identity().node_device).pool;
}

void DaemonCore::Start() {
  if (const SessionsByPid awaited = adoption_.pending(); !awaited.empty()) {
    std::string pids;
    for (const auto& [pid, sessions] : awaited) {
      absl::StrAppend(&pids, pids.empty() ? "" : ", ", pid);
    }
    LogInfo(absl::StrCat(
        "restarted with ", awaited.size(), " process(es) of the daemon "
        "before still alive (pids ", pids, "): new memory waits up to ",
        absl::FormatDuration(options_.adopt_window),
        " for them to re-declare the chunks they hold"));
  }
  SettleAdoption();
  for (const DevicePool& device : pools_->devices()) PublishPool(device);
}

void DaemonCore::SettleAdoption() {
  if (adoption_.open()) return;
  // Acquires wait here for the first caller to finish: none may create
  // memory before the capacity is what the device can give.
  absl::MutexLock lock(&settle_mu_);
  if (settled_) return;
  settled_ = true;
  for (const DevicePool& device : pools_->devices()) FitCapacity(device);
}

void DaemonCore::FitCapacity(const DevicePool& device) {
  if (static_cast<size_t>(device.index) >= options_.devices_at_start.size()) {
    return;
  }
  const DeviceAtStart& at_start = options_.devices_at_start[device.index];
  if (!at_start.free_memory.has_value()) return;
  const PoolStats stats = device.pool->Stats();
  // Before any Acquire: the live chunks are the adopted ones, in use on the
  // device at start, so not in its free memory.
  const uint64_t adopted = stats.created_bytes;
  if (at_start.capacity_from_free) {
    capacity_ceiling_[device.index] = UINT64_MAX;
    if (adopted == 0) return;
    device.pool->SetCapacity(stats.capacity + adopted);
    LogInfo(absl::StrCat("device ", device.index, " (", device.uuid,
                         "): capacity ", FormatSize(stats.capacity + adopted),
                         ", its free memory at start less --headroom plus ",
                         FormatSize(adopted),
                         " its surviving clients hold"));
    PublishPool(device);
    return;
  }
  const uint64_t limit = *at_start.free_memory + adopted;
  if (stats.capacity <= limit) return;
  LogError(absl::StrCat(
      "device ", device.index, " (", device.uuid, "): --capacity ",
      FormatSize(stats.capacity), " is more than the device can give: ",
      FormatSize(*at_start.free_memory), " free at start",
      adopted > 0 ? absl::StrCat(" plus ", FormatSize(adopted),
                                 " its surviving clients hold")
                  : "",
      "; serving ", FormatSize(limit), " (other processes use the rest of "
      "the GPU: lower --capacity to silence this)"));
  capacity_ceiling_[device.index] = stats.capacity;
  device.pool->SetCapacity(limit);
  PublishPool(device);
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::OwnedSession(
    const PeerCredentials& peer, SessionId id) const {
  std::shared_ptr<Session> session = sessions_.Find(id);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no session ", id,
                                            " (ended, or never registered)"));
  }
  if (session->identity().pid != peer.pid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", id, " belongs to pid ",
                     session->identity().pid, ", not to pid ", peer.pid));
  }
  return session;
}

absl::StatusOr<v1::RegisterResponse> DaemonCore::Register(
    const PeerCredentials& peer, const v1::RegisterRequest& r) {
  if (r.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("client speaks protocol ", r.protocol_version(),
                     "; this daemon speaks ", kProtocolVersion));
  }
  if (absl::Status s = ValidateJobLabel(r.job()); !s.ok()) return s;
  if (r.device() < 0 || r.device() > 1023) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", r.device(), " out of range"));
  }
  if (r.gpu_uuid().size() > kMaxGpuUuid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_uuid is ", r.gpu_uuid().size(), " bytes; at most ", kMaxGpuUuid));
  }
  absl::StatusOr<const DevicePool*> found = pools_->ForClient(r.gpu_uuid());
  if (!found.ok()) return found.status();
  const DevicePool& device = **found;
  if (r.client().size() > kMaxClientDescription) {
    return absl::InvalidArgumentError(
        absl::StrCat("client description is ", r.client().size(),
                     " bytes; at most ", kMaxClientDescription));
  }
  absl::StatusOr<AllocatorConfig> initial =
      ParseAllocatorConfig(r.initial_config());
  if (!initial.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_config is not a config PyTorch 2.11 accepts: ",
        initial.status().message()));
  }
  std::string current_config;
  if (r.current_config_version() != 0) {
    absl::StatusOr<AllocatorConfig> current =
        ParseAllocatorConfig(r.current_config());
    if (!current.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "current_config is not a config PyTorch 2.11 accepts: ",
          current.status().message()));
    }
    current_config = FormatAllocatorConfig(*current);
  }
  absl::ReleasableMutexLock fanout(&fanout_mu_);
  std::shared_ptr<Session> session = sessions_.Create(
      {.pid = peer.pid,
       .uid = peer.uid,
       .job = r.job(),
       .device = r.device(),
       .node_device = device.index,
       .gpu_uuid = device.uuid,
       .client = r.client(),
       .initial_config = FormatAllocatorConfig(*initial),
       .registered_at = absl::Now()});
  if (absl::Status s =
          device.pool->AddSession(session->id(), peer.uid, peer.pid);
      !s.ok()) {
    sessions_.Remove(session->id());
    return s;
  }
  AppliedConfig running = session->Current();
  if (r.current_config_version() != 0) {
    running = AdoptRunningConfig(r.job(), current_config,
                                 r.current_config_version(), session->id());
    session->Acked(running);
  }
  std::optional<ConfigRecord> config = configs_.Effective(r.job());
  // The client applies it at start and ACKs like any push; a client that
  // runs it already (it reconnected) is not pushed it twice.
  if (config.has_value() && config->config != running.config) {
    Push(*session, *config, false, "config for this job at registration");
  }
  fanout.Release();
  SaveSessions();
  metrics_->SessionStarted(session->id(), r.job(), device.index, device.uuid,
                           peer.pid);
  const std::vector<uint64_t> working_set =
      LastWorkingSet(r.job(), device.index);
  const uint64_t handed_bytes =
      std::accumulate(working_set.begin(), working_set.end(), uint64_t{0});
  LogInfo(absl::StrCat(
      "session ", session->id(), " registered: pid ", peer.pid, ", uid ",
      peer.uid, ", job \"", r.job(), "\", device ", device.index, " (",
      device.uuid, ", the client's ", r.device(), "), ", r.client(),
      working_set.empty()
          ? ""
          : absl::StrCat("; handed its job's last working set: ",
                         working_set.size(), " segments, ",
                         FormatSize(handed_bytes))));

  v1::RegisterResponse response;
  response.set_session_id(session->id());
  response.set_chunk_bytes(device.pool->chunk_bytes());
  response.set_fd_socket(options_.fd_socket);
  response.set_backend(options_.backend);
  response.set_capacity_bytes(device.pool->capacity());
  response.set_gpu_uuid(device.uuid);
  response.set_node_device(device.index);
  response.set_current_config_version(running.version);
  response.set_declare_fds(device.pool->proves_chunks());
  response.set_adopts_chunks(true);
  response.set_lease_acquires(true);
  for (uint64_t bytes : working_set) {
    response.mutable_working_set()->add_segment_bytes(bytes);
  }
  if (config.has_value()) Fill(*config, response.mutable_config());
  if (observer_ != nullptr) {
    observer_->SessionStarted(session->identity(), running, r.autotune());
  }
  return response;
}

AppliedConfig DaemonCore::AdoptRunningConfig(absl::string_view job,
                                             const std::string& config,
                                             uint64_t declared_version,
                                             SessionId id) {
  if (std::optional<ConfigRecord> known = configs_.Find(declared_version);
      known.has_value() && known->config == config) {
    return {.version = known->version, .config = known->config};
  }
  // Validated above, so this cannot fail.
  absl::StatusOr<ConfigRecord> adopted = configs_.AddVersion(
      job, config,
      absl::StrCat("session ", id, " runs it (version ", declared_version,
                   " of the daemon it was connected to before)"),
      "adopt");
  return {.version = adopted->version, .config = adopted->config};
}

absl::StatusOr<v1::AcquireChunksResponse> DaemonCore::AcquireChunks(
    const PeerCredentials& peer, const v1::AcquireChunksRequest& r) {
  absl::StatusOr<std::optional<v1::AcquireChunksResponse>> granted =
      Acquire(peer, r, /*may_wait=*/true);
  if (!granted.ok()) return granted.status();
  return **std::move(granted);  // never nullopt when it may wait
}

absl::StatusOr<std::optional<v1::AcquireChunksResponse>>
DaemonCore::AcquireChunksNow(const PeerCredentials& peer,
                             const v1::AcquireChunksRequest& r) {
  return Acquire(peer, r, /*may_wait=*/false);
}

absl::StatusOr<std::optional<v1::AcquireChunksResponse>> DaemonCore::Acquire(
    const PeerCredentials& peer, const v1::AcquireChunksRequest& r,
    bool may_wait) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  if (r.bytes() == 0 || r.bytes() > options_.max_acquire_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes must be in [1, ", FormatSize(options_.max_acquire_bytes),
        "]; got ", r.bytes()));
  }
  // Memory a client asks for ahead of need never makes others give back.
  if (r.read_ahead()) may_wait = false;
  // After a restart: not before the surviving sessions' chunks are counted.
  if (!may_wait && adoption_.open()) return std::nullopt;
  adoption_.Wait();
  SettleAdoption();
  NodePool& pool = PoolOf(**session);
  // A client that does not say maps every chunk at the smallest size.
  const uint64_t max_chunk_bytes =
      r.max_chunk_bytes() != 0 ? r.max_chunk_bytes() : pool.chunk_bytes();
  if (r.read_ahead()) {
    // As many as leave the pool as much again free.
    const uint64_t fit = pool.AvailableBytes() / 2 / r.bytes();
    const uint32_t count = static_cast<uint32_t>(std::min<uint64_t>(
        fit, std::clamp<uint32_t>(r.count(), 1, kMaxReadAheadGrants)));
    if (count == 0) return std::nullopt;
    absl::StatusOr<Grant> grant =
        pool.AcquireCached(r.session_id(), r.bytes(), max_chunk_bytes, count,
                           r.client_creates());
    if (!grant.ok() || grant->chunk_ids.empty()) return std::nullopt;
    PublishPool(**session);
    return ResponseOf(*grant);
  }
  (*session)->BeginAcquire();
  auto acquire = [&] {
    return pool.Acquire(r.session_id(), r.bytes(), max_chunk_bytes,
                        r.client_creates());
  };
  absl::StatusOr<Grant> grant = acquire();
  if (!grant.ok() && IsNodeShortage(grant.status())) {
    if (!may_wait) {
      (*session)->EndAcquire();
      return std::nullopt;
    }
    Reclaim(**session, *ShortfallBytes(grant.status()));
    grant = acquire();
  }
  (*session)->EndAcquire();
  if (absl::IsResourceExhausted(grant.status())) {
    (*session)->NoteAcquireRefused();
  }
  PublishPool(**session);
  if (!grant.ok()) return grant.status();
  return ResponseOf(*grant);
}

void DaemonCore::Reclaim(const Session& except, uint64_t shortfall) {
  NodePool& pool = PoolOf(except);
  const int device = except.identity().node_device;
  const PoolStats before = pool.Stats();
  const absl::Time deadline = absl::Now() + options_.reclaim_wait;
  // What the others cache (reserved but not allocated, from their last
  // telemetry) is all a reclaim can free; ask only when it can cover the
  // shortfall, or the asker would wait for nothing.
  std::vector<std::pair<std::shared_ptr<Session>, uint64_t>> cachers;
  uint64_t reclaimable = 0;
  // Sessions holding memory, with the telemetry they were counted by.
  std::vector<std::pair<std::shared_ptr<Session>, uint64_t>> holders;
  auto count_others = [&] {
    cachers.clear();
    holders.clear();
    reclaimable = 0;
    for (std::shared_ptr<Session>& s : sessions_.List()) {
      // A session blocked in its own acquire answers no reclaim until that
      // returns: waiting on it could only time out.
      // Only memory of the same GPU helps.
      if (s->id() == except.id() || s->identity().node_device != device ||
          s->acquiring()) {
        continue;
      }
      const uint64_t version = s->stats_version();
      const std::map<std::string, int64_t> stats = s->Stats();
      if (auto r = stats.find("reserved_bytes.all.current");
          r != stats.end() && r->second > 0) {
        holders.emplace_back(s, version);
      }
      const uint64_t cached = CachedBytes(stats);
      if (cached == 0) continue;
      reclaimable += cached;
      cachers.emplace_back(std::move(s), cached);
    }
  };
  count_others();
  if (reclaimable < shortfall && !holders.empty()) {
    // A job that has just freed its peak into its allocator's cache reports
    // it with its next telemetry (another job gathering its own peak in the
    // meantime would be refused): wait for each job holding memory to
    // report once more, within reclaim_wait.
    const std::vector<std::pair<std::shared_ptr<Session>, uint64_t>> counted =
        holders;
    auto all_reported = [&] {
      for (const auto& [session, version] : counted) {
        if (!session->closed() && session->stats_version() == version) {
          return false;
        }
      }
      return true;
    };
    absl::MutexLock lock(&released_mu_);
    while (reclaimable < shortfall && !all_reported() &&
           !released_cv_.WaitWithDeadline(&released_mu_, deadline)) {
      count_others();
    }
    count_others();
  }
  if (reclaimable < shortfall) return;
  for (auto& [session, cached] : cachers) {
    v1::ControlMessage message;
    message.mutable_reclaim()->set_bytes(std::min(cached, shortfall));
    message.mutable_reclaim()->set_reason(absl::StrCat(
        "session ", except.id(), " needs memory and the node pool of device ",
        device, " is short by ", FormatSize(shortfall)));
    session->Push(std::move(message));
  }
  metrics_->ReclaimRequested();
  const absl::Time asked = absl::Now();
  uint64_t returned = 0;
  {
    absl::MutexLock lock(&released_mu_);
    while (absl::Now() < deadline) {
      // Given back since the ask: in the cache, or the device's again.
      const uint64_t in_use = pool.Stats().in_use_bytes;
      returned = before.in_use_bytes - std::min(in_use, before.in_use_bytes);
      if (returned >= shortfall) break;
      released_cv_.WaitWithDeadline(&released_mu_, deadline);
    }
  }
  // Why a job waited, or got nothing, is the first question of an OOM.
  LogInfo(absl::StrCat(
      "reclaim for session ", except.id(), " on device ", device, ": short by ",
      FormatSize(shortfall), ", asked ", cachers.size(),
      " session(s) caching ", FormatSize(reclaimable), "; ",
      FormatSize(returned), " came back in ",
      absl::ToInt64Milliseconds(absl::Now() - asked), " ms",
      returned >= shortfall ? "" : " (not enough: the acquire is retried once)"));
}

void DaemonCore::SignalReleased() {
  absl::MutexLock lock(&released_mu_);
  released_cv_.SignalAll();
}

uint64_t DaemonCore::AbandonGrant(absl::string_view claim_token,
                                  absl::string_view why) {
  for (const DevicePool& device : pools_->devices()) {
    const uint64_t returned = device.pool->Abandon(claim_token);
    if (returned == 0) continue;
    LogInfo(absl::StrCat("an unclaimed grant of ", FormatSize(returned),
                         " went back to the pool of device ", device.index,
                         ": ", why));
    SignalReleased();
    PublishPool(device);
    return returned;
  }
  return 0;
}

absl::StatusOr<v1::ReleaseChunksResponse> DaemonCore::ReleaseChunks(
    const PeerCredentials& peer, const v1::ReleaseChunksRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  if (r.chunk_ids_size() == 0 ||
      static_cast<size_t>(r.chunk_ids_size()) > kMaxChunkIdsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_ids must hold 1 to ", kMaxChunkIdsPerRequest, " ids; got ",
        r.chunk_ids_size()));
  }
  std::vector<uint64_t> ids(r.chunk_ids().begin(), r.chunk_ids().end());
  NodePool& pool = PoolOf(**session);
  const uint64_t before = pool.Stats().in_use_bytes;
  if (absl::Status s = pool.Release(r.session_id(), ids); !s.ok()) return s;
  const uint64_t after = pool.Stats().in_use_bytes;
  SignalReleased();
  PublishPool(**session);
  v1::ReleaseChunksResponse response;
  response.set_released_bytes(before > after ? before - after : 0);
  return response;
}

absl::Status DaemonCore::GiveMemory(const PeerCredentials& peer, SessionId id,
                                    absl::Span<const uint64_t> chunk_ids,
                                    std::vector<UniqueFd> fds) {
  absl::StatusOr<std::shared_ptr<Session>> session = OwnedSession(peer, id);
  if (!session.ok()) return session.status();
  return PoolOf(**session).GiveMemory(id, chunk_ids, std::move(fds));
}

absl::StatusOr<v1::ShareChunksResponse> DaemonCore::ShareChunks(
    const PeerCredentials& peer, const v1::ShareChunksRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  if (static_cast<size_t>(r.chunk_ids_size()) > kMaxChunkIdsPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_ids must hold at most ", kMaxChunkIdsPerRequest,
                     " ids; got ", r.chunk_ids_size()));
  }
  std::vector<uint64_t> ids(r.chunk_ids().begin(), r.chunk_ids().end());
  absl::StatusOr<std::string> token = PoolOf(**session).Share(r.session_id(), ids);
  if (!token.ok()) return token.status();
  v1::ShareChunksResponse response;
  response.set_share_token(*std::move(token));
  return response;
}

absl::StatusOr<v1::AcquireChunksResponse> DaemonCore::OpenShare(
    const PeerCredentials& peer, const v1::OpenShareRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  // Shares stay on their GPU: the token is only known to the pool of the
  // session that made it.
  absl::StatusOr<Grant> grant =
      PoolOf(**session).OpenShare(r.session_id(), r.share_token());
  if (!grant.ok()) return grant.status();
  v1::AcquireChunksResponse response;
  for (uint64_t id : grant->chunk_ids) response.add_chunk_ids(id);
  response.set_bytes(grant->bytes);
  response.set_claim_token(grant->token);
  return response;
}

absl::StatusOr<v1::CloseShareResponse> DaemonCore::CloseShare(
    const PeerCredentials& peer, const v1::CloseShareRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  if (absl::Status s = PoolOf(**session).CloseShare(r.session_id(), r.share_token());
      !s.ok()) {
    return s;
  }
  // Chunks may have gone back to the cache: an Acquire may be waiting.
  SignalReleased();
  PublishPool(**session);
  return v1::CloseShareResponse();
}

absl::Status DaemonCore::Telemetry(const PeerCredentials& peer,
                                   const v1::TelemetryReport& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      OwnedSession(peer, r.session_id());
  if (!session.ok()) return session.status();
  if (static_cast<size_t>(r.stats_size()) > kMaxStats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "telemetry holds ", r.stats_size(), " stats; at most ", kMaxStats));
  }
  if (r.has_events()) {
    if (absl::Status s = ValidateEvents(r.events()); !s.ok()) return s;
  }
  if (r.has_working_set()) {
    absl::Status valid =
        ValidateWorkingSet(r.working_set(), PoolOf(**session).chunk_bytes());
    if (!valid.ok()) return valid;
    (*session)->SetWorkingSet({r.working_set().segment_bytes().begin(),
                               r.working_set().segment_bytes().end()});
  }
  // A report of events alone leaves the stats as they were.
  if (r.stats_size() > 0 || !r.has_events()) {
    std::map<std::string, int64_t> stats(r.stats().begin(), r.stats().end());
    metrics_->Telemetry(r.session_id(), stats, r.config_version());
    if (observer_ != nullptr) {
      observer_->Stats(r.session_id(), stats, r.config_version());
    }
    (*session)->SetStats(std::move(stats));
    SignalReleased();  // a Reclaim may wait for what this session caches
  }
  if (r.has_events() && observer_ != nullptr) {
    observer_->Events(r.session_id(), r.events());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::OomResponse> DaemonCore::ReportOom(
    const PeerCredentials& peer, const v1::OomReport& r) {
  absl::StatusOr<std::shared_ptr<Session>> found =
      OwnedSession(peer, r.session_id());
  if (!found.ok()) return found.status();
  if (r.message().size() > kMaxOomMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OOM message is ", r.message().size(), " bytes; at most ",
        kMaxOomMessage));
  }
  Session& session = **found;
  session.CountOom();
  metrics_->Oom(session.id());
  if (observer_ != nullptr) observer_->Oom(session.id(), r.config_version());
  v1::OomResponse response;
  // Only an OOM the config caused is a reason to take the config back: not
  // one that followed a refusal of the node pool or a quota, which any
  // config would have met.
  if (session.TakeAcquireRefused()) return response;
  const AppliedConfig current = session.Current();
  std::optional<AppliedConfig> target = session.RollBackTarget();
  if (!target.has_value()) return response;
  session.StartRollBack();
  PushRollBack(session,
               {.version = target->version,
                .job = session.identity().job,
                .config = target->config,
                .set_at = absl::Now(),
                .author = "rollback"},
               absl::StrCat("OOM (", FormatSize(r.requested_bytes()),
                            ") under pushed version ", current.version,
                            "; back to version ", target->version));
  response.set_rolled_back(true);
  return response;
}

absl::Status DaemonCore::AckConfig(const PeerCredentials& peer,
                                   const v1::ConfigAck& r) {
  absl::StatusOr<std::shared_ptr<Session>> found =
      OwnedSession(peer, r.session_id());
  if (!found.ok()) return found.status();
  Session& session = **found;
  std::string config;
  if (r.version() == 0) {
    config = session.identity().initial_config;
  } else if (std::optional<ConfigRecord> record =
                 configs_.Find(r.version())) {
    config = record->config;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("no config version ", r.version()));
  }
  if (r.error().size() > kMaxOomMessage) {
    return absl::InvalidArgumentError("NACK error text over 4096 bytes");
  }
  configs_.Record({.at = absl::Now(),
                   .event = r.applied() ? "ack" : "nack",
                   .version = r.version(),
                   .job = session.identity().job,
                   .config = config,
                   .session_id = session.id(),
                   .detail = r.error()});
  if (observer_ != nullptr) {
    observer_->Acked(session.id(), r.version(), r.applied(), r.error());
  }
  if (!r.applied()) {
    metrics_->ConfigPushResult("nack");
    return absl::OkStatus();
  }
  const bool was_rollback = session.rolling_back();
  session.Acked({.version = r.version(), .config = config});
  if (!was_rollback) metrics_->ConfigPushResult("ack");
  metrics_->ConfigPushed(session.id(), r.version());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::Watch(
    const PeerCredentials& peer, SessionId id) {
  return OwnedSession(peer, id);
}

absl::Status DaemonCore::Lease(const PeerCredentials& peer, SessionId id) {
  absl::StatusOr<std::shared_ptr<Session>> session = OwnedSession(peer, id);
  if (!session.ok()) return session.status();
  if ((*session)->leased()) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " already has a lease"));
  }
  (*session)->MarkLeased();
  return absl::OkStatus();
}

absl::StatusOr<AdoptOutcome> DaemonCore::DeclareChunks(
    const PeerCredentials& peer, SessionId id,
    std::vector<DeclaredChunk> chunks, bool last) {
  absl::StatusOr<std::shared_ptr<Session>> session = OwnedSession(peer, id);
  if (!session.ok()) return session.status();
  const size_t declared = chunks.size();
  // The session's own device: its chunks came from that GPU's pool.
  NodePool& pool = PoolOf(**session);
  absl::StatusOr<AdoptOutcome> outcome = pool.Adopt(id, std::move(chunks));
  if (!outcome.ok()) return outcome.status();
  {
    // A late declaration (after the capacity was fitted to the device)
    // holds memory that was not free then: the device gets it back when
    // it is released, so the fitted capacity grows by it.
    absl::MutexLock lock(&settle_mu_);
    auto ceiling = capacity_ceiling_.find((*session)->identity().node_device);
    if (ceiling != capacity_ceiling_.end() && outcome->adopted_bytes > 0) {
      pool.SetCapacity(std::min(ceiling->second,
                                pool.capacity() + outcome->adopted_bytes));
    }
  }
  const std::string who = absl::StrCat("session ", id, " (pid ", peer.pid,
                                       ", job \"", (*session)->identity().job,
                                       "\")");
  // Every refusal is logged, a few in full.
  constexpr size_t kRefusalsLogged = 8;
  for (size_t i = 0; i < outcome->refused.size() && i < kRefusalsLogged; ++i) {
    const auto& [chunk, why] = outcome->refused[i];
    LogError(absl::StrCat(who, " declared chunk ", chunk,
                          ", not adopted: ", why));
  }
  if (outcome->refused.size() > kRefusalsLogged) {
    LogError(absl::StrCat(who, ": ",
                          outcome->refused.size() - kRefusalsLogged,
                          " more declared chunks not adopted"));
  }
  if (declared > 0) {
    LogInfo(absl::StrCat(who, " re-declared ", declared, " chunk(s): ",
                         outcome->adopted.size(), " adopted (",
                         FormatSize(outcome->adopted_bytes), ")"));
  }
  if (last) {
    adoption_.Returned(peer.pid);
    SaveSessions();
    SettleAdoption();
  }
  PublishPool(**session);
  return outcome;
}

void DaemonCore::SaveSessions() {
  if (options_.sessions_file.empty() || shutting_down_) return;
  // One writer at a time, each with the state as it is then: the last
  // write is the newest.
  absl::MutexLock lock(&sessions_file_mu_);
  SessionsByPid sessions;
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    ++sessions[s->identity().pid];
  }
  // A process that has not finished declaring counts as it did before.
  for (const auto& [pid, awaited] : adoption_.pending()) {
    int& count = sessions[pid];
    count = std::max(count, awaited);
  }
  if (absl::Status s = WriteSessionsFile(options_.sessions_file, sessions);
      !s.ok()) {
    LogError(absl::StrCat("the sessions file (for the next daemon after a "
                          "restart): ", s.message()));
  }
}

absl::Status DaemonCore::Claim(const PeerCredentials& peer,
                               absl::string_view token, size_t batch_size,
                               NodePool::ClaimSink sink) {
  // Tokens are unique across pools (128 random bits): the one pool that
  // knows it answers; the others say NotFound.
  absl::Status status = absl::NotFoundError("no devices");
  for (const DevicePool& device : pools_->devices()) {
    status = device.pool->Claim(token, peer.pid, batch_size, sink);
    if (!absl::IsNotFound(status)) return status;
  }
  return status;
}

void DaemonCore::EndSession(SessionId id, absl::string_view why) {
  // Kept before the registry forgets the session: the job's next session
  // may register the moment it is gone.
  if (std::shared_ptr<Session> ending = sessions_.Find(id)) {
    RememberWorkingSet(*ending);
  }
  std::shared_ptr<Session> session = sessions_.Remove(id);
  if (session == nullptr) return;
  session->Close();
  if (observer_ != nullptr) observer_->SessionEnded(id);
  const uint64_t held = PoolOf(*session).EndSession(id);
  SaveSessions();
  metrics_->SessionEnded(id);
  SignalReleased();
  PublishPool(*session);
  LogInfo(absl::StrCat("session ", id, " (pid ", session->identity().pid,
                       ", job \"", session->identity().job, "\") ended: ",
                       why, "; ", FormatSize(held), " back to the pool"));
}

absl::Status DaemonCore::ValidateWorkingSet(const v1::WorkingSet& set,
                                            uint64_t chunk_bytes) const {
  if (static_cast<size_t>(set.segment_bytes_size()) > kMaxWorkingSetSegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("the working set holds ", set.segment_bytes_size(),
                     " segments; at most ", kMaxWorkingSetSegments));
  }
  for (uint64_t bytes : set.segment_bytes()) {
    if (bytes == 0 || bytes % chunk_bytes != 0 ||
        bytes > options_.max_acquire_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a working set's segment of ", bytes,
          " bytes: each must be a multiple of ", FormatSize(chunk_bytes),
          " up to ", FormatSize(options_.max_acquire_bytes)));
    }
  }
  return absl::OkStatus();
}

void DaemonCore::RememberWorkingSet(const Session& ended) {
  const SessionIdentity& who = ended.identity();
  std::vector<uint64_t> segments = ended.WorkingSet();
  // A job without a label has no next session to recognise.
  if (who.job.empty() || segments.empty()) return;
  absl::MutexLock lock(&working_sets_mu_);
  working_sets_[{who.job, who.node_device}] = std::move(segments);
}

std::vector<uint64_t> DaemonCore::LastWorkingSet(const std::string& job,
                                                 int node_device) const {
  if (job.empty()) return {};
  absl::MutexLock lock(&working_sets_mu_);
  auto it = working_sets_.find({job, node_device});
  return it == working_sets_.end() ? std::vector<uint64_t>{} : it->second;
}

void DaemonCore::ExpireUnleased(absl::Time now) {
  if (adoption_.open()) {
    adoption_.Tick(now);
    if (!adoption_.open()) {
      SaveSessions();
      SettleAdoption();
    }
  }
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    if (!s->leased() &&
        now - s->identity().registered_at > options_.lease_grace) {
      EndSession(s->id(), "no lease within the grace period");
    }
  }
}

uint64_t DaemonCore::TrimIdle() {
  uint64_t total = 0;
  for (const DevicePool& device : pools_->devices()) {
    const uint64_t trimmed = device.pool->TrimIdle(options_.trim);
    if (trimmed == 0) continue;
    LogInfo(absl::StrCat("trimmed ", FormatSize(trimmed),
                         " of cached chunks back to device ", device.index,
                         " (", device.uuid, ")"));
    PublishPool(device);
    total += trimmed;
  }
  return total;
}

absl::StatusOr<v1::TrimPoolResponse> DaemonCore::TrimPool(
    absl::string_view device) {
  std::vector<const DevicePool*> targets;
  if (device.empty()) {
    for (const DevicePool& d : pools_->devices()) targets.push_back(&d);
  } else {
    absl::StatusOr<const DevicePool*> found = pools_->ForAdmin(device);
    if (!found.ok()) return found.status();
    targets.push_back(*found);
  }
  uint64_t trimmed = 0;
  for (const DevicePool* d : targets) {
    trimmed += d->pool->TrimFree(UINT64_MAX);
    PublishPool(*d);
  }
  v1::TrimPoolResponse response;
  response.set_trimmed_bytes(trimmed);
  return response;
}

void DaemonCore::SetUidQuota(uid_t uid, std::optional<uint64_t> bytes) {
  for (const DevicePool& device : pools_->devices()) {
    device.pool->SetUidQuota(uid, bytes);
  }
}

void DaemonCore::EndAll() {
  shutting_down_ = true;
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    EndSession(s->id(), "daemon shutting down");
  }
}

void DaemonCore::Push(Session& session, const ConfigRecord& record,
                      bool rollback, std::string reason) {
  v1::ControlMessage message;
  v1::ConfigPush* push = message.mutable_config();
  Fill(record, push->mutable_config());
  push->set_rollback(rollback);
  push->set_reason(std::move(reason));
  session.Push(std::move(message));
}

void DaemonCore::PushRollBack(Session& session, const ConfigRecord& target,
                              std::string reason) {
  configs_.Record({.at = absl::Now(),
                   .event = "rollback",
                   .version = target.version,
                   .job = session.identity().job,
                   .config = target.config,
                   .session_id = session.id(),
                   .detail = reason});
  metrics_->ConfigPushResult("rollback");
  Push(session, target, true, std::move(reason));
}

void DaemonCore::PublishPool(const Session& session) {
  PublishPool(pools_->at(session.identity().node_device));
}

void DaemonCore::PublishPool(const DevicePool& device) {
  const PoolStats stats = device.pool->Stats();
  metrics_->Pool(device.index, device.uuid,
                 {.capacity = stats.capacity,
                  .in_use = stats.in_use_bytes,
                  .free = stats.free_bytes,
                  .chunks_created_total = stats.chunks_created_total,
                  .chunks_reused_total = stats.chunks_reused_total,
                  .chunks_client_made_total = stats.chunks_client_made_total,
                  .trimmed_bytes_total = stats.trimmed_bytes_total,
                  .adopted_bytes_total = stats.adopted_bytes_total});
  for (const auto& [id, held] : stats.sessions) {
    metrics_->Held(id, held.bytes);
  }
}

// ------------------------------------------------------------------ admin

absl::Status DaemonCore::CheckAdmin(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == geteuid()) return absl::OkStatus();
  if (std::find(options_.admin_uids.begin(), options_.admin_uids.end(),
                peer.uid) != options_.admin_uids.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", peer.uid,
      " may not administer allocd (root, the daemon's uid, or --admin-uid)"));
}

v1::StatusResponse DaemonCore::Status() const {
  v1::StatusResponse r;
  r.set_backend(options_.backend);
  r.set_chunk_bytes(pools_->at(0).pool->chunk_bytes());
  for (uint64_t size : pools_->at(0).pool->chunk_classes()) r.add_chunk_classes(size);
  for (const DevicePool& device : pools_->devices()) {
    const PoolStats stats = device.pool->Stats();
    v1::DeviceStatus* d = r.add_devices();
    d->set_node_device(device.index);
    d->set_gpu_uuid(device.uuid);
    d->set_name(device.name);
    d->set_capacity_bytes(stats.capacity);
    d->set_chunk_bytes(stats.chunk_bytes);
    d->set_in_use_bytes(stats.in_use_bytes);
    d->set_free_bytes(stats.free_bytes);
    d->set_chunks_created_total(stats.chunks_created_total);
    d->set_chunks_reused_total(stats.chunks_reused_total);
    d->set_chunks_client_made_total(stats.chunks_client_made_total);
    d->set_trimmed_bytes_total(stats.trimmed_bytes_total);
    d->set_sessions(static_cast<uint32_t>(stats.sessions.size()));
    d->set_adopted_bytes_total(stats.adopted_bytes_total);
    r.set_capacity_bytes(r.capacity_bytes() + stats.capacity);
    r.set_in_use_bytes(r.in_use_bytes() + stats.in_use_bytes);
    r.set_free_bytes(r.free_bytes() + stats.free_bytes);
    r.set_chunks_created_total(r.chunks_created_total() +
                               stats.chunks_created_total);
    r.set_chunks_reused_total(r.chunks_reused_total() +
                              stats.chunks_reused_total);
    r.set_chunks_client_made_total(r.chunks_client_made_total() +
                                   stats.chunks_client_made_total);
    r.set_trimmed_bytes_total(r.trimmed_bytes_total() +
                              stats.trimmed_bytes_total);
    r.set_adopted_bytes_total(r.adopted_bytes_total() +
                              stats.adopted_bytes_total);
  }
  r.set_adopting(adoption_.open());
  r.set_sessions(static_cast<uint32_t>(sessions_.size()));
  r.set_version(ALLOCD_VERSION);
  r.set_started_unix_micros(UnixMicros(started_));
  return r;
}

v1::ListSessionsResponse DaemonCore::ListSessions() const {
  std::vector<PoolStats> pools;
  for (const DevicePool& device : pools_->devices()) {
    pools.push_back(device.pool->Stats());
  }
  v1::ListSessionsResponse r;
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    const SessionIdentity& id = s->identity();
    v1::SessionInfo* info = r.add_sessions();
    info->set_session_id(id.id);
    info->set_pid(id.pid);
    info->set_uid(id.uid);
    info->set_job(id.job);
    info->set_device(id.device);
    info->set_gpu_uuid(id.gpu_uuid);
    info->set_node_device(id.node_device);
    info->set_client(id.client);
    info->set_registered_unix_micros(UnixMicros(id.registered_at));
    const PoolStats& stats = pools[id.node_device];
    if (auto held = stats.sessions.find(id.id); held != stats.sessions.end()) {
      info->set_held_bytes(held->second.bytes);
      if (held->second.quota.has_value()) {
        info->set_quota_bytes(*held->second.quota);
      }
    }
    const AppliedConfig current = s->Current();
    info->set_config_version(current.version);
    info->set_config(current.config);
    for (const auto& [k, v] : s->Stats()) (*info->mutable_stats())[k] = v;
    info->set_ooms(s->ooms());
  }
  return r;
}

v1::GetConfigResponse DaemonCore::GetConfig(absl::string_view job) const {
  v1::GetConfigResponse r;
  if (std::optional<ConfigRecord> record = configs_.Effective(job)) {
    Fill(*record, r.mutable_config());
  }
  return r;
}

absl::StatusOr<v1::SetConfigResponse> DaemonCore::SetConfig(
    absl::string_view job, absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes, bool skip_running) {
  absl::MutexLock fanout(&fanout_mu_);
  absl::StatusOr<ConfigRecord> record =
      configs_.Set(job, config, author, predicted_peak_reserved_bytes);
  if (!record.ok()) return record.status();
  metrics_->ConfigPrediction(job, predicted_peak_reserved_bytes);
  v1::SetConfigResponse r;
  Fill(*record, r.mutable_config());
  uint32_t pushed = 0;
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    const std::string& session_job = s->identity().job;
    const bool applies = job.empty() ? !configs_.HasOwnConfig(session_job)
                                     : session_job == job;
    if (!applies) continue;
    if (skip_running && s->Current().config == record->config) continue;
    Push(*s, *record, false, absl::StrCat("set by ", author));
    ++pushed;
  }
  r.set_pushed_to(pushed);
  return r;
}

absl::StatusOr<uint64_t> DaemonCore::PushToSession(
    SessionId id, absl::string_view config, absl::string_view author,
    std::string reason, uint64_t predicted_peak_reserved_bytes) {
  std::shared_ptr<Session> session = sessions_.Find(id);
  if (session == nullptr) return absl::NotFoundError(absl::StrCat("no session ", id));
  absl::StatusOr<ConfigRecord> record =
      configs_.AddVersion(session->identity().job, config, author, "push",
                          predicted_peak_reserved_bytes);
  if (!record.ok()) return record.status();
  Push(*session, *record, false, std::move(reason));
  return record->version;
}

absl::Status DaemonCore::RollBackSession(SessionId id,
                                         absl::string_view config,
                                         std::string reason) {
  std::shared_ptr<Session> session = sessions_.Find(id);
  if (session == nullptr) return absl::NotFoundError(absl::StrCat("no session ", id));
  // An OOM rolled it back already: once is enough.
  if (session->rolling_back()) return absl::OkStatus();
  const std::string canonical = Canonical(config);
  ConfigRecord target{.job = session->identity().job,
                      .config = canonical,
                      .set_at = absl::Now(),
                      .author = "rollback"};
  if (std::optional<AppliedConfig> back = session->RollBackTarget();
      back.has_value() && back->config == canonical) {
    target.version = back->version;
  } else {
    absl::StatusOr<ConfigRecord> added = configs_.AddVersion(
        target.job, canonical, "autotune rollback", "push");
    if (!added.ok()) return added.status();
    target.version = added->version;
  }
  session->StartRollBack();
  PushRollBack(*session, target, std::move(reason));
  return absl::OkStatus();
}

void DaemonCore::ClearConfig(absl::string_view job, absl::string_view author) {
  absl::MutexLock fanout(&fanout_mu_);
  if (!configs_.Clear(job, author)) return;
  metrics_->ConfigPrediction(job, 0);
  if (job.empty()) return;
  std::optional<ConfigRecord> fallback = configs_.Effective(job);
  if (!fallback.has_value()) return;
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    if (s->identity().job == job) {
      Push(*s, *fallback, false,
           absl::StrCat("job config removed by ", author, "; the default"));
    }
  }
}

absl::Status DaemonCore::SetQuota(const v1::SetQuotaRequest& r) {
  std::optional<size_t> bytes;
  if (r.has_bytes()) bytes = r.bytes();
  switch (r.target_case()) {
    case v1::SetQuotaRequest::kSessionId: {
      std::shared_ptr<Session> session = sessions_.Find(r.session_id());
      if (session == nullptr) {
        return absl::NotFoundError(
            absl::StrCat("no session ", r.session_id()));
      }
      PoolOf(*session).SetSessionQuota(r.session_id(), bytes);
      return absl::OkStatus();
    }
    case v1::SetQuotaRequest::kUid:
      SetUidQuota(r.uid(), bytes);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "a quota names a session_id or a uid");
  }
}

v1::HistoryResponse DaemonCore::History(absl::string_view job,
                                        uint32_t limit) const {
  v1::HistoryResponse r;
  for (const HistoryRecord& h :
       configs_.History(job, limit == 0 ? 100 : std::min(limit, 10000u))) {
    v1::HistoryEntry* e = r.add_entries();
    e->set_unix_micros(UnixMicros(h.at));
    e->set_event(h.event);
    e->set_version(h.version);
    e->set_job(h.job);
    e->set_config(h.config);
    e->set_session_id(h.session_id);
    e->set_detail(h.detail);
  }
  return r;
}

}  // namespace allocd
