// Daemon: `allocd serve` assembled — the node pool, DaemonCore, the gRPC
// server (Allocd, Admin and grpc.health.v1 services) behind the daemon's own
// accept loops, the side socket, and the Prometheus exposer.
#ifndef ALLOCD_SERVER_DAEMON_H_
#define ALLOCD_SERVER_DAEMON_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/protocol.h"
#include "server/pool/node_pool.h"
#include "server/accept_pacer.h"
#include "server/admission.h"
#include "server/autotune/autotuner.h"
#include "server/session_limits.h"
#include "server/tenant.h"

namespace allocd {

inline constexpr char kDefaultStateDir[] = "/var/lib/allocd";

struct DaemonOptions {
  // Clients' gRPC socket (mode 0660); the side socket is `socket` + ".fds".
  std::string socket = kDefaultSocket;
  // The gRPC socket of the Admin service (allocctl), mode 0600, widened by
  // admin_group and admin_uids; the clients' socket refuses Admin calls.
  // Empty: `socket` + ".admin".
  std::string admin_socket;
  // What a tenant is (server/tenant.h): uid, pod or node.
  Tenancy tenancy = Tenancy::kUid;
  // A group (name or gid) whose members may administer, through the admin
  // socket (given to the group, mode 0660); empty: none.
  std::string admin_group;
  // host:port for /metrics; empty: no exposer.
  std::string metrics_address = "127.0.0.1:9464";
  // "auto": every GPU the CUDA driver sees (cuda), else sim with a notice
  // on stderr. "cuda": every GPU, or an error. "sim": memfd chunks, no GPU.
  std::string backend = "auto";
  // Sim devices (SimDeviceUuid(0..N-1)), a pool each.
  int sim_devices = 1;
  // Each sim device's capacity when `capacity_size` is empty; after Start,
  // the smallest device's capacity.
  uint64_t capacity = uint64_t{8} << 30;
  // Each device's capacity as `--capacity` gave it, when not empty: a size
  // ("70GiB"), or "N%" of the device's memory (ChunkSource::DeviceMemory).
  // Empty: on a GPU, its free memory at start minus `headroom`.
  std::string capacity_size;
  // What the daemon leaves free on a GPU (a size, or "N%" of the device's
  // memory): its default capacity is free memory at start minus this, and
  // its pool never creates a chunk that would leave less free
  // (CudaChunkSource::KeepFree).
  std::string headroom = "1GiB";
  // JSON configs per job and quotas (see server/config_file.h); optional.
  // Read again every `config_poll`; changes apply without a restart.
  std::string config_file;
  absl::Duration config_poll = absl::Seconds(1);
  std::vector<uid_t> admin_uids;
  absl::Duration lease_grace = absl::Seconds(5);
  absl::Duration reclaim_wait = absl::Seconds(1);
  // Cached chunks go back to the device after this long unused, and above
  // the high water at once. Re-creating chunks cost about 25 ms per GiB on
  // an H100 (a 40 GiB working set: 2.8 s from a cold pool, 1.8 s warm), so
  // a job that comes back after 5 idle minutes pays well under a step.
  TrimPolicy trim{.idle_after = absl::Minutes(5)};
  // After a restart, new memory waits up to this long for the sessions of
  // the daemon before (pids and chunks in `socket` + ".sessions", 0600) to
  // re-declare the chunks they hold (DaemonCoreOptions::adopt_window).
  absl::Duration adopt_window = absl::Seconds(5);
  // Where the daemon keeps what it learns across restarts: the autotuner's
  // learned configs (LearnedConfigs, DIR/learned_configs.json). nullopt:
  // kDefaultStateDir on a GPU daemon, kept in memory only (with a warning)
  // where that cannot be written; in memory only on a sim daemon, so that
  // tests and demos never write to /var/lib. Empty: in memory only. A
  // directory given that cannot be created or written stops the start.
  std::optional<std::string> state_dir;
  // The autotuner (--autotune MODE and its knobs). Its capacity, when 0,
  // is the pool's: a candidate that would not fit the node is never
  // proposed.
  AutotuneOptions autotune;
  // Limits, with protective defaults, so that no peer can stall or bloat
  // the daemon. Sessions and registrations waiting for their lease per
  // tenant and in total (DaemonCoreOptions::session_limits);
  SessionLimitsOptions session_limits = kDefaultSessionLimits;
  // connections per tenant and in total, to the side socket (a lease per
  // session, and as many again in flight: SideChannel) and to the client
  // socket (a channel or two per process: GrpcAcceptor), each;
  AdmissionLimits connections = {.per_tenant = 2048, .total = 8192};
  // connections each uid opens per second to each of those sockets, past
  // a burst (processes that start together connect together): what a node
  // of jobs needs many times over, while one uid that opens and closes
  // them in a loop crowds out nobody (AcceptPacer);
  AcceptRate accept_rate = {.per_second = 256, .burst = 1024};
  // what the autotuner's windows hold, in total, well inside the
  // DaemonSet's 1 GiB memory limit beside the daemon's own ~50 MB and a
  // decision's copy of one window, and per tenant (nullopt: a quarter of
  // the total, or all of it under --tenancy node, one tenant).
  uint64_t autotune_memory = uint64_t{256} << 20;
  std::optional<uint64_t> autotune_memory_per_tenant;
  // The quota of every tenant without its own (tenant_quotas in the config
  // file, allocctl quota set --tenant): a size, or "N%" of the smallest
  // GPU pool; what its sessions on one GPU may hold together. Empty: none.
  // Off by default: on a single-tenant node it would only cut the one job.
  std::string default_tenant_quota;
};

class Daemon {
 public:
  // Starts serving; the error says what could not be set up.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  // Graceful: health goes NOT_SERVING, sessions end, RPCs in flight get
  // `grace` to finish, sockets are removed.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  ~Daemon();

  // The port /metrics is served on (0: none).
  int metrics_port() const;
  const DaemonOptions& options() const;

  struct Parts;

 private:
  explicit Daemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_DAEMON_H_
