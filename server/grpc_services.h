// The gRPC faces of DaemonCore: allocd.v1.Allocd for clients and
// allocd.v1.Admin for allocctl. Each handler looks up the caller's kernel
// credentials (PeerTable), calls the core, and maps absl::Status codes to
// gRPC's (the numbering is the same). Every RPC is timed into
// allocd_rpc_duration_seconds. The Admin service answers only connections
// accepted on the admin socket (PermissionDenied naming it otherwise), and
// only callers SessionAccess::CheckAdmin allows.
#ifndef ALLOCD_SERVER_GRPC_SERVICES_H_
#define ALLOCD_SERVER_GRPC_SERVICES_H_

#include <string>
#include <utility>

#include "allocd.grpc.pb.h"
#include "server/daemon_autotune.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/peer_table.h"

namespace allocd {

class AllocdService final : public v1::Allocd::Service {
 public:
  AllocdService(DaemonCore* core, const PeerTable* peers, Metrics* metrics)
      : core_(core), peers_(peers), metrics_(metrics) {}

  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status AcquireChunks(grpc::ServerContext* context,
                             const v1::AcquireChunksRequest* request,
                             v1::AcquireChunksResponse* response) override;
  grpc::Status ReleaseChunks(grpc::ServerContext* context,
                             const v1::ReleaseChunksRequest* request,
                             v1::ReleaseChunksResponse* response) override;
  grpc::Status ShareChunks(grpc::ServerContext* context,
                           const v1::ShareChunksRequest* request,
                           v1::ShareChunksResponse* response) override;
  grpc::Status OpenShare(grpc::ServerContext* context,
                         const v1::OpenShareRequest* request,
                         v1::AcquireChunksResponse* response) override;
  grpc::Status CloseShare(grpc::ServerContext* context,
                          const v1::CloseShareRequest* request,
                          v1::CloseShareResponse* response) override;
  grpc::Status StreamTelemetry(grpc::ServerContext* context,
                               grpc::ServerReader<v1::TelemetryReport>* reader,
                               v1::TelemetryAck* response) override;
  grpc::Status WatchConfig(
      grpc::ServerContext* context, const v1::WatchConfigRequest* request,
      grpc::ServerWriter<v1::ControlMessage>* writer) override;
  grpc::Status AckConfig(grpc::ServerContext* context,
                         const v1::ConfigAck* request,
                         v1::AckResponse* response) override;
  grpc::Status ReportOom(grpc::ServerContext* context,
                         const v1::OomReport* request,
                         v1::OomResponse* response) override;
  grpc::Status LearnedConfig(grpc::ServerContext* context,
                             const v1::LearnedConfigRequest* request,
                             v1::LearnedConfigResponse* response) override;

 private:
  DaemonCore* const core_;
  const PeerTable* const peers_;
  Metrics* const metrics_;
};

class AdminService final : public v1::Admin::Service {
 public:
  // `admin_socket`: where admins reach the service, for the refusal on the
  // clients' socket to name it.
  AdminService(DaemonCore* core, DaemonAutotune* autotune,
               const PeerTable* peers, Metrics* metrics,
               std::string admin_socket)
      : core_(core),
        autotune_(autotune),
        peers_(peers),
        metrics_(metrics),
        admin_socket_(std::move(admin_socket)) {}

  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request,
                      v1::StatusResponse* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context,
                            const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status GetConfig(grpc::ServerContext* context,
                         const v1::GetConfigRequest* request,
                         v1::GetConfigResponse* response) override;
  grpc::Status SetConfig(grpc::ServerContext* context,
                         const v1::SetConfigRequest* request,
                         v1::SetConfigResponse* response) override;
  grpc::Status SetQuota(grpc::ServerContext* context,
                        const v1::SetQuotaRequest* request,
                        v1::SetQuotaResponse* response) override;
  grpc::Status History(grpc::ServerContext* context,
                       const v1::HistoryRequest* request,
                       v1::HistoryResponse* response) override;
  grpc::Status TrimPool(grpc::ServerContext* context,
                        const v1::TrimPoolRequest* request,
                        v1::TrimPoolResponse* response) override;
  grpc::Status AutotuneStatus(grpc::ServerContext* context,
                              const v1::AutotuneStatusRequest* request,
                              v1::AutotuneStatusResponse* response) override;
  grpc::Status AutotuneHistory(grpc::ServerContext* context,
                               const v1::AutotuneHistoryRequest* request,
                               v1::AutotuneHistoryResponse* response) override;
  grpc::Status AutotuneRun(grpc::ServerContext* context,
                           const v1::AutotuneRunRequest* request,
                           v1::AutotuneRunResponse* response) override;
  grpc::Status AutotuneSetMode(grpc::ServerContext* context,
                               const v1::AutotuneSetModeRequest* request,
                               v1::AutotuneSetModeResponse* response) override;
  grpc::Status AutotuneLearned(grpc::ServerContext* context,
                               const v1::AutotuneLearnedRequest* request,
                               v1::AutotuneLearnedResponse* response) override;

 private:
  DaemonCore* const core_;
  DaemonAutotune* const autotune_;
  const PeerTable* const peers_;
  Metrics* const metrics_;
  const std::string admin_socket_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_GRPC_SERVICES_H_
