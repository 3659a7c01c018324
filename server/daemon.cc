#include "server/daemon.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "ipc/unix_socket.h"
#include "server/admin_socket.h"
#include "server/config_watcher.h"
#include "server/autotune/learned_configs.h"
#include "server/daemon_autotune.h"
#include "server/daemon_core.h"
#include "server/grpc_services.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/peer_table.h"
#include "server/pool/chunk_classes.h"
#include "server/pool/device_pools.h"
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

// One device the daemon serves, before its pool exists.
struct FoundDevice {
  std::string uuid;
  std::string name;
  std::unique_ptr<ChunkSource> source;
  // Free memory at start (cuMemGetInfo); nullopt for a sim device.
  std::optional<uint64_t> free_memory;
  // A GPU's CudaChunkSource::KeepFree; empty for a sim device.
  std::function<void(uint64_t)> keep_free;
};

// The chunk sizes of `source`'s pool.
std::vector<uint64_t> PoolChunkClasses(const ChunkSource& source) {
  return DefaultChunkClasses(source.Granularity());
}

// A pool keeps FdsPerChunk() FDs per live chunk, and how many chunks fill
// its capacity depends on the segments jobs ask for: at least the capacity
// split as the pool splits a request, largest class first (80 GiB: 80
// chunks of 1 GiB), at most the capacity in smallest chunks (40,960 of
// 2 MiB, when jobs hold only small segments). The fewest must fit in
// RLIMIT_NOFILE, or the pool could never be full: refused here, rather than
// failing deep into a job's run. The most need not: only chunks jobs hold
// keep descriptors, since an Acquire whose source runs out of them destroys
// cached chunks (and their FDs) and retries, and past that is a node
// shortage, as on a device full below its capacity. That is logged here,
// because such chunks can also take the descriptors the daemon keeps for
// its sockets (kDaemonFdHeadroom).
absl::Status CheckOpenFileLimit(
    const std::vector<FoundDevice>& devices,
    const std::vector<uint64_t>& capacities) {
  absl::StatusOr<uint64_t> limit = RaiseOpenFileLimit();
  if (!limit.ok()) return limit.status();
  // FDs of every pool full of its largest chunks, and of its smallest.
  uint64_t fewest = 0;
  uint64_t most = 0;
  uint64_t capacity = 0;
  uint64_t fds_per_chunk = 0;
  uint64_t smallest = 0;
  uint64_t largest = 0;
  size_t holding = 0;  // devices whose chunks hold FDs
  for (size_t i = 0; i < devices.size(); ++i) {
    const ChunkSource& source = *devices[i].source;
    if (source.FdsPerChunk() == 0) continue;
    const ChunkClasses classes(PoolChunkClasses(source), source.Granularity());
    fds_per_chunk = source.FdsPerChunk();
    smallest = classes.smallest();
    largest = classes.sizes().back();
    // Live chunks never exceed the capacity: whole chunks of it.
    const uint64_t full = capacities[i] / smallest * smallest;
    fewest += classes.Split(full).size() * fds_per_chunk;
    most += full / smallest * fds_per_chunk;
    capacity += capacities[i];
    ++holding;
  }
  const uint64_t usable =
      *limit > kDaemonFdHeadroom ? *limit - kDaemonFdHeadroom : 0;
  const std::string over_devices =
      holding > 1 ? absl::StrCat(" over ", holding, " devices") : "";
  const std::string raise =
      "Raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker "
      "--ulimit nofile=)";
  if (fewest > usable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--capacity ", FormatSize(capacity), over_devices,
        " needs at least ", fewest, " file descriptors (its chunks, of up to ",
        FormatSize(largest), "), plus ", kDaemonFdHeadroom,
        " for sockets: more than RLIMIT_NOFILE allows (", *limit, "). ",
        raise, " or lower --capacity to at most ",
        FormatSize(usable / fds_per_chunk / holding * largest),
        holding > 1 ? " per device" : ""));
  }
  if (most > usable) {
    LogInfo(absl::StrCat(
        "--capacity ", FormatSize(capacity), over_devices,
        " may need up to ", most, " file descriptors (its chunks, if all are ",
        FormatSize(smallest), "), more than RLIMIT_NOFILE (", *limit,
        ") allows besides ", kDaemonFdHeadroom,
        " for sockets: if jobs hold that many small segments, Acquires past "
        "the limit fail as a node shortage. ",
        raise, " to serve them up to the capacity"));
  }
  return absl::OkStatus();
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

std::vector<FoundDevice> SimDevices(int count) {
  std::vector<FoundDevice> devices;
  for (int i = 0; i < count; ++i) {
    devices.push_back({.uuid = SimDeviceUuid(i),
                       .name = "memfd",
                       .source = std::make_unique<MemfdChunkSource>()});
  }
  return devices;
}

// Every GPU the driver sees, in PCI bus order.
absl::StatusOr<std::vector<FoundDevice>> CudaDevices() {
#ifdef ALLOCD_WITH_CUDA
  absl::StatusOr<std::vector<std::unique_ptr<CudaChunkSource>>> sources =
      CudaChunkSource::CreateAll();
  if (!sources.ok()) return sources.status();
  std::vector<FoundDevice> devices;
  for (std::unique_ptr<CudaChunkSource>& source : *sources) {
    LogInfo(absl::StrCat("device ", devices.size(), ": ", source->uuid(),
                         ", chunks from ", source->Describe(), ", ",
                         FormatSize(source->free_memory_at_start()),
                         " free at start"));
    CudaChunkSource* cuda = source.get();
    FoundDevice device{.uuid = source->uuid(),
                       .name = source->device_name(),
                       .free_memory = source->free_memory_at_start(),
                       .keep_free = [cuda](uint64_t bytes) { cuda->KeepFree(bytes); }};
    device.source = std::move(source);
    devices.push_back(std::move(device));
  }
  return devices;
#else
  return absl::UnimplementedError(
      "this build has no CUDA backend (built without the CUDA toolkit)");
#endif
}

// The devices `--backend` (and `--sim-devices`) ask for; `*backend` becomes
// what serves them ("sim" or "cuda").
absl::StatusOr<std::vector<FoundDevice>> FindDevices(const DaemonOptions& o,
                                                     std::string* backend) {
  if (o.sim_devices < 1 || o.sim_devices > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sim-devices must be in [1, 1024]; got ", o.sim_devices));
  }
  if (o.backend == "sim") {
    *backend = "sim";
    return SimDevices(o.sim_devices);
  }
  if (o.backend != "cuda" && o.backend != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend must be auto, sim or cuda; got \"", o.backend, "\""));
  }
  absl::StatusOr<std::vector<FoundDevice>> gpus = CudaDevices();
  if (gpus.ok()) {
    *backend = "cuda";
    return gpus;
  }
  if (o.backend == "cuda") {
    return absl::Status(
        gpus.status().code(),
        absl::StrCat("--backend cuda: ", gpus.status().message(),
                     absl::IsUnimplemented(gpus.status())
                         ? "; use --backend sim"
                         : ""));
  }
  // --backend auto on a machine without a GPU: say so, loudly, since the
  // memory handed out is then not GPU memory.
  LogError(absl::StrCat(
      "no GPU to serve (", gpus.status().message(), "): serving SIMULATED "
      "memory (memfd chunks, no GPU), ", o.sim_devices, " device(s). Pass "
      "--backend cuda to refuse to start without a GPU, or --backend sim to "
      "silence this"));
  *backend = "sim";
  return SimDevices(o.sim_devices);
}

SizeContext DeviceSizes(const std::string& backend, const FoundDevice& device) {
  return SizeContext{.percent_of = device.source->DeviceMemory(),
                     .no_percent_reason = absl::StrCat("--backend ", backend,
                                                       " has no device memory to take "
                                                       "it of")};
}

// --headroom on a GPU: what the default capacity leaves of its free memory
// at start, and what the pool never takes of it later (KeepFree).
absl::StatusOr<uint64_t> DeviceHeadroom(const DaemonOptions& o,
                                        const std::string& backend,
                                        const FoundDevice& device) {
  absl::StatusOr<uint64_t> headroom = ParseSize(o.headroom, DeviceSizes(backend, device));
  if (!headroom.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--headroom: ", headroom.status().message()));
  }
  return *headroom;
}

// The capacity of `device`'s pool: --capacity (a size, or a percentage of
// the device's memory), else its free memory at start minus `headroom` (its
// --headroom) on a GPU, else DaemonOptions::capacity.
absl::StatusOr<uint64_t> DeviceCapacity(const DaemonOptions& o,
                                        const std::string& backend,
                                        const FoundDevice& device,
                                        std::optional<uint64_t> headroom) {
  if (!o.capacity_size.empty()) {
    absl::StatusOr<uint64_t> capacity = ParseSize(o.capacity_size, DeviceSizes(backend, device));
    if (!capacity.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--capacity: ", capacity.status().message()));
    }
    return *capacity;
  }
  if (!device.free_memory.has_value() || !headroom.has_value()) return o.capacity;
  if (*device.free_memory <= *headroom) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device.uuid, " (", device.name, ") has ",
        FormatSize(*device.free_memory), " free, no more than --headroom ",
        FormatSize(*headroom), ": other processes hold its memory. Free it, "
        "lower --headroom, or give --capacity"));
  }
  return *device.free_memory - *headroom;
}

// "8 GiB" for one device or devices alike, "8 GiB, 7.5 GiB" otherwise.
std::string CapacitySummary(const DevicePools& pools) {
  std::string out;
  bool alike = true;
  for (const DevicePool& d : pools.devices()) {
    alike = alike && d.pool->capacity() == pools.at(0).pool->capacity();
    absl::StrAppend(&out, out.empty() ? "" : ", ",
                    FormatSize(d.pool->capacity()));
  }
  return alike ? absl::StrCat(FormatSize(pools.at(0).pool->capacity()),
                              pools.size() > 1 ? " each" : "")
               : out;
}

// The autotuner's learned configs, kept where DaemonOptions::state_dir says.
absl::StatusOr<std::unique_ptr<LearnedConfigs>> OpenLearnedConfigs(
    const DaemonOptions& o, const std::string& backend) {
  const std::string dir = o.state_dir.value_or(backend == "sim" ? "" : kDefaultStateDir);
  if (dir.empty()) return std::make_unique<LearnedConfigs>();
  std::string corrupt;
  absl::StatusOr<std::unique_ptr<LearnedConfigs>> opened =
      LearnedConfigs::Open(dir, LearnedConfigs::kDefaultMaxJobs, &corrupt);
  if (!corrupt.empty()) LogError(corrupt);
  if (opened.ok() || o.state_dir.has_value()) return opened;
  LogError(absl::StrCat(opened.status().message(),
                        ". Learned configs are kept in memory only until the "
                        "daemon stops"));
  return std::make_unique<LearnedConfigs>();
}

}  // namespace

// Declaration order is teardown order reversed: the loops that call into
// the core stop before the core, the core before the pool.
struct Daemon::Parts {
  DaemonOptions options;
  Metrics metrics;
  DevicePools pools;
  std::unique_ptr<DaemonCore> core;
  std::unique_ptr<LearnedConfigs> learned;
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
  std::string backend;
  absl::StatusOr<std::vector<FoundDevice>> devices = FindDevices(o, &backend);
  if (!devices.ok()) return devices.status();
  std::vector<uint64_t> capacities;
  // For fitting each capacity after a restart (DaemonCore::SettleAdoption).
  std::vector<DeviceAtStart> at_start;
  for (const FoundDevice& device : *devices) {
    // A GPU's (parsed once: its default capacity and its KeepFree).
    std::optional<uint64_t> headroom;
    if (device.free_memory.has_value()) {
      absl::StatusOr<uint64_t> parsed = DeviceHeadroom(o, backend, device);
      if (!parsed.ok()) return parsed.status();
      headroom = *parsed;
    }
    absl::StatusOr<uint64_t> capacity = DeviceCapacity(o, backend, device, headroom);
    if (!capacity.ok()) return capacity.status();
    if (*capacity == 0) {
      return absl::InvalidArgumentError("--capacity must be more than 0");
    }
    capacities.push_back(*capacity);
    if (device.keep_free && headroom.has_value()) device.keep_free(*headroom);
    at_start.push_back(
        {.free_memory = device.free_memory,
         .capacity_from_free =
             o.capacity_size.empty() && device.free_memory.has_value()});
  }
  if (absl::Status fds = CheckOpenFileLimit(*devices, capacities); !fds.ok()) {
    return fds;
  }
  for (size_t i = 0; i < devices->size(); ++i) {
    FoundDevice& device = (*devices)[i];
    // Checked by FindDevices: UUIDs are the driver's, or distinct.
    std::vector<uint64_t> classes = PoolChunkClasses(*device.source);
    if (absl::Status s = parts->pools.Add(
            device.uuid, device.name, std::move(device.source),
            NodePool::Options{.capacity = capacities[i],
                              .chunk_classes = std::move(classes),
                              .chunk_id_epoch = RandomChunkIdEpoch()});
        !s.ok()) {
      return s;
    }
  }
  parts->options.backend = backend;
  parts->options.capacity = parts->pools.min_capacity();
  if (!o.default_tenant_quota.empty()) {
    absl::StatusOr<uint64_t> quota = ParseSize(
        o.default_tenant_quota, {.percent_of = parts->pools.min_capacity()});
    if (!quota.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--default-tenant-quota: ", quota.status().message()));
    }
    for (const DevicePool& device : parts->pools.devices()) {
      device.pool->SetDefaultTenantQuota(*quota);
    }
  }
  const std::string fd_socket = o.socket + ".fds";
  if (parts->options.admin_socket.empty()) {
    parts->options.admin_socket = o.socket + ".admin";
  }
  std::optional<gid_t> admin_gid;
  if (!o.admin_group.empty()) {
    absl::StatusOr<gid_t> gid = ResolveAdminGroup(o.admin_group);
    if (!gid.ok()) return gid.status();
    admin_gid = *gid;
  }
  parts->core = std::make_unique<DaemonCore>(
      DaemonCoreOptions{.backend = backend,
                        .fd_socket = fd_socket,
                        .lease_grace = o.lease_grace,
                        .reclaim_wait = o.reclaim_wait,
                        .tenancy = o.tenancy,
                        .admin_uids = o.admin_uids,
                        .admin_gid = admin_gid,
                        .session_limits = o.session_limits,
                        .trim = o.trim,
                        .sessions_file = o.socket + ".sessions",
                        .adopt_window = o.adopt_window,
                        .devices_at_start = std::move(at_start)},
      &parts->pools, &parts->metrics);
  absl::StatusOr<std::unique_ptr<LearnedConfigs>> learned =
      OpenLearnedConfigs(o, backend);
  if (!learned.ok()) return learned.status();
  parts->learned = *std::move(learned);
  AutotuneOptions autotune = o.autotune;
  if (autotune.capacity == 0) autotune.capacity = o.capacity;
  autotune.memory = {
      .total = o.autotune_memory,
      .per_tenant = o.autotune_memory_per_tenant.value_or(
          o.tenancy == Tenancy::kNode ? o.autotune_memory
                                      : o.autotune_memory / 4),
      .log = [](const std::string& line) { LogError(line); }};
  parts->autotune = std::make_unique<DaemonAutotune>(
      std::move(autotune), parts->core.get(), &parts->metrics,
      parts->learned.get());
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
      &parts->metrics, o.admin_socket);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.RegisterService(parts->allocd_service.get());
  builder.RegisterService(parts->admin_service.get());
  parts->server = builder.BuildAndStart();
  if (parts->server == nullptr) {
    return absl::InternalError("gRPC server failed to start");
  }
  // Health says SERVING only once every socket below is open (the admin
  // socket, which health is asked on, opens before the clients' socket).
  parts->server->GetHealthCheckService()->SetServingStatus(false);

  const ConnectionLimits connections = {.held = o.connections,
                                       .rate = o.accept_rate};
  absl::StatusOr<std::unique_ptr<SideChannel>> side =
      SideChannel::Start(fd_socket, 0660, parts->core.get(), &parts->metrics,
                         connections);
  if (!side.ok()) return side.status();
  parts->side = std::move(*side);
  struct Listen {
    const std::string& path;
    mode_t mode;
    bool admin;
  };
  // The tenant socket opens last: clients, probes and scripts wait for it to
  // appear, and when it does the side channel and the admin socket (with its
  // access set) already answer.
  for (const Listen& l : {Listen{o.admin_socket, 0600, true},
                          Listen{o.socket, 0660, false}}) {
    absl::StatusOr<std::unique_ptr<GrpcAcceptor>> acceptor =
        GrpcAcceptor::Start(
            l.path, l.mode, l.admin, parts->server.get(), &parts->peers,
            parts->core.get(),
            l.admin ? std::nullopt : std::optional(connections));
    if (!acceptor.ok()) return acceptor.status();
    parts->acceptors.push_back(std::move(*acceptor));
    if (!l.admin) continue;
    if (absl::Status s =
            OpenAdminSocketTo(o.admin_socket, o.admin_uids, admin_gid);
        !s.ok()) {
      return s;
    }
  }
  parts->server->GetHealthCheckService()->SetServingStatus(true);
  LogInfo(absl::StrCat(
      "serving on ", o.socket, " (admin ", o.admin_socket, "), tenancy ",
      TenancyName(o.tenancy), ", backend ", backend, ", ", parts->pools.size(), " device(s), capacity ",
      CapacitySummary(parts->pools),
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
