#include "client/daemon_client.h"

#include <utility>

#include "client/client_env.h"
#include "ipc/unix_socket.h"

namespace allocd {

v1::JobFeatures StartFeatures() {
  // A declaration that does not parse was refused where the process read
  // its environment (ClientEnv); a client configured otherwise keeps what
  // NCCL's variable says.
  absl::StatusOr<v1::JobFeatures> declared = DeclaredFeatures();
  if (declared.ok()) return *std::move(declared);
  v1::JobFeatures features;
  features.set_nccl_registration(NcclRegistersSegments());
  return features;
}

namespace {

// The descriptor table a client reserves when it connects (ReserveFdTable).
constexpr int kFdTableSlots = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonClient>> DaemonClient::Connect(
    DaemonClientOptions options) {
  // Grants arrive as FDs, a read-ahead's up to GrantReadAhead::kMaxBatch
  // segments' at once, on top of the ~50 a fresh CUDA process holds in a
  // table of 64: the table grows here, once, rather than under a grant the
  // process waits for. Best effort: without it grants still arrive, later.
  (void)ReserveFdTable(kFdTableSlots);
  absl::StatusOr<std::shared_ptr<Connection>> first =
      Register(options, 1, RunningConfig{});
  if (!first.ok()) return first.status();
  return std::unique_ptr<DaemonClient>(
      new DaemonClient(std::move(options), *std::move(first)));
}

DaemonClient::DaemonClient(DaemonClientOptions options,
                           std::shared_ptr<Connection> first)
    : options_(std::move(options)),
      handed_working_set_(first->working_set),
      active_(std::move(first)),
      telemetry_(options_, active_),
      control_(active_, options_.rpc_timeout,
               [this] { return grants_.GiveBackForReclaim(); }),
      grants_(options_, active_, held_,
              [this](uint64_t bytes) {
                telemetry_.SetUnusedBytes(TelemetryStream::Unused::kReadAhead, bytes);
              }),
      reconnector_(options_, {.active = active_,
                              .held = held_,
                              .control = control_,
                              .telemetry = telemetry_}) {
  // It started on the job's learned config, which the daemon knows under a
  // version: reported from now on, and declared should it reconnect.
  if (const std::shared_ptr<Connection> c = active_.Current();
      c != nullptr && c->running_version != 0) {
    reconnector_.SetRunning(options_.started_on_learned, c->running_version);
  }
}

DaemonClient::~DaemonClient() {
  // Both threads end before the read-ahead gives back what it holds (the
  // session thread reads it) as grants_ goes.
  reconnector_.Stop();
  telemetry_.Stop();
}

std::string DaemonClient::start_config_source() const {
  std::shared_ptr<Connection> c = active_.Current();
  return c == nullptr || c->start_config_source.empty() ? "own" : c->start_config_source;
}

uint64_t DaemonClient::stream_from_reserved() const {
  std::shared_ptr<Connection> c = active_.Current();
  return c == nullptr ? 0 : c->stream_from_reserved;
}

uint64_t DaemonClient::session_id() const {
  std::shared_ptr<Connection> c = active_.Current();
  return c == nullptr ? 0 : c->session_id;
}

}  // namespace allocd
