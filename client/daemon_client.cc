#include "client/daemon_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocd.grpc.pb.h"
#include "client/grant_read_ahead.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/protocol.h"

namespace allocd {
namespace {

// Events per telemetry message: ~16 bytes each packed, well inside the
// daemon's 1 MiB message limit.
constexpr size_t kMaxEventsPerReport = 16384;
// The descriptor table a client reserves when it connects (ReserveFdTable).
constexpr int kFdTableSlots = 4096;

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// The side socket that RegisterResponse names, as this process reaches it.
// The daemon names it by its own path, in its gRPC socket's directory; a
// client in another mount namespace (a container that mounts the socket
// directory elsewhere, the host outside the daemon's container) finds it
// under that name beside the socket it connected to, and uses the announced
// path only when there is nothing there.
std::string SideSocketPath(const std::string& client_socket,
                           const std::string& announced) {
  const size_t dir_end = client_socket.rfind('/');
  const size_t name_start = announced.rfind('/');
  if (dir_end == std::string::npos || name_start == std::string::npos) {
    return announced;
  }
  std::string beside =
      client_socket.substr(0, dir_end) + announced.substr(name_start);
  return access(beside.c_str(), F_OK) == 0 ? beside : announced;
}

// What a daemon said of the pool that serves a session (RegisterResponse).
struct PoolTerms {
  uint64_t chunk_bytes = 0;
  uint64_t capacity = 0;
  std::string gpu_uuid;
};

// One registered session over one connection to one daemon.
struct Connection {
  uint64_t epoch = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Allocd::Stub> stub;
  uint64_t session_id = 0;
  PoolTerms pool;
  // What this daemon calls the config the client declared as running.
  uint64_t running_version = 0;
  // Whether chunks declared to this daemon after a restart are proven with
  // their FDs, so the client keeps an FD of each chunk it holds.
  bool declare_fds = false;
  // Whether this daemon takes declarations at all.
  bool adopts_chunks = false;
  // Whether this daemon grants and takes back chunks on the lease.
  bool lease_acquires = false;
  // The job's last working set, as this daemon handed it over.
  std::vector<uint64_t> working_set;
  // The lease; claims travel over it, one at a time.
  absl::Mutex lease_mu;
  UniqueFd lease ABSL_GUARDED_BY(lease_mu);
};

// Sends `request` (with `send_fds` riding along) and gathers the answer,
// which may span several frames (a claim of more chunks than one frame
// carries FDs for).
absl::StatusOr<v1::SideResponse> SideCall(int fd,
                                          const v1::SideRequest& request,
                                          std::vector<UniqueFd>* fds,
                                          absl::Span<const int> send_fds = {}) {
  if (absl::Status s = SendMessage(fd, request.SerializeAsString(), send_fds);
      !s.ok()) {
    return s;
  }
  v1::SideResponse all;
  for (;;) {
    absl::StatusOr<ReceivedMessage> frame =
        ReceiveMessage(fd, kMaxSideMessageBytes, absl::Seconds(10));
    if (!frame.ok()) return frame.status();
    v1::SideResponse response;
    if (!response.ParseFromString(frame->payload)) {
      return absl::DataLossError("malformed answer on the side socket");
    }
    if (!response.error().empty()) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()),
                          response.error());
    }
    if (fds != nullptr) {
      for (UniqueFd& f : frame->fds) fds->push_back(std::move(f));
    }
    const bool more = response.more();
    all.MergeFrom(response);
    if (!more) break;
  }
  all.set_more(false);
  return all;
}

// A chunk the process holds, by the epoch it was granted in and its id.
using HeldKey = std::pair<uint64_t, uint64_t>;
struct HeldChunk {
  uint64_t bytes = 0;
  uint64_t offset = 0;
  // An FD of the chunk, to prove it to a restarted daemon (declare_fds);
  // invalid when that daemon takes ids and sizes alone.
  UniqueFd proof;
  // The epoch of the session that owns it in its daemon's books: the
  // granting one, then the one a restarted daemon adopted it into; 0 when
  // a restarted daemon refused it (it is nobody's to release).
  uint64_t owner_epoch = 0;
};

// A dup() of `fd`, raising RLIMIT_NOFILE once when this process runs out:
// a sim-mode client keeps an FD per chunk it holds.
UniqueFd DupProof(int fd) {
  static std::atomic<bool> raised{false};
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid() && errno == EMFILE && !raised.exchange(true) &&
      RaiseOpenFileLimit().ok()) {
    copy.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  }
  return copy;
}

// The chunks a claim's answer carries, with their FDs.
absl::StatusOr<ReceivedChunks> ChunksOfClaim(const Connection& c,
                                             const v1::SideResponse& answer,
                                             std::vector<UniqueFd> fds) {
  ReceivedChunks chunks{
      .epoch = c.epoch,
      .ids = {answer.chunk_ids().begin(), answer.chunk_ids().end()},
      .fds = std::move(fds),
      .offsets = {answer.offsets().begin(), answer.offsets().end()},
      .sizes = {answer.sizes().begin(), answer.sizes().end()},
      .reused = answer.reused_chunks()};
  if (chunks.sizes.empty()) {  // a daemon before sized chunks
    chunks.sizes.assign(chunks.ids.size(), c.pool.chunk_bytes);
  }
  if (chunks.fds.size() != chunks.ids.size() ||
      chunks.offsets.size() != chunks.ids.size() ||
      chunks.sizes.size() != chunks.ids.size() ||
      answer.client_made_sizes_size() != answer.client_made_ids_size()) {
    // Not DataLoss, which says the connection broke (Acquire asks again).
    return absl::InternalError(absl::StrCat(
        "daemon sent ", chunks.fds.size(), " FDs for ", chunks.ids.size(),
        " chunks, and ", answer.client_made_sizes_size(), " sizes for ",
        answer.client_made_ids_size(), " chunks to make"));
  }
  for (int i = 0; i < answer.client_made_ids_size(); ++i) {
    chunks.ids.push_back(answer.client_made_ids(i));
    chunks.fds.emplace_back();
    chunks.offsets.push_back(0);
    chunks.sizes.push_back(answer.client_made_sizes(i));
  }
  chunks.client_made = static_cast<uint32_t>(answer.client_made_ids_size());
  return chunks;
}

// A call on the lease of `c`, which carries one call at a time.
absl::StatusOr<v1::SideResponse> LeaseCall(Connection& c,
                                           const v1::SideRequest& request,
                                           std::vector<UniqueFd>* fds,
                                           absl::Span<const int> send_fds = {}) {
  absl::MutexLock lock(&c.lease_mu);
  return SideCall(c.lease.get(), request, fds, send_fds);
}

// Claims the FDs of a grant (an AcquireChunks or OpenShare answer) over the
// lease of `c`.
absl::StatusOr<ReceivedChunks> ClaimGrant(
    Connection& c, const v1::AcquireChunksResponse& response) {
  v1::SideRequest claim;
  claim.set_claim_token(response.claim_token());
  std::vector<UniqueFd> fds;
  absl::StatusOr<v1::SideResponse> answer = LeaseCall(c, claim, &fds);
  if (!answer.ok()) return answer.status();
  answer->set_reused_chunks(response.reused_chunks());
  *answer->mutable_client_made_ids() = response.client_made_ids();
  *answer->mutable_client_made_sizes() = response.client_made_sizes();
  return ChunksOfClaim(c, *answer, std::move(fds));
}

// A grant on the lease of `c` (lease_acquires), FDs included: nullopt when
// the daemon would have to wait for it (ask over gRPC), or, `read_ahead`
// (up to that many grants of `bytes`), when its cache holds too little or
// it would leave the pool less than as much again.
absl::StatusOr<std::optional<ReceivedChunks>> AcquireOnLease(
    Connection& c, uint64_t bytes, uint64_t max_chunk_bytes,
    uint32_t read_ahead, bool client_creates) {
  v1::SideRequest request;
  request.mutable_acquire()->set_client_creates(client_creates);
  request.mutable_acquire()->set_bytes(bytes);
  request.mutable_acquire()->set_max_chunk_bytes(max_chunk_bytes);
  request.mutable_acquire()->set_read_ahead(read_ahead > 0);
  request.mutable_acquire()->set_count(read_ahead);
  std::vector<UniqueFd> fds;
  absl::StatusOr<v1::SideResponse> answer = LeaseCall(c, request, &fds);
  if (!answer.ok()) return answer.status();
  if (answer->would_wait()) return std::nullopt;
  return ChunksOfClaim(c, *answer, std::move(fds));
}

// What the process runs, as it declares it when it registers.
struct RunningConfig {
  std::string config;
  uint64_t version = 0;
};

absl::StatusOr<std::shared_ptr<Connection>> Establish(
    const DaemonClientOptions& o, uint64_t epoch,
    const RunningConfig& running) {
  absl::StatusOr<UniqueFd> socket = ConnectUnix(o.socket);
  if (!socket.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "no allocd daemon at ", o.socket, ": ", socket.status().message()));
  }
  const int fd = socket->get();
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto c = std::make_shared<Connection>();
  c->epoch = epoch;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 22);
  c->channel = grpc::CreateCustomInsecureChannelFromFd("allocd", socket->release(), args);
  c->stub = v1::Allocd::NewStub(c->channel);

  grpc::ClientContext context;
  SetDeadline(context, o.rpc_timeout);
  v1::RegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_device(o.device);
  request.set_gpu_uuid(o.gpu_uuid);
  request.set_job(o.job);
  request.set_initial_config(o.initial_config);
  request.set_client(o.description);
  if (running.version != 0) {
    request.set_current_config(running.config);
    request.set_current_config_version(running.version);
  }
  *request.mutable_autotune() = o.autotune;
  v1::RegisterResponse response;
  if (grpc::Status s = c->stub->Register(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  c->session_id = response.session_id();
  c->pool = PoolTerms{response.chunk_bytes(), response.capacity_bytes(), response.gpu_uuid()};
  c->running_version = response.current_config_version();
  c->declare_fds = response.declare_fds();
  c->adopts_chunks = response.adopts_chunks();
  c->lease_acquires = response.lease_acquires();
  c->working_set.assign(response.working_set().segment_bytes().begin(),
                        response.working_set().segment_bytes().end());

  absl::StatusOr<UniqueFd> lease = ConnectUnix(SideSocketPath(o.socket, response.fd_socket()));
  if (!lease.ok()) return lease.status();
  v1::SideRequest lease_request;
  lease_request.set_lease_session_id(c->session_id);
  if (auto r = SideCall(lease->get(), lease_request, nullptr); !r.ok()) {
    return r.status();
  }
  absl::MutexLock lock(&c->lease_mu);
  c->lease = std::move(*lease);
  return c;
}

}  // namespace

absl::StatusOr<std::vector<ReceivedChunks>> SplitGrant(ReceivedChunks grant,
                                                       uint64_t each) {
  const size_t n = grant.ids.size();
  if (each == 0 || grant.fds.size() != n || grant.offsets.size() != n ||
      grant.sizes.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a grant of ", n, " chunks (", grant.fds.size(), " FDs, ",
        grant.offsets.size(), " offsets, ", grant.sizes.size(),
        " sizes) cannot be split into grants of ", each, " bytes"));
  }
  std::vector<ReceivedChunks> grants;
  uint32_t reused = grant.reused;
  const size_t first_made = n - std::min<size_t>(grant.client_made, n);
  uint64_t filled = 0;
  for (size_t i = 0; i < n; ++i) {
    if (filled == 0) grants.push_back(ReceivedChunks{.epoch = grant.epoch});
    ReceivedChunks& part = grants.back();
    part.ids.push_back(grant.ids[i]);
    part.fds.push_back(std::move(grant.fds[i]));
    part.offsets.push_back(grant.offsets[i]);
    part.sizes.push_back(grant.sizes[i]);
    if (i >= first_made) ++part.client_made;
    filled += grant.sizes[i];
    if (filled > each) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", grant.ids[i], " of ", grant.sizes[i],
          " bytes crosses the end of a grant of ", each, " bytes"));
    }
    if (filled == each) {
      filled = 0;
      const uint32_t counted =
          std::min<uint32_t>(reused, static_cast<uint32_t>(part.ids.size()));
      part.reused = counted;
      reused -= counted;
    }
  }
  if (filled != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a grant of ", grant.bytes(), " bytes is not whole grants of ", each,
        " bytes"));
  }
  return grants;
}

absl::StatusOr<v1::AutotunePreferences> ParseAutotunePreferences(
    absl::string_view json) {
  v1::AutotunePreferences out;
  if (json.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "autotune preferences must be a JSON object: {\"pinned_keys\": "
        "[...], \"allow_memory_fraction\": bool, \"mode\": \"off|recommend|"
        "apply\"}");
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "pinned_keys" && value.is_array()) {
      for (const nlohmann::json& k : value) {
        if (!k.is_string()) {
          return absl::InvalidArgumentError(
              "autotune pinned_keys must be strings, e.g. "
              "[\"expandable_segments\"]");
        }
        out.add_pinned_keys(k.get<std::string>());
      }
    } else if (key == "allow_memory_fraction" && value.is_boolean()) {
      out.set_allow_memory_fraction(value.get<bool>());
    } else if (key == "mode" && value.is_string() &&
               (value == "" || value == "off" || value == "recommend" ||
                value == "apply")) {
      out.set_mode(value.get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "autotune preference \"", key, "\" = ", value.dump(),
          " is not one of pinned_keys (list of config keys), "
          "allow_memory_fraction (bool), mode (off, recommend, apply)"));
    }
  }
  return out;
}

struct DaemonClient::State {
  explicit State(DaemonClientOptions o) : options(std::move(o)) {
    if (options.event_capacity > 0) {
      recorder = std::make_unique<EventRecorder>(options.event_capacity, [this] {
        absl::MutexLock lock(&mu);
        events_waiting = true;
      });
    }
  }

  // The live connection, or nullptr while the daemon is away.
  std::shared_ptr<Connection> Current() {
    absl::MutexLock lock(&mu);
    return connection;
  }

  // Waits until connected or `deadline`.
  std::shared_ptr<Connection> WaitConnected(absl::Time deadline) {
    absl::MutexLock lock(&mu);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
      return connection != nullptr || stopping;
    };
    mu.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return connection;
  }

  // The daemon stopped answering on `c`: drop it so the session thread
  // reconnects.
  void Lost(const std::shared_ptr<Connection>& c) {
    absl::MutexLock lock(&mu);
    if (connection != c) return;
    connection = nullptr;
    if (watch_context != nullptr) watch_context->TryCancel();
  }

  void SessionLoop();
  // What the read-ahead, and the working set handed over, hold now: sent
  // at once, as one stat (a reclaim counts it as cached).
  void SetReadAheadBytes(uint64_t bytes) {
    absl::MutexLock lock(&mu);
    read_ahead_bytes = static_cast<int64_t>(bytes);
    PublishAheadBytes();
  }
  void SetHandedOverBytes(uint64_t bytes) {
    absl::MutexLock lock(&mu);
    handed_over_bytes = static_cast<int64_t>(bytes);
    PublishAheadBytes();
  }
  void PublishAheadBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    WriteAheadBytes();
    ++stats_published;
    flush = true;
  }
  // Into the stats to send, as one stat (kReadAheadStat).
  void WriteAheadBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    (*stats.mutable_stats())[kReadAheadStat] =
        read_ahead_bytes + handed_over_bytes;
  }
  // After a reconnect, before `c` serves calls: re-declares every chunk the
  // process holds to the new daemon (SideRequest.declare) and records
  // which it adopted; those released meanwhile are released on `c`.
  void DeclareHeld(const std::shared_ptr<Connection>& c);
  // Whether the session of `c` owns every chunk of `ids` granted in
  // `epoch`: it granted them, or adopted them after a restart.
  bool OwnedBy(const Connection& c, uint64_t epoch,
               absl::Span<const uint64_t> ids);
  // The current connection when its session owns `ids` of `epoch`
  // (OwnedBy); else FailedPrecondition saying so, ending in `refused`: what
  // cannot be done with them.
  absl::StatusOr<std::shared_ptr<Connection>> Owner(
      uint64_t epoch, absl::Span<const uint64_t> ids,
      absl::string_view refused);
  // ReleaseChunks of `ids` on `c`, in batches.
  absl::Status ReleaseOn(const std::shared_ptr<Connection>& c,
                         absl::Span<const uint64_t> ids);
  void TelemetryLoop();
  // Writes `stats` (when not null) and `batches` on the telemetry stream;
  // false when the stream broke (unsent batches go back to the recorder
  // as a gap).
  bool SendTelemetry(grpc::ClientWriter<v1::TelemetryReport>& writer,
                     uint64_t session_id, v1::TelemetryReport* stats,
                     std::vector<RecordedBatch>& batches);

  // Serves calls on `c` from now on, as session `new_epoch`.
  void Serve(std::shared_ptr<Connection> c, uint64_t new_epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    terms = c->pool;
    connection = std::move(c);
    epoch = new_epoch;
    // A restarted daemon knows nothing of the working set yet.
    if (!working_set.segment_bytes().empty()) {
      working_set_unsent = true;
      ++stats_published;
    }
  }

  const DaemonClientOptions options;
  absl::Mutex mu;
  std::shared_ptr<Connection> connection ABSL_GUARDED_BY(mu);
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  // The last daemon's pool terms, kept while it is away: a cudaMalloc in
  // the gap rounds to its chunks and waits in Acquire for the next daemon
  // (chunk_bytes() 0 there was a division by zero, SIGFPE).
  PoolTerms terms ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* watch_context ABSL_GUARDED_BY(mu) = nullptr;
  grpc::ClientContext* telemetry_context ABSL_GUARDED_BY(mu) = nullptr;
  std::deque<v1::ControlMessage> control ABSL_GUARDED_BY(mu);
  v1::TelemetryReport stats ABSL_GUARDED_BY(mu);
  uint64_t stats_published ABSL_GUARDED_BY(mu) = 0;
  uint64_t stats_sent ABSL_GUARDED_BY(mu) = 0;
  bool flush ABSL_GUARDED_BY(mu) = false;
  // The recorder is half full: send before the period ends.
  bool events_waiting ABSL_GUARDED_BY(mu) = false;
  // Every chunk Acquire handed out and Release has not taken back.
  std::map<HeldKey, HeldChunk> held ABSL_GUARDED_BY(mu);
  // The epoch of the newest connection whose declaration began.
  uint64_t declared_epoch ABSL_GUARDED_BY(mu) = 0;
  RunningConfig running ABSL_GUARDED_BY(mu);
  // Bumped by every SetRunning, so a registration that declared an older
  // config does not overwrite a newer version.
  uint64_t running_generation ABSL_GUARDED_BY(mu) = 0;
  std::unique_ptr<EventRecorder> recorder;
  // Set before the threads start (options.read_ahead_keep).
  std::unique_ptr<GrantReadAhead> read_ahead;
  // What it holds now, sent with the stats at once (a reclaim counts it).
  int64_t read_ahead_bytes ABSL_GUARDED_BY(mu) = 0;
  // What the working set handed over holds and the process has not taken.
  int64_t handed_over_bytes ABSL_GUARDED_BY(mu) = 0;
  // The last PublishWorkingSet, and whether the daemon has it yet (it goes
  // with the next stats).
  v1::WorkingSet working_set ABSL_GUARDED_BY(mu);
  bool working_set_unsent ABSL_GUARDED_BY(mu) = false;
  // The first daemon's RegisterResponse.working_set.
  std::vector<uint64_t> handed_working_set;
  // Called on a reclaim request (OnReclaim); held while it runs.
  absl::Mutex reclaim_mu;
  std::function<void()> on_reclaim ABSL_GUARDED_BY(reclaim_mu);
  std::thread session_thread;
  std::thread telemetry_thread;
};

void DaemonClient::State::SessionLoop() {
  absl::Duration backoff = options.reconnect_min;
  for (;;) {
    std::shared_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      c = connection;
    }
    if (c == nullptr) {
      uint64_t next_epoch;
      RunningConfig declared;
      uint64_t generation;
      {
        absl::MutexLock lock(&mu);
        next_epoch = epoch + 1;
        declared = running;
        generation = running_generation;
      }
      absl::StatusOr<std::shared_ptr<Connection>> fresh =
          Establish(options, next_epoch, declared);
      // The new daemon owns what this process still holds before it hands
      // out anything (Acquire waits for the connection).
      if (fresh.ok()) DeclareHeld(*fresh);
      absl::MutexLock lock(&mu);
      if (stopping) return;
      if (fresh.ok()) {
        Serve(*fresh, next_epoch);
        if (generation == running_generation) {
          running.version = (*fresh)->running_version;
        }
        // What the lost daemon asked and the engine has not taken yet
        // names versions the new one does not know: it is not to be done.
        control.clear();
        backoff = options.reconnect_min;
      } else {
        auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
          return stopping;
        };
        mu.AwaitWithTimeout(absl::Condition(&stop), backoff);
        backoff = std::min(backoff * 2, options.reconnect_max);
      }
      continue;
    }
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      watch_context = &context;
    }
    v1::WatchConfigRequest request;
    request.set_session_id(c->session_id);
    std::unique_ptr<grpc::ClientReader<v1::ControlMessage>> reader =
        c->stub->WatchConfig(&context, request);
    v1::ControlMessage message;
    while (reader->Read(&message)) {
      // Memory read ahead is the first to go back: it is no segment's.
      if (message.has_reclaim()) {
        if (read_ahead != nullptr) read_ahead->Drop();
        absl::MutexLock hook(&reclaim_mu);
        if (on_reclaim) on_reclaim();
      }
      absl::MutexLock lock(&mu);
      control.push_back(std::move(message));
    }
    (void)reader->Finish();
    {
      absl::MutexLock lock(&mu);
      watch_context = nullptr;
    }
    // The stream ends only when the daemon or the session went away.
    Lost(c);
  }
}

void DaemonClient::State::DeclareHeld(const std::shared_ptr<Connection>& c) {
  std::vector<HeldKey> keys;
  {
    absl::MutexLock lock(&mu);
    // From here on, chunks an Acquire on an older connection claims are
    // not declared: that Acquire drops them and asks again.
    declared_epoch = c->epoch;
    if (!c->adopts_chunks) return;
    keys.reserve(held.size());
    for (const auto& [key, chunk] : held) keys.push_back(key);
  }
  std::vector<uint64_t> stale;  // adopted, but released meanwhile
  for (size_t begin = 0; begin == 0 || begin < keys.size();
       begin += kMaxFdsPerMessage) {
    const size_t end = std::min(keys.size(), begin + kMaxFdsPerMessage);
    v1::SideRequest request;
    v1::DeclareChunks* declare = request.mutable_declare();
    std::vector<UniqueFd> proofs;
    std::map<uint64_t, HeldKey> by_id;  // this frame's chunks
    {
      absl::MutexLock lock(&mu);
      for (size_t i = begin; i < end; ++i) {
        auto it = held.find(keys[i]);
        if (it == held.end() || !by_id.emplace(keys[i].second, keys[i]).second) {
          continue;  // released since, or an id twice (ids of two daemons)
        }
        if (c->declare_fds) {
          if (!it->second.proof.valid()) continue;  // nothing to prove it
          proofs.push_back(DupProof(it->second.proof.get()));
          if (!proofs.back().valid()) {
            proofs.pop_back();
            by_id.erase(keys[i].second);
            continue;
          }
        }
        declare->add_chunk_ids(keys[i].second);
        declare->add_sizes(it->second.bytes);
        declare->add_offsets(it->second.offset);
      }
    }
    declare->set_more(end < keys.size());
    std::vector<int> fds;
    for (const UniqueFd& fd : proofs) fds.push_back(fd.get());
    absl::StatusOr<v1::SideResponse> answer;
    {
      absl::MutexLock lock(&c->lease_mu);
      if (absl::Status sent =
              SendMessage(c->lease.get(), request.SerializeAsString(), fds);
          !sent.ok()) {
        return;  // the daemon went away again: the next one gets them
      }
      absl::StatusOr<ReceivedMessage> frame =
          ReceiveMessage(c->lease.get(), kMaxSideMessageBytes, absl::Seconds(10));
      if (!frame.ok()) return;
      v1::SideResponse response;
      if (!response.ParseFromString(frame->payload)) return;
      answer = std::move(response);
    }
    if (!answer->error().empty()) return;  // e.g. an old daemon: no adoption
    absl::MutexLock lock(&mu);
    for (uint64_t id : answer->adopted_chunk_ids()) {
      auto key = by_id.find(id);
      if (key == by_id.end()) continue;
      auto it = held.find(key->second);
      if (it == held.end()) {
        stale.push_back(id);
      } else {
        it->second.owner_epoch = c->epoch;
      }
    }
    for (uint64_t id : answer->refused_chunk_ids()) {
      auto key = by_id.find(id);
      if (key == by_id.end()) continue;
      if (auto it = held.find(key->second); it != held.end()) {
        it->second.owner_epoch = 0;
      }
    }
  }
  // `c` is not published yet: Release would not find it.
  if (!stale.empty()) (void)ReleaseOn(c, stale);
}

absl::StatusOr<std::shared_ptr<Connection>> DaemonClient::State::Owner(
    uint64_t epoch, absl::Span<const uint64_t> ids, absl::string_view refused) {
  std::shared_ptr<Connection> c = Current();
  if (c == nullptr || !OwnedBy(*c, epoch, ids)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "these chunks came from an allocd daemon this process is no longer "
        "connected to (and the daemon now did not adopt them): ",
        refused));
  }
  return c;
}

bool DaemonClient::State::OwnedBy(const Connection& c, uint64_t epoch,
                                  absl::Span<const uint64_t> ids) {
  absl::MutexLock lock(&mu);
  return std::all_of(ids.begin(), ids.end(), [&](uint64_t id) {
    mu.AssertHeld();
    auto it = held.find({epoch, id});
    // Not held (never recorded): its granting session's.
    return (it == held.end() ? epoch : it->second.owner_epoch) == c.epoch;
  });
}

absl::Status DaemonClient::State::ReleaseOn(
    const std::shared_ptr<Connection>& c, absl::Span<const uint64_t> ids) {
  for (size_t begin = 0; begin < ids.size(); begin += kMaxChunkIdsPerRequest) {
    const size_t end = std::min(ids.size(), begin + kMaxChunkIdsPerRequest);
    v1::ReleaseChunksRequest request;
    request.set_session_id(c->session_id);
    for (size_t i = begin; i < end; ++i) request.add_chunk_ids(ids[i]);
    absl::Status s;
    if (c->lease_acquires) {
      v1::SideRequest on_lease;
      *on_lease.mutable_release() = std::move(request);
      s = LeaseCall(*c, on_lease, nullptr).status();
      // A lease that broke (DataLoss) is a daemon gone, as Unavailable.
      if (absl::IsDataLoss(s)) s = absl::UnavailableError(s.message());
    } else {
      grpc::ClientContext context;
      SetDeadline(context, options.rpc_timeout);
      v1::ReleaseChunksResponse response;
      s = FromGrpc(c->stub->ReleaseChunks(&context, request, &response));
    }
    if (absl::IsUnavailable(s)) {
      Lost(c);
      return absl::OkStatus();  // the daemon takes them back when it ends
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

bool DaemonClient::State::SendTelemetry(
    grpc::ClientWriter<v1::TelemetryReport>& writer, uint64_t session_id,
    v1::TelemetryReport* stats, std::vector<RecordedBatch>& batches) {
  // The stats ride with the first message; events follow in messages of
  // at most kMaxEventsPerReport.
  v1::TelemetryReport report;
  if (stats != nullptr) report = std::move(*stats);
  report.set_session_id(session_id);
  bool pending = stats != nullptr;
  for (size_t b = 0; b < batches.size(); ++b) {
    const RecordedBatch& batch = batches[b];
    for (size_t begin = 0; begin < batch.events.size() || begin == 0;
         begin += kMaxEventsPerReport) {
      const size_t end =
          std::min(batch.events.size(), begin + kMaxEventsPerReport);
      v1::EventBatch* out = report.mutable_events();
      out->set_sequence(batch.sequence + begin);
      out->set_dropped(begin == 0 ? batch.dropped : 0);
      for (size_t i = begin; i < end; ++i) {
        const RecordedEvent& e = batch.events[i];
        out->add_ops(static_cast<uint32_t>(e.op));
        out->add_sizes(e.size);
        out->add_ids(e.id);
        out->add_streams(e.stream);
      }
      if (!writer.Write(report)) {
        // What did not reach the daemon is a gap before what comes next.
        std::vector<RecordedBatch> unsent(batches.begin() + b, batches.end());
        unsent.front().events.erase(unsent.front().events.begin(),
                                    unsent.front().events.begin() + begin);
        if (begin > 0) unsent.front().dropped = 0;
        recorder->Unsent(unsent);
        return false;
      }
      report.Clear();
      report.set_session_id(session_id);
      pending = false;
      if (end == batch.events.size()) break;
    }
  }
  return !pending || writer.Write(report);
}

void DaemonClient::State::TelemetryLoop() {
  std::shared_ptr<Connection> streaming;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientWriter<v1::TelemetryReport>> writer;
  v1::TelemetryAck ack;
  auto close_stream = [&] {
    if (writer != nullptr) {
      writer->WritesDone();
      (void)writer->Finish();
    }
    {
      absl::MutexLock lock(&mu);
      telemetry_context = nullptr;
    }
    writer.reset();
    context.reset();
    streaming.reset();
  };
  for (;;) {
    v1::TelemetryReport report;
    uint64_t sequence;
    bool new_stats;
    std::shared_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
        return stopping || flush || events_waiting;
      };
      mu.AwaitWithTimeout(absl::Condition(&wake), options.telemetry_period);
      if (stopping) break;
      events_waiting = false;
      c = connection;
      sequence = stats_published;
      new_stats = sequence != stats_sent;
      if (new_stats) report = stats;
      if (!new_stats) flush = false;
      if (new_stats && working_set_unsent) {
        *report.mutable_working_set() = working_set;
        working_set_unsent = false;
      }
    }
    // Events go out every period, whether the stats changed or not; while
    // the daemon is away they stay in the recorder (up to its capacity).
    std::vector<RecordedBatch> batches;
    if (recorder != nullptr && c != nullptr) batches = recorder->Take();
    if (c == nullptr || (!new_stats && batches.empty())) continue;
    if (streaming != c) {
      close_stream();
      context = std::make_unique<grpc::ClientContext>();
      {
        absl::MutexLock lock(&mu);
        telemetry_context = context.get();
      }
      writer = c->stub->StreamTelemetry(context.get(), &ack);
      streaming = c;
    }
    if (!SendTelemetry(*writer, c->session_id, new_stats ? &report : nullptr,
                       batches)) {
      close_stream();
      if (report.has_working_set()) {
        absl::MutexLock lock(&mu);
        working_set_unsent = true;  // the next try sends the latest
      }
      continue;
    }
    if (!new_stats) continue;
    absl::MutexLock lock(&mu);
    stats_sent = sequence;
    if (stats_sent == stats_published) flush = false;
  }
  close_stream();
}

absl::StatusOr<std::unique_ptr<DaemonClient>> DaemonClient::Connect(
    DaemonClientOptions options) {
  // Grants arrive as FDs, a read-ahead's up to GrantReadAhead::kMaxBatch
  // segments' at once, on top of the ~50 a fresh CUDA process holds in a
  // table of 64: the table grows here, once, rather than under a grant the
  // process waits for. Best effort: without it grants still arrive, later.
  (void)ReserveFdTable(kFdTableSlots);
  auto state = std::make_unique<State>(std::move(options));
  absl::StatusOr<std::shared_ptr<Connection>> c =
      Establish(state->options, 1, RunningConfig{});
  if (!c.ok()) return c.status();
  state->handed_working_set = (*c)->working_set;
  {
    absl::MutexLock lock(&state->mu);
    state->Serve(*c, 1);
  }
  State* s = state.get();
  std::unique_ptr<DaemonClient> client(new DaemonClient(std::move(state)));
  if (s->options.read_ahead_keep > absl::ZeroDuration()) {
    DaemonClient* self = client.get();
    s->read_ahead = std::make_unique<GrantReadAhead>(
        [self](const GrantReadAhead::Key& key,
               uint32_t count) -> std::vector<ReceivedChunks> {
          std::vector<ReceivedChunks> grants = self->AcquireAhead(
              key.bytes, key.max_chunk_bytes, count, key.client_creates);
          uint64_t bytes = 0;
          for (const ReceivedChunks& grant : grants) bytes += grant.bytes();
          if (bytes != 0) self->state_->SetReadAheadBytes(bytes);
          return grants;
        },
        [self](ReceivedChunks chunks) {
          self->state_->SetReadAheadBytes(0);
          (void)self->Release(chunks.epoch, chunks.ids);
        },
        s->options.read_ahead_keep);
  }
  s->session_thread = std::thread([s] { s->SessionLoop(); });
  s->telemetry_thread = std::thread([s] { s->TelemetryLoop(); });
  return client;
}

DaemonClient::DaemonClient(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

DaemonClient::~DaemonClient() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    if (state_->watch_context != nullptr) state_->watch_context->TryCancel();
    if (state_->telemetry_context != nullptr) {
      state_->telemetry_context->TryCancel();
    }
  }
  state_->session_thread.join();
  state_->telemetry_thread.join();
  // Gives back what it read ahead (the session thread reads the pointer).
  state_->read_ahead.reset();
}

// One unary RPC for the current session: `rpc(stub, context, session)`.
template <typename Rpc>
absl::Status CallOnSession(DaemonClient::State& state, Rpc&& rpc) {
  std::shared_ptr<Connection> c = state.Current();
  if (c == nullptr) return absl::UnavailableError("not connected to allocd");
  grpc::ClientContext context;
  SetDeadline(context, state.options.rpc_timeout);
  return FromGrpc(rpc(*c->stub, &context, c->session_id));
}

absl::StatusOr<ReceivedChunks> DaemonClient::Acquire(uint64_t bytes,
                                                     uint64_t max_chunk_bytes,
                                                     bool client_creates) {
  const GrantReadAhead::Key key{.bytes = bytes,
                                .max_chunk_bytes = max_chunk_bytes,
                                .client_creates = client_creates};
  GrantReadAhead* const ahead = state_->read_ahead.get();
  if (ahead != nullptr) {
    if (std::optional<ReceivedChunks> parked = ahead->Take(key)) {
      state_->SetReadAheadBytes(ahead->parked_bytes());
      ahead->Granted(key, /*from_cache=*/true);
      return *std::move(parked);
    }
  }
  absl::StatusOr<std::optional<ReceivedChunks>> got =
      AcquireGrant(bytes, max_chunk_bytes, /*read_ahead=*/0, client_creates);
  if (!got.ok()) return got.status();
  if (ahead != nullptr) {
    ahead->Granted(key, (*got)->reused == (*got)->ids.size());
  }
  return **std::move(got);
}

std::vector<ReceivedChunks> DaemonClient::AcquireAhead(uint64_t bytes,
                                                      uint64_t max_chunk_bytes,
                                                      uint32_t count,
                                                      bool client_creates) {
  absl::StatusOr<std::optional<ReceivedChunks>> got = AcquireGrant(
      bytes, max_chunk_bytes, std::max<uint32_t>(count, 1), client_creates);
  if (!got.ok() || !got->has_value()) return {};
  const uint64_t epoch = (*got)->epoch;
  const std::vector<uint64_t> ids = (*got)->ids;
  const uint64_t unit = chunk_bytes();
  absl::StatusOr<std::vector<ReceivedChunks>> grants =
      SplitGrant(**std::move(got), (bytes + unit - 1) / unit * unit);
  if (!grants.ok()) {  // not the daemon's grants of `bytes`: unusable
    (void)Release(epoch, ids);
    return {};
  }
  return *std::move(grants);
}

absl::StatusOr<std::optional<ReceivedChunks>> DaemonClient::AcquireGrant(
    uint64_t bytes, uint64_t max_chunk_bytes, uint32_t read_ahead,
    bool client_creates) {
  const bool may_wait = read_ahead == 0;
  const absl::Time deadline =
      may_wait ? absl::Now() + state_->options.reconnect_wait : absl::Now();
  for (;;) {
    std::shared_ptr<Connection> c = state_->WaitConnected(deadline);
    if (c == nullptr && !may_wait) return std::nullopt;
    if (c == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "the allocd daemon at ", state_->options.socket,
          " did not come back within ",
          absl::FormatDuration(state_->options.reconnect_wait)));
    }
    // Over gRPC, then a claim on the lease. Unavailable when the daemon
    // died, or restarted and no longer knows the session.
    auto over_rpc = [&]() -> absl::StatusOr<ReceivedChunks> {
      grpc::ClientContext context;
      SetDeadline(context, state_->options.rpc_timeout);
      v1::AcquireChunksRequest request;
      request.set_session_id(c->session_id);
      request.set_bytes(bytes);
      request.set_max_chunk_bytes(max_chunk_bytes);
      request.set_client_creates(client_creates);
      v1::AcquireChunksResponse response;
      grpc::Status status =
          c->stub->AcquireChunks(&context, request, &response);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          status.error_code() == grpc::StatusCode::NOT_FOUND) {
        return absl::UnavailableError(status.error_message());
      }
      if (!status.ok()) return FromGrpc(status);
      absl::StatusOr<ReceivedChunks> claimed = ClaimGrant(*c, response);
      if (!claimed.ok() && !absl::IsUnavailable(claimed.status()) &&
          !absl::IsDataLoss(claimed.status())) {
        // Unusable here, so not ours to keep: the session must not hold
        // them. (A lease acquire's daemon takes them back itself.)
        std::vector<uint64_t> ids(response.chunk_ids().begin(),
                                  response.chunk_ids().end());
        (void)Release(c->epoch, ids);
      }
      return claimed;
    };
    // One round trip on the lease when the daemon can grant at once; over
    // gRPC when it has to wait (or speaks no lease acquires).
    absl::StatusOr<std::optional<ReceivedChunks>> on_lease = std::nullopt;
    if (c->lease_acquires) {
      on_lease = AcquireOnLease(*c, bytes, max_chunk_bytes, read_ahead,
                                client_creates);
    }
    if (!may_wait && on_lease.ok() && !on_lease->has_value()) {
      return std::nullopt;
    }
    absl::StatusOr<ReceivedChunks> chunks =
        !on_lease.ok()          ? on_lease.status()
        : on_lease->has_value() ? **std::move(on_lease)
                                : over_rpc();
    if (absl::IsUnavailable(chunks.status()) ||
        absl::IsDataLoss(chunks.status())) {
      // The daemon died mid-call: the grant died with it. Ask the next.
      state_->Lost(c);
      if (!may_wait) return std::nullopt;
      continue;
    }
    if (!chunks.ok()) return chunks.status();
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->declared_epoch > c->epoch) {
        // The daemon restarted meanwhile and the new one has heard what
        // this process holds already: these are nobody's now. Ask again.
        if (!may_wait) return std::nullopt;
        continue;
      }
      for (size_t i = 0; i < chunks->ids.size(); ++i) {
        state_->held[{c->epoch, chunks->ids[i]}] = HeldChunk{
            .bytes = chunks->sizes[i],
            .offset = chunks->offsets[i],
            .proof = c->declare_fds ? DupProof(chunks->fds[i].get())
                                    : UniqueFd(),
            .owner_epoch = c->epoch};
      }
    }
    return std::optional<ReceivedChunks>(*std::move(chunks));
  }
}

absl::StatusOr<std::string> DaemonClient::Share(
    uint64_t epoch, absl::Span<const uint64_t> ids) {
  absl::StatusOr<std::shared_ptr<Connection>> owner =
      state_->Owner(epoch, ids, "they cannot be shared");
  if (!owner.ok()) return owner.status();
  const std::shared_ptr<Connection>& c = *owner;
  grpc::ClientContext context;
  SetDeadline(context, state_->options.rpc_timeout);
  v1::ShareChunksRequest request;
  request.set_session_id(c->session_id);
  for (uint64_t id : ids) request.add_chunk_ids(id);
  v1::ShareChunksResponse response;
  if (grpc::Status s = c->stub->ShareChunks(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  return response.share_token();
}

absl::Status DaemonClient::GiveMemory(uint64_t epoch,
                                      absl::Span<const uint64_t> ids,
                                      absl::Span<const int> fds) {
  if (ids.size() != fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " FDs for ", ids.size(), " chunks"));
  }
  absl::StatusOr<std::shared_ptr<Connection>> owner =
      state_->Owner(epoch, ids, "their memory cannot be given to it");
  if (!owner.ok()) return owner.status();
  Connection& c = **owner;
  for (size_t begin = 0; begin < ids.size(); begin += kMaxFdsPerMessage) {
    const size_t n = std::min(ids.size() - begin, kMaxFdsPerMessage);
    v1::SideRequest request;
    for (uint64_t id : ids.subspan(begin, n)) {
      request.mutable_give_memory()->add_chunk_ids(id);
    }
    absl::StatusOr<v1::SideResponse> answer =
        LeaseCall(c, request, nullptr, fds.subspan(begin, n));
    if (!answer.ok()) return answer.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedChunks> DaemonClient::OpenShare(
    const std::string& share_token) {
  std::shared_ptr<Connection> c = state_->Current();
  if (c == nullptr) return absl::UnavailableError("not connected to allocd");
  grpc::ClientContext context;
  SetDeadline(context, state_->options.rpc_timeout);
  v1::OpenShareRequest request;
  request.set_session_id(c->session_id);
  request.set_share_token(share_token);
  v1::AcquireChunksResponse response;
  if (grpc::Status s = c->stub->OpenShare(&context, request, &response);
      !s.ok()) {
    return FromGrpc(s);
  }
  absl::StatusOr<ReceivedChunks> chunks = ClaimGrant(*c, response);
  if (!chunks.ok()) (void)CloseShare(c->epoch, share_token);
  return chunks;
}

absl::Status DaemonClient::CloseShare(uint64_t epoch,
                                      const std::string& share_token) {
  std::shared_ptr<Connection> c = state_->Current();
  if (c == nullptr || c->epoch != epoch) return absl::OkStatus();
  return CallOnSession(*state_,
                       [&](v1::Allocd::Stub& stub, grpc::ClientContext* context,
                           uint64_t session) {
                         v1::CloseShareRequest request;
                         request.set_session_id(session);
                         request.set_share_token(share_token);
                         v1::CloseShareResponse response;
                         return stub.CloseShare(context, request, &response);
                       });
}

absl::Status DaemonClient::Release(uint64_t epoch,
                                   absl::Span<const uint64_t> ids) {
  std::shared_ptr<Connection> c;
  std::vector<uint64_t> owned;  // by the current session
  {
    absl::MutexLock lock(&state_->mu);
    c = state_->connection;
    for (uint64_t id : ids) {
      auto it = state_->held.find({epoch, id});
      // Never recorded (a claim that failed): its granting session's.
      const uint64_t owner =
          it == state_->held.end() ? epoch : it->second.owner_epoch;
      if (it != state_->held.end()) state_->held.erase(it);
      if (c != nullptr && owner == c->epoch) owned.push_back(id);
    }
  }
  if (owned.empty()) return absl::OkStatus();
  return state_->ReleaseOn(c, owned);
}

std::vector<v1::ControlMessage> DaemonClient::TakeControl() {
  absl::MutexLock lock(&state_->mu);
  std::vector<v1::ControlMessage> out(
      std::make_move_iterator(state_->control.begin()),
      std::make_move_iterator(state_->control.end()));
  state_->control.clear();
  return out;
}

absl::Status DaemonClient::Ack(uint64_t version, bool applied,
                               absl::string_view error) {
  return CallOnSession(*state_, [&](v1::Allocd::Stub& stub,
                                    grpc::ClientContext* context,
                                    uint64_t session) {
    v1::ConfigAck request;
    request.set_session_id(session);
    request.set_version(version);
    request.set_applied(applied);
    request.set_error(std::string(error));
    v1::AckResponse response;
    return stub.AckConfig(context, request, &response);
  });
}

absl::Status DaemonClient::ReportOom(uint64_t requested_bytes,
                                     absl::string_view message,
                                     uint64_t config_version) {
  return CallOnSession(*state_, [&](v1::Allocd::Stub& stub,
                                    grpc::ClientContext* context,
                                    uint64_t session) {
    v1::OomReport request;
    request.set_session_id(session);
    request.set_requested_bytes(requested_bytes);
    request.set_message(std::string(message.substr(0, 4096)));
    request.set_config_version(config_version);
    v1::OomResponse response;
    return stub.ReportOom(context, request, &response);
  });
}

void DaemonClient::PublishStats(std::map<std::string, int64_t> stats,
                                uint64_t config_version) {
  absl::MutexLock lock(&state_->mu);
  state_->stats.clear_stats();
  for (auto& [k, v] : stats) (*state_->stats.mutable_stats())[k] = v;
  if (state_->read_ahead != nullptr || state_->handed_over_bytes != 0) {
    state_->WriteAheadBytes();
  }
  state_->stats.set_config_version(config_version);
  ++state_->stats_published;
}

absl::Status DaemonClient::FlushTelemetry() {
  absl::MutexLock lock(&state_->mu);
  state_->flush = true;
  auto sent = [this]() ABSL_SHARED_LOCKS_REQUIRED(state_->mu) {
    return state_->stats_sent == state_->stats_published || state_->stopping;
  };
  if (!state_->mu.AwaitWithTimeout(absl::Condition(&sent),
                                   state_->options.rpc_timeout)) {
    return absl::DeadlineExceededError("telemetry not sent");
  }
  return absl::OkStatus();
}

void DaemonClient::PublishWorkingSet(std::vector<uint64_t> segment_bytes) {
  absl::MutexLock lock(&state_->mu);
  state_->working_set.mutable_segment_bytes()->Assign(segment_bytes.begin(),
                                                      segment_bytes.end());
  state_->working_set_unsent = true;
  ++state_->stats_published;
}

const std::vector<uint64_t>& DaemonClient::handed_working_set() const {
  return state_->handed_working_set;
}

void DaemonClient::SetHandedOverBytes(uint64_t bytes) {
  state_->SetHandedOverBytes(bytes);
}

void DaemonClient::OnReclaim(std::function<void()> drop) {
  absl::MutexLock lock(&state_->reclaim_mu);
  state_->on_reclaim = std::move(drop);
}

EventRecorder* DaemonClient::events() { return state_->recorder.get(); }

void DaemonClient::SetRunning(std::string config, uint64_t version) {
  absl::MutexLock lock(&state_->mu);
  state_->running = {.config = std::move(config), .version = version};
  ++state_->running_generation;
}

uint64_t DaemonClient::running_version() const {
  absl::MutexLock lock(&state_->mu);
  return state_->running.version;
}

uint64_t DaemonClient::session_id() const {
  std::shared_ptr<Connection> c = state_->Current();
  return c == nullptr ? 0 : c->session_id;
}

uint64_t DaemonClient::epoch() const {
  absl::MutexLock lock(&state_->mu);
  return state_->epoch;
}

bool DaemonClient::connected() const { return state_->Current() != nullptr; }

uint64_t DaemonClient::chunk_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->terms.chunk_bytes;
}

uint64_t DaemonClient::capacity_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->terms.capacity;
}

std::string DaemonClient::gpu_uuid() const {
  absl::MutexLock lock(&state_->mu);
  return state_->terms.gpu_uuid;
}

}  // namespace allocd
