#include "server/grpc_services.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace allocd {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// Moves a result into the response, or passes its error on.
template <typename T>
absl::Status Into(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return result.status();
  *response = std::move(*result);
  return absl::OkStatus();
}

// Runs `body(peer)` for an authenticated caller and times it.
template <typename Body>
grpc::Status Handle(Metrics* metrics, const PeerTable* peers,
                    grpc::ServerContext* context, absl::string_view method,
                    Body&& body) {
  const absl::Time start = absl::Now();
  absl::StatusOr<ConnectedPeer> peer = peers->Find(context->peer());
  const absl::Status status = peer.ok() ? body(*peer) : peer.status();
  metrics->Rpc(method, absl::ToDoubleSeconds(absl::Now() - start),
               status.ok());
  return ToGrpc(status);
}

// How often a WatchConfig stream looks whether its client went away.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);

}  // namespace

grpc::Status AllocdService::Register(grpc::ServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) {
  return Handle(metrics_, peers_, context, "Register",
                [&](const PeerCredentials& peer) {
                  return Into(core_->Register(peer, *request), response);
                });
}

namespace {

// A grant's answer (AcquireChunks, OpenShare), given back when the client
// gave up waiting for it: no chunk may stay granted to a client that does
// not know of it.
absl::Status GrantOrAbandon(DaemonCore* core, grpc::ServerContext* context,
                            absl::StatusOr<v1::AcquireChunksResponse> grant,
                            v1::AcquireChunksResponse* response) {
  absl::Status s = Into(std::move(grant), response);
  if (s.ok() && context->IsCancelled()) {
    core->AbandonGrant(response->claim_token(), "its client gave up waiting");
    return absl::CancelledError(
        "the client gave up before the chunks were granted");
  }
  return s;
}

}  // namespace

grpc::Status AllocdService::AcquireChunks(
    grpc::ServerContext* context, const v1::AcquireChunksRequest* request,
    v1::AcquireChunksResponse* response) {
  return Handle(metrics_, peers_, context, "AcquireChunks",
                [&](const PeerCredentials& peer) {
                  return GrantOrAbandon(core_, context,
                                        core_->AcquireChunks(peer, *request),
                                        response);
                });
}

grpc::Status AllocdService::ShareChunks(grpc::ServerContext* context,
                                        const v1::ShareChunksRequest* request,
                                        v1::ShareChunksResponse* response) {
  return Handle(metrics_, peers_, context, "ShareChunks",
                [&](const PeerCredentials& peer) {
                  return Into(core_->ShareChunks(peer, *request), response);
                });
}

grpc::Status AllocdService::OpenShare(grpc::ServerContext* context,
                                      const v1::OpenShareRequest* request,
                                      v1::AcquireChunksResponse* response) {
  return Handle(
      metrics_, peers_, context, "OpenShare", [&](const PeerCredentials& peer) {
        return GrantOrAbandon(core_, context, core_->OpenShare(peer, *request),
                              response);
      });
}

grpc::Status AllocdService::CloseShare(grpc::ServerContext* context,
                                       const v1::CloseShareRequest* request,
                                       v1::CloseShareResponse* response) {
  return Handle(metrics_, peers_, context, "CloseShare",
                [&](const PeerCredentials& peer) {
                  return Into(core_->CloseShare(peer, *request), response);
                });
}

grpc::Status AllocdService::ReleaseChunks(
    grpc::ServerContext* context, const v1::ReleaseChunksRequest* request,
    v1::ReleaseChunksResponse* response) {
  return Handle(metrics_, peers_, context, "ReleaseChunks",
                [&](const PeerCredentials& peer) {
                  return Into(core_->ReleaseChunks(peer, *request), response);
                });
}

grpc::Status AllocdService::StreamTelemetry(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::TelemetryReport>* reader, v1::TelemetryAck*) {
  absl::StatusOr<ConnectedPeer> peer = peers_->Find(context->peer());
  if (!peer.ok()) return ToGrpc(peer.status());
  v1::TelemetryReport report;
  while (reader->Read(&report)) {
    if (absl::Status s = core_->Telemetry(*peer, report); !s.ok()) {
      return ToGrpc(s);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AllocdService::WatchConfig(
    grpc::ServerContext* context, const v1::WatchConfigRequest* request,
    grpc::ServerWriter<v1::ControlMessage>* writer) {
  absl::StatusOr<ConnectedPeer> peer = peers_->Find(context->peer());
  if (!peer.ok()) return ToGrpc(peer.status());
  absl::StatusOr<std::shared_ptr<Session>> session = core_->Watch(
      *peer, request->session_id(), request->session_secret());
  if (!session.ok()) return ToGrpc(session.status());
  v1::ControlMessage message;
  while (!context->IsCancelled() && !(*session)->closed()) {
    if (!(*session)->WaitNext(&message, kWatchPoll)) continue;
    if (!writer->Write(message)) break;
  }
  return grpc::Status::OK;
}

grpc::Status AllocdService::AckConfig(grpc::ServerContext* context,
                                      const v1::ConfigAck* request,
                                      v1::AckResponse*) {
  return Handle(metrics_, peers_, context, "AckConfig",
                [&](const PeerCredentials& peer) {
                  return core_->AckConfig(peer, *request);
                });
}

grpc::Status AllocdService::ReportOom(grpc::ServerContext* context,
                                      const v1::OomReport* request,
                                      v1::OomResponse* response) {
  return Handle(metrics_, peers_, context, "ReportOom",
                [&](const PeerCredentials& peer) {
                  return Into(core_->ReportOom(peer, *request), response);
                });
}

grpc::Status AllocdService::LearnedConfig(
    grpc::ServerContext* context, const v1::LearnedConfigRequest* request,
    v1::LearnedConfigResponse* response) {
  return Handle(metrics_, peers_, context, "LearnedConfig",
                [&](const PeerCredentials& peer) {
                  return Into(core_->LearnedConfig(peer, *request), response);
                });
}

// ------------------------------------------------------------------ admin

namespace {

// Handle, for callers on the admin socket (`admin_socket`) allowed to
// administer the daemon only. The clients' socket refuses every Admin call,
// root's too: a job running as root in its container is no admin.
template <typename Body>
grpc::Status HandleAdmin(DaemonCore* core, absl::string_view admin_socket,
                         Metrics* metrics, const PeerTable* peers,
                         grpc::ServerContext* context,
                         absl::string_view method, Body&& body) {
  return Handle(
      metrics, peers, context, method, [&](const ConnectedPeer& peer) {
        if (!peer.admin_socket) {
          return absl::PermissionDeniedError(absl::StrCat(
              "the Admin service answers on the admin socket only (",
              admin_socket,
              "), not on the clients' socket: run allocctl where it can "
              "reach that socket, as root, the daemon's uid, an --admin-uid "
              "or a member of --admin-group (in Kubernetes: kubectl exec "
              "into allocd's pod)"));
        }
        if (absl::Status s = core->CheckAdmin(peer); !s.ok()) return s;
        return body(peer);
      });
}

}  // namespace

grpc::Status AdminService::Status(grpc::ServerContext* context,
                                  const v1::StatusRequest*,
                                  v1::StatusResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.Status",
                     [&](const PeerCredentials&) {
                       *response = core_->Status();
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::ListSessions(grpc::ServerContext* context,
                                        const v1::ListSessionsRequest*,
                                        v1::ListSessionsResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.ListSessions",
                     [&](const PeerCredentials&) {
                       *response = core_->ListSessions();
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::GetConfig(grpc::ServerContext* context,
                                     const v1::GetConfigRequest* request,
                                     v1::GetConfigResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.GetConfig",
                     [&](const PeerCredentials&) {
                       *response = core_->GetConfig(request->job());
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::SetConfig(grpc::ServerContext* context,
                                     const v1::SetConfigRequest* request,
                                     v1::SetConfigResponse* response) {
  return HandleAdmin(
      core_, admin_socket_, metrics_, peers_, context, "Admin.SetConfig",
      [&](const PeerCredentials& peer) {
        return Into(core_->SetConfig(request->job(), request->config(),
                                     "uid " + std::to_string(peer.uid) +
                                         " via the Admin service",
                                     request->predicted_peak_reserved_bytes()),
                    response);
      });
}

grpc::Status AdminService::SetQuota(grpc::ServerContext* context,
                                    const v1::SetQuotaRequest* request,
                                    v1::SetQuotaResponse*) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.SetQuota",
                     [&](const PeerCredentials&) {
                       return core_->SetQuota(*request);
                     });
}

grpc::Status AdminService::History(grpc::ServerContext* context,
                                   const v1::HistoryRequest* request,
                                   v1::HistoryResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.History",
                     [&](const PeerCredentials&) {
                       *response =
                           core_->History(request->job(), request->limit());
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::TrimPool(grpc::ServerContext* context,
                                    const v1::TrimPoolRequest* request,
                                    v1::TrimPoolResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.TrimPool",
                     [&](const PeerCredentials&) {
                       absl::StatusOr<v1::TrimPoolResponse> trimmed =
                           core_->TrimPool(request->device());
                       if (!trimmed.ok()) return trimmed.status();
                       *response = *std::move(trimmed);
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::AutotuneStatus(grpc::ServerContext* context,
                                          const v1::AutotuneStatusRequest*,
                                          v1::AutotuneStatusResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.AutotuneStatus",
                     [&](const PeerCredentials&) {
                       *response = autotune_->Status();
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::AutotuneHistory(
    grpc::ServerContext* context, const v1::AutotuneHistoryRequest* request,
    v1::AutotuneHistoryResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.AutotuneHistory",
                     [&](const PeerCredentials&) {
                       *response = autotune_->History(request->job(),
                                                      request->limit());
                       return absl::OkStatus();
                     });
}

grpc::Status AdminService::AutotuneRun(grpc::ServerContext* context,
                                       const v1::AutotuneRunRequest* request,
                                       v1::AutotuneRunResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.AutotuneRun",
                     [&](const PeerCredentials&) {
                       return Into(autotune_->Run(request->job()), response);
                     });
}

grpc::Status AdminService::AutotuneSetMode(
    grpc::ServerContext* context, const v1::AutotuneSetModeRequest* request,
    v1::AutotuneSetModeResponse*) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.AutotuneSetMode",
                     [&](const PeerCredentials&) {
                       return autotune_->SetMode(request->job(),
                                                 request->mode());
                     });
}

grpc::Status AdminService::AutotuneLearned(grpc::ServerContext* context,
                                           const v1::AutotuneLearnedRequest*,
                                           v1::AutotuneLearnedResponse* response) {
  return HandleAdmin(core_, admin_socket_, metrics_, peers_, context, "Admin.AutotuneLearned",
                     [&](const PeerCredentials&) {
                       *response = autotune_->Learned();
                       return absl::OkStatus();
                     });
}

}  // namespace allocd
