#include "server/daemon_core.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"
#include "server/log.h"
#include "server/pool_metrics.h"
#include "server/request_limits.h"

namespace allocd {
namespace {

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
  PublishPools();
}

DaemonCore::DaemonCore(DaemonCoreOptions options, NodePool* pool,
                       Metrics* metrics)
    : options_(std::move(options)),
      owned_pools_(OneDevice(pool, options_.backend)),
      pools_(owned_pools_.get()),
      metrics_(metrics) {
  PublishPools();
}

NodePool& DaemonCore::PoolOf(const Session& session) const {
  return *pools_->at(session.identity().node_device).pool;
}

void DaemonCore::PublishPools() {
  for (const DevicePool& device : pools_->devices()) {
    PublishPool(device, *metrics_);
  }
}

void DaemonCore::PublishPoolOf(const Session& session) {
  PublishPool(pools_->at(session.identity().node_device), *metrics_);
}

void DaemonCore::Released(const Session& session) {
  reclaimer_.SignalReleased();
  PublishPoolOf(session);
}

absl::StatusOr<v1::RegisterResponse> DaemonCore::Register(
    const PeerCredentials& peer, const v1::RegisterRequest& r) {
  if (absl::Status s = CheckRegisterRequest(r); !s.ok()) return s;
  absl::StatusOr<const DevicePool*> found = pools_->ForClient(r.gpu_uuid());
  if (!found.ok()) return found.status();
  const DevicePool& device = **found;
  if (absl::Status s = CheckClientDescription(r.client()); !s.ok()) return s;
  absl::StatusOr<std::string> initial =
      CanonicalClientConfig("initial_config", r.initial_config());
  if (!initial.ok()) return initial.status();
  std::string current_config;
  if (r.current_config_version() != 0 || r.started_on_learned()) {
    absl::StatusOr<std::string> current =
        CanonicalClientConfig("current_config", r.current_config());
    if (!current.ok()) return current.status();
    current_config = *std::move(current);
  }
  absl::StatusOr<TenantId> tenant = access_.TenantOf(peer);
  if (!tenant.ok()) return tenant.status();
  absl::ReleasableMutexLock fanout(&config_pusher_.fanout_mu());
  std::shared_ptr<Session> session = sessions_.Create(
      {.pid = peer.pid,
       .uid = peer.uid,
       .tenant = *tenant,
       .job = r.job(),
       .device = r.device(),
       .node_device = device.index,
       .gpu_uuid = device.uuid,
       .client = r.client(),
       .initial_config = *std::move(initial),
       .registered_at = absl::Now(),
       .rank = {.run = r.rank().run_id(),
                .rank = r.rank().rank(),
                .world_size = r.rank().world_size()}});
  if (absl::Status s = session_limits_.Admit(
          session->id(), *tenant,
          absl::StrCat("pid ", peer.pid, ", uid ", peer.uid));
      !s.ok()) {
    sessions_.Remove(session->id());
    return s;
  }
  if (absl::Status s =
          device.pool->AddSession(session->id(), peer.uid, peer.pid, *tenant);
      !s.ok()) {
    session_limits_.Ended(session->id());
    sessions_.Remove(session->id());
    return s;
  }
  const std::optional<ConfigPusher::Learned> start =
      observer_ != nullptr ? observer_->LearnedConfigFor(session->identity(), r.autotune(),
                                                             r.features())
                           : std::nullopt;
  const ConfigPusher::AtRegistration config = config_pusher_.Register(
      *session, current_config, r.current_config_version(), start,
      r.started_on_learned());
  fanout.Release();
  adoption_.SaveSessions();
  metrics_->SessionStarted(session->id(), r.job(), device.index, device.uuid,
                           peer.pid);
  const std::vector<uint64_t> working_set =
      working_sets_.Last(*tenant, r.job(), device.index);
  const uint64_t handed_bytes =
      std::accumulate(working_set.begin(), working_set.end(), uint64_t{0});
  LogInfo(absl::StrCat(
      "session ", session->id(), " registered: pid ", peer.pid, ", uid ",
      peer.uid, ", tenant ", *tenant, ", job \"", r.job(), "\", device ", device.index, " (",
      device.uuid, ", the client's ", r.device(), "), ", r.client(),
      working_set.empty()
          ? ""
          : absl::StrCat("; handed its job's last working set: ",
                         working_set.size(), " segments, ",
                         FormatSize(handed_bytes))));

  v1::RegisterResponse response;
  response.set_session_id(session->id());
  response.set_session_secret(session->secret());
  response.set_chunk_bytes(device.pool->chunk_bytes());
  response.set_fd_socket(options_.fd_socket);
  response.set_backend(options_.backend);
  response.set_capacity_bytes(device.pool->capacity());
  response.set_gpu_uuid(device.uuid);
  response.set_node_device(device.index);
  response.set_current_config_version(config.running.version);
  response.set_declare_fds(device.pool->proves_chunks());
  response.set_adopts_chunks(true);
  response.set_lease_acquires(true);
  if (config.learned.has_value() && start.has_value()) {
    session->SetStartConfigSource(start->source);
    response.set_stream_from_reserved(start->stream_from_reserved);
  }
  response.set_start_config_source(session->start_config_source());
  for (uint64_t bytes : working_set) {
    response.mutable_working_set()->add_segment_bytes(bytes);
  }
  if (config.config.has_value()) {
    FillConfigVersion(*config.config, response.mutable_config());
  }
  if (observer_ != nullptr) {
    std::optional<AppliedConfig> pushed;
    if (config.config.has_value() &&
        config.config->config != config.running.config) {
      pushed = AppliedConfig{.version = config.config->version,
                             .config = config.config->config};
    }
    observer_->SessionStarted(session->identity(), config.running,
                              config.learned, pushed, r.autotune());
    if (r.has_features()) observer_->Features(session->id(), r.features());
    // A learned start's own threshold stands, unless another session's
    // stream is the one read.
    const uint64_t read_from = observer_->StreamReadFrom(session->id());
    if (read_from == kStreamNotRead ||
        (read_from != 0 && response.stream_from_reserved() == 0)) {
      response.set_stream_from_reserved(read_from);
    }
  }
  return response;
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
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckAcquireBytes(r.bytes(), options_.max_acquire_bytes);
      !s.ok()) {
    return s;
  }
  // Memory a client asks for ahead of need never makes others give back.
  if (r.read_ahead()) may_wait = false;
  // After a restart: not before the surviving sessions' chunks are counted.
  if (!may_wait && adoption_.open()) return std::nullopt;
  adoption_.Await();
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
    Granted(**session, *grant);
    PublishPoolOf(**session);
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
    reclaimer_.Reclaim(**session, pool, *ShortfallBytes(grant.status()));
    grant = acquire();
  }
  (*session)->EndAcquire();
  if (absl::IsResourceExhausted(grant.status()) && !r.prewarm()) {
    (*session)->NoteAcquireRefused();
  }
  PublishPoolOf(**session);
  if (!grant.ok()) return grant.status();
  Granted(**session, *grant);
  return ResponseOf(*grant);
}

void DaemonCore::Granted(const Session& session, const Grant& grant) {
  adoption_.Granted(session.identity().tenant,
                    pools_->at(session.identity().node_device),
                    grant.chunk_ids, grant.chunk_sizes);
}

uint64_t DaemonCore::AbandonGrant(absl::string_view claim_token,
                                  absl::string_view why) {
  for (const DevicePool& device : pools_->devices()) {
    const uint64_t returned = device.pool->Abandon(claim_token);
    if (returned == 0) continue;
    LogInfo(absl::StrCat("an unclaimed grant of ", FormatSize(returned),
                         " went back to the pool of device ", device.index,
                         ": ", why));
    reclaimer_.SignalReleased();
    PublishPool(device, *metrics_);
    return returned;
  }
  return 0;
}

absl::StatusOr<v1::ReleaseChunksResponse> DaemonCore::ReleaseChunks(
    const PeerCredentials& peer, const v1::ReleaseChunksRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckReleaseIds(r.chunk_ids_size()); !s.ok()) return s;
  std::vector<uint64_t> ids(r.chunk_ids().begin(), r.chunk_ids().end());
  NodePool& pool = PoolOf(**session);
  const uint64_t before = pool.Stats().in_use_bytes;
  if (absl::Status s = pool.Release(r.session_id(), ids); !s.ok()) return s;
  const uint64_t after = pool.Stats().in_use_bytes;
  Released(**session);
  v1::ReleaseChunksResponse response;
  response.set_released_bytes(before > after ? before - after : 0);
  return response;
}

absl::Status DaemonCore::GiveMemory(const PeerCredentials& peer, SessionId id,
                                    absl::string_view secret,
                                    absl::Span<const uint64_t> chunk_ids,
                                    std::vector<UniqueFd> fds) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, id, secret);
  if (!session.ok()) return session.status();
  return PoolOf(**session).GiveMemory(id, chunk_ids, std::move(fds));
}

absl::StatusOr<v1::ShareChunksResponse> DaemonCore::ShareChunks(
    const PeerCredentials& peer, const v1::ShareChunksRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckShareIds(r.chunk_ids_size()); !s.ok()) return s;
  std::vector<uint64_t> ids(r.chunk_ids().begin(), r.chunk_ids().end());
  absl::StatusOr<std::string> token =
      PoolOf(**session).Share(r.session_id(), ids);
  if (!token.ok()) return token.status();
  v1::ShareChunksResponse response;
  response.set_share_token(*std::move(token));
  return response;
}

absl::StatusOr<v1::AcquireChunksResponse> DaemonCore::OpenShare(
    const PeerCredentials& peer, const v1::OpenShareRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  // Shares stay on their GPU: the token is only known to the pool of the
  // session that made it.
  absl::StatusOr<Grant> grant =
      PoolOf(**session).OpenShare(r.session_id(), r.share_token());
  if (!grant.ok()) return grant.status();
  return ResponseOf(*grant);
}

absl::StatusOr<v1::CloseShareResponse> DaemonCore::CloseShare(
    const PeerCredentials& peer, const v1::CloseShareRequest& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  if (absl::Status s =
          PoolOf(**session).CloseShare(r.session_id(), r.share_token());
      !s.ok()) {
    return s;
  }
  // Chunks may have gone back to the cache: an Acquire may be waiting.
  Released(**session);
  return v1::CloseShareResponse();
}

absl::Status DaemonCore::Telemetry(const PeerCredentials& peer,
                                   const v1::TelemetryReport& r) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckTelemetry(r); !s.ok()) return s;
  if (r.has_working_set()) {
    absl::Status kept = working_sets_.Report(
        **session, r.working_set(), PoolOf(**session).chunk_bytes());
    if (!kept.ok()) return kept;
  }
  if (r.has_features() && observer_ != nullptr) {
    observer_->Features(r.session_id(), r.features());
  }
  // A report of events or features alone leaves the stats as they were.
  if (r.stats_size() > 0 || (!r.has_events() && !r.has_features())) {
    std::map<std::string, int64_t> stats(r.stats().begin(), r.stats().end());
    metrics_->Telemetry(r.session_id(), stats, r.config_version());
    if (observer_ != nullptr) {
      observer_->Stats(r.session_id(), stats, r.config_version());
    }
    (*session)->SetStats(std::move(stats));
    // A Reclaim may wait for what this session caches.
    reclaimer_.SignalReleased();
  }
  if (r.has_events() && observer_ != nullptr) {
    observer_->Events(r.session_id(), r.events());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::LearnedConfigResponse> DaemonCore::LearnedConfig(
    const PeerCredentials& peer, const v1::LearnedConfigRequest& r) {
  if (absl::Status s = ValidateJobLabel(r.job()); !s.ok()) return s;
  absl::StatusOr<TenantId> tenant = access_.TenantOf(peer);
  if (!tenant.ok()) return tenant.status();
  v1::LearnedConfigResponse response;
  // As Register hands it: under the fan-out lock, never over the job's own.
  absl::MutexLock fanout(&config_pusher_.fanout_mu());
  if (observer_ == nullptr || config_pusher_.HasOwnConfig(r.job(), *tenant)) {
    return response;
  }
  absl::StatusOr<std::string> start =
      CanonicalClientConfig("start_config", r.start_config());
  if (!start.ok()) return start.status();
  std::optional<ConfigPusher::Learned> learned = observer_->LearnedConfigFor(
      {.uid = peer.uid, .tenant = *tenant, .job = r.job(), .initial_config = *start},
      v1::AutotunePreferences(), r.features());
  if (learned.has_value()) {
    response.set_config(learned->config);
    response.set_author(learned->author);
    response.set_source(learned->source);
  }
  return response;
}

absl::StatusOr<v1::OomResponse> DaemonCore::ReportOom(
    const PeerCredentials& peer, const v1::OomReport& r) {
  absl::StatusOr<std::shared_ptr<Session>> found =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!found.ok()) return found.status();
  if (absl::Status s = CheckOomMessage(r.message()); !s.ok()) return s;
  Session& session = **found;
  session.CountOom();
  metrics_->Oom(session.id());
  if (observer_ != nullptr) observer_->Oom(session.id(), r.config_version());
  v1::OomResponse response;
  response.set_rolled_back(
      config_pusher_.RollBackAfterOom(session, r.requested_bytes()));
  return response;
}

absl::Status DaemonCore::AckConfig(const PeerCredentials& peer,
                                   const v1::ConfigAck& r) {
  absl::StatusOr<std::shared_ptr<Session>> found =
      access_.OwnedSession(peer, r.session_id(), r.session_secret());
  if (!found.ok()) return found.status();
  if (absl::Status s = config_pusher_.Ack(**found, r); !s.ok()) return s;
  if (observer_ != nullptr) {
    observer_->Acked((*found)->id(), r.version(), r.applied(), r.error());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> DaemonCore::Watch(
    const PeerCredentials& peer, SessionId id, absl::string_view secret) {
  return access_.OwnedSession(peer, id, secret);
}

absl::Status DaemonCore::Lease(const PeerCredentials& peer, SessionId id,
                               absl::string_view secret) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, id, secret);
  if (!session.ok()) return session.status();
  if ((*session)->leased()) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " already has a lease"));
  }
  (*session)->MarkLeased();
  session_limits_.Leased(id);
  return absl::OkStatus();
}

absl::StatusOr<AdoptOutcome> DaemonCore::DeclareChunks(
    const PeerCredentials& peer, SessionId id, absl::string_view secret,
    std::vector<DeclaredChunk> chunks, bool last) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      access_.OwnedSession(peer, id, secret);
  if (!session.ok()) return session.status();
  const size_t declared = chunks.size();
  // The session's own device: its chunks came from that GPU's pool.
  const DevicePool& device = pools_->at((*session)->identity().node_device);
  absl::StatusOr<AdoptOutcome> outcome = adoption_.Declare(
      (*session)->identity().tenant, device, std::move(chunks),
      [&](std::vector<DeclaredChunk> listed) {
        return device.pool->Adopt(id, std::move(listed));
      });
  if (!outcome.ok()) return outcome.status();
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
  if (last) adoption_.FinishedDeclaring(peer.pid);
  PublishPool(device, *metrics_);
  return outcome;
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
    working_sets_.Remember(*ending);
  }
  std::shared_ptr<Session> session = sessions_.Remove(id);
  if (session == nullptr) return;
  session_limits_.Ended(id);
  session->Close();
  if (observer_ != nullptr) observer_->SessionEnded(id);
  const uint64_t held = PoolOf(*session).EndSession(id);
  adoption_.SaveSessions();
  metrics_->SessionEnded(id);
  Released(*session);
  LogInfo(absl::StrCat("session ", id, " (pid ", session->identity().pid,
                       ", tenant ", session->identity().tenant, ", job \"",
                       session->identity().job, "\") ended: ",
                       why, "; ", FormatSize(held), " back to the pool"));
}

void DaemonCore::ExpireUnleased(absl::Time now) {
  adoption_.Tick(now);
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
    PublishPool(device, *metrics_);
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
    PublishPool(*d, *metrics_);
  }
  v1::TrimPoolResponse response;
  response.set_trimmed_bytes(trimmed);
  return response;
}

void DaemonCore::EndAll() {
  adoption_.ShutDown();
  for (const std::shared_ptr<Session>& s : sessions_.List()) {
    EndSession(s->id(), "daemon shutting down");
  }
}

// ------------------------------------------------------------------ admin

absl::Status DaemonCore::CheckAdmin(const PeerCredentials& peer) const {
  return access_.CheckAdmin(peer);
}

v1::StatusResponse DaemonCore::Status() const {
  v1::StatusResponse r;
  r.set_backend(options_.backend);
  r.set_chunk_bytes(pools_->at(0).pool->chunk_bytes());
  for (uint64_t size : pools_->at(0).pool->chunk_classes()) {
    r.add_chunk_classes(size);
  }
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
  r.set_started_unix_micros(absl::ToUnixMicros(started_));
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
    info->set_tenant(id.tenant);
    info->set_job(id.job);
    info->set_device(id.device);
    info->set_gpu_uuid(id.gpu_uuid);
    info->set_node_device(id.node_device);
    info->set_client(id.client);
    info->set_registered_unix_micros(absl::ToUnixMicros(id.registered_at));
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
    info->set_start_config_source(s->start_config_source());
    for (const auto& [k, v] : s->Stats()) (*info->mutable_stats())[k] = v;
    info->set_ooms(s->ooms());
  }
  return r;
}

v1::GetConfigResponse DaemonCore::GetConfig(absl::string_view job) const {
  return config_pusher_.Get(job);
}

absl::StatusOr<v1::SetConfigResponse> DaemonCore::SetConfig(
    absl::string_view job, absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes) {
  return config_pusher_.Set(job, config, author, predicted_peak_reserved_bytes);
}

std::optional<uint64_t> DaemonCore::DeviceRoom(SessionId id) const {
  std::shared_ptr<Session> session = sessions_.Find(id);
  if (session == nullptr) return std::nullopt;
  const PoolStats stats = PoolOf(*session).Stats();
  auto held = stats.sessions.find(id);
  if (held == stats.sessions.end() || held->second.bytes == 0) return std::nullopt;
  return stats.capacity - std::min(stats.capacity, stats.in_use_bytes);
}

absl::StatusOr<uint64_t> DaemonCore::PushToSession(
    SessionId id, absl::string_view config, absl::string_view author,
    std::string reason, uint64_t predicted_peak_reserved_bytes) {
  return config_pusher_.PushToSession(id, config, author, std::move(reason),
                                      predicted_peak_reserved_bytes);
}

absl::StatusOr<uint64_t> DaemonCore::PushToTenantJob(
    const TenantId& tenant, absl::string_view job, absl::string_view config,
    absl::string_view author, uint64_t predicted_peak_reserved_bytes) {
  return config_pusher_.PushToTenantJob(tenant, job, config, author,
                                        predicted_peak_reserved_bytes);
}

absl::StatusOr<uint64_t> DaemonCore::PushToSessions(
    absl::string_view job, const std::vector<SessionId>& sessions,
    absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes) {
  return config_pusher_.PushToSessions(job, sessions, config, author,
                                       predicted_peak_reserved_bytes);
}

bool DaemonCore::DemandStream(SessionId id, std::optional<absl::string_view> running,
                              uint64_t from_reserved, std::string reason) {
  return config_pusher_.DemandStream(id, running, from_reserved, std::move(reason));
}

absl::Status DaemonCore::RollBackSession(SessionId id,
                                         absl::string_view config,
                                         std::string reason) {
  return config_pusher_.RollBackSession(id, config, std::move(reason));
}

void DaemonCore::ClearConfig(absl::string_view job, absl::string_view author) {
  config_pusher_.Clear(job, author);
}

v1::HistoryResponse DaemonCore::History(absl::string_view job,
                                        uint32_t limit) const {
  return config_pusher_.History(job, limit);
}

absl::Status DaemonCore::SetQuota(const v1::SetQuotaRequest& r) {
  return quotas_.Set(r);
}

void DaemonCore::SetUidQuota(uid_t uid, std::optional<uint64_t> bytes) {
  quotas_.SetUid(uid, bytes);
}

void DaemonCore::SetTenantQuota(const TenantId& tenant,
                                std::optional<uint64_t> bytes) {
  quotas_.SetTenant(tenant, bytes);
}

}  // namespace allocd
