#include "server/daemon.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "ipc/unix_socket.h"
#include "server/config_watcher.h"
#include "server/daemon_autotune.h"
#include "server/daemon_core.h"
#include "server/grpc_services.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/peer_table.h"
#include "server/pool/memfd_chunk_source.h"
#ifdef ALLOCD_WITH_CUDA
#include "server/pool/cuda_chunk_source.h"
#endif
#include "server/pool/node_pool.h"
#include "server/socket_server.h"

namespace allocd {
namespace {

// Bounds what a client can make the daemon parse in one message.
constexpr int kMaxMessageBytes = 1 << 20;

// The pool holds one FD per chunk: a full pool must fit in RLIMIT_NOFILE,
// or the daemon would fail deep into a job's run instead of at start.
absl::Status CheckOpenFileLimit(uint64_t capacity, const ChunkSource& source) {
  absl::StatusOr<uint64_t> limit = RaiseOpenFileLimit();
  if (!limit.ok()) return limit.status();
  if (source.FdsPerChunk() == 0) return absl::OkStatus();
  const size_t granularity = source.Granularity();
  const uint64_t chunks = (capacity + granularity - 1) / granularity;
  if (chunks + kDaemonFdHeadroom <= *limit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--capacity ", FormatSize(capacity), " is ", chunks, " chunks of ",
      FormatSize(granularity), ", one file descriptor each, plus ",
      kDaemonFdHeadroom, " for sockets: more than RLIMIT_NOFILE allows (",
      *limit,
      "). Raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, "
      "docker --ulimit nofile=) or lower --capacity to at most ",
      FormatSize(*limit > kDaemonFdHeadroom
                     ? (*limit - kDaemonFdHeadroom) * granularity
                     : 0)));
}

// The pool's chunk id epoch: random, so that ids a surviving client holds
// from the daemon before are never made again (NodePool::Options).
uint32_t RandomChunkIdEpoch() {
  uint32_t epoch = 0;
  while (epoch == 0) {
    if (getrandom(&epoch, sizeof epoch, 0) != sizeof epoch) epoch = 0;
    epoch &= 0xFFFFFF;
  }
  return epoch;
}

absl::StatusOr<std::unique_ptr<ChunkSource>> MakeChunkSource(
    const std::string& backend) {
  if (backend == "sim") return std::make_unique<MemfdChunkSource>();
  if (backend == "cuda") {
#ifdef ALLOCD_WITH_CUDA
    // Device 0 of those CUDA_VISIBLE_DEVICES shows.
    absl::StatusOr<std::unique_ptr<CudaChunkSource>> cuda =
        CudaChunkSource::Create(0);
    if (!cuda.ok()) {
      return absl::Status(cuda.status().code(),
                          absl::StrCat("--backend cuda: ",
                                       cuda.status().message()));
    }
    LogInfo(absl::StrCat("chunks from ", (*cuda)->Describe()));
    return std::unique_ptr<ChunkSource>(std::move(*cuda));
#else
    return absl::UnimplementedError(
        "--backend cuda: this build has no CUDA backend (built without the "
        "CUDA toolkit); use --backend sim");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be sim or cuda; got \"", backend, "\""));
}

}  // namespace

// Declaration order is teardown order reversed: the loops that call into
// the core stop before the core, the core before the pool.
struct Daemon::Parts {
  DaemonOptions options;
  Metrics metrics;
  std::unique_ptr<ChunkSource> chunks;
  std::unique_ptr<NodePool> pool;
  std::unique_ptr<DaemonCore> core;
  std::unique_ptr<DaemonAutotune> autotune;
  std::unique_ptr<ConfigWatcher> config_watcher;
  PeerTable peers;
  std::unique_ptr<AllocdService> allocd_service;
  std::unique_ptr<AdminService> admin_service;
  std::unique_ptr<grpc::Server> server;
  std::vector<std::unique_ptr<GrpcAcceptor>> acceptors;
  std::unique_ptr<SideChannel> side;
  bool shut_down = false;
};

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto parts = std::make_unique<Parts>();
  parts->options = std::move(options);
  const DaemonOptions& o = parts->options;
  absl::StatusOr<std::unique_ptr<ChunkSource>> chunks =
      MakeChunkSource(o.backend);
  if (!chunks.ok()) return chunks.status();
  parts->chunks = std::move(*chunks);
  if (!o.capacity_size.empty()) {
    absl::StatusOr<uint64_t> capacity = ParseSize(
        o.capacity_size,
        {.percent_of = parts->chunks->DeviceMemory(),
         .no_percent_reason = absl::StrCat("--backend ", o.backend,
                                           " has no device memory to take "
                                           "it of")});
    if (!capacity.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--capacity: ", capacity.status().message()));
    }
    parts->options.capacity = *capacity;
  }
  if (o.capacity == 0) {
    return absl::InvalidArgumentError("--capacity must be more than 0");
  }
  if (absl::Status fds = CheckOpenFileLimit(o.capacity, *parts->chunks);
      !fds.ok()) {
    return fds;
  }
  parts->pool = std::make_unique<NodePool>(
      parts->chunks.get(),
      NodePool::Options{.capacity = o.capacity,
                        .chunk_id_epoch = RandomChunkIdEpoch()});
  const std::string fd_socket = o.socket + ".fds";
  parts->core = std::make_unique<DaemonCore>(
      DaemonCoreOptions{.backend = o.backend,
                        .fd_socket = fd_socket,
                        .lease_grace = o.lease_grace,
                        .reclaim_wait = o.reclaim_wait,
                        .admin_uids = o.admin_uids,
                        .trim = o.trim,
                        .sessions_file = o.socket + ".sessions",
                        .adopt_window = o.adopt_window,
                        .device_free = parts->chunks->DeviceFreeMemory()},
      parts->pool.get(), &parts->metrics);
  AutotuneOptions autotune = o.autotune;
  if (autotune.capacity == 0) autotune.capacity = o.capacity;
  parts->autotune = std::make_unique<DaemonAutotune>(
      std::move(autotune), parts->core.get(), &parts->metrics);
  parts->core->SetObserver(parts->autotune.get());
  if (!o.config_file.empty()) {
    absl::StatusOr<std::unique_ptr<ConfigWatcher>> watcher =
        ConfigWatcher::Start(o.config_file, o.config_poll, parts->core.get(),
                             parts->autotune.get(), &parts->metrics);
    if (!watcher.ok()) return watcher.status();
    parts->config_watcher = std::move(*watcher);
  }
  if (!o.metrics_address.empty()) {
    if (absl::Status s = parts->metrics.Serve(o.metrics_address); !s.ok()) {
      return s;
    }
  }

  parts->allocd_service = std::make_unique<AllocdService>(
      parts->core.get(), &parts->peers, &parts->metrics);
  parts->admin_service = std::make_unique<AdminService>(
      parts->core.get(), parts->autotune.get(), &parts->peers,
      &parts->metrics);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.RegisterService(parts->allocd_service.get());
  builder.RegisterService(parts->admin_service.get());
  parts->server = builder.BuildAndStart();
  if (parts->server == nullptr) {
    return absl::InternalError("gRPC server failed to start");
  }

  absl::StatusOr<std::unique_ptr<SideChannel>> side =
      SideChannel::Start(fd_socket, 0660, parts->core.get());
  if (!side.ok()) return side.status();
  parts->side = std::move(*side);
  struct Listen {
    const std::string& path;
    mode_t mode;
  };
  for (const Listen& l :
       {Listen{o.socket, 0660}, Listen{o.admin_socket, 0600}}) {
    if (l.path.empty()) continue;
    absl::StatusOr<std::unique_ptr<GrpcAcceptor>> acceptor =
        GrpcAcceptor::Start(l.path, l.mode, parts->server.get(),
                            &parts->peers);
    if (!acceptor.ok()) return acceptor.status();
    parts->acceptors.push_back(std::move(*acceptor));
  }
  parts->server->GetHealthCheckService()->SetServingStatus(true);
  LogInfo(absl::StrCat(
      "serving on ", o.socket,
      o.admin_socket.empty() ? "" : absl::StrCat(" (admin ", o.admin_socket, ")"),
      ", backend ", o.backend, ", capacity ", FormatSize(o.capacity),
      ", autotune ", AutotuneModeName(o.autotune.default_policy.mode),
      o.metrics_address.empty()
          ? ""
          : absl::StrCat(", metrics on port ", parts->metrics.port())));
  return std::unique_ptr<Daemon>(new Daemon(std::move(parts)));
}

Daemon::Daemon(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

Daemon::~Daemon() { Shutdown(); }

void Daemon::Shutdown(absl::Duration grace) {
  if (parts_->shut_down) return;
  parts_->shut_down = true;
  parts_->server->GetHealthCheckService()->SetServingStatus(false);
  parts_->acceptors.clear();
  // Ending the sessions ends their WatchConfig streams, so the server can
  // drain.
  parts_->core->EndAll();
  parts_->server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  parts_->side.reset();
  // Nothing reports sessions any more; the autotuner goes before the core.
  parts_->core->SetObserver(nullptr);
  LogInfo("shut down");
}

int Daemon::metrics_port() const { return parts_->metrics.port(); }

const DaemonOptions& Daemon::options() const { return parts_->options; }

}  // namespace allocd
