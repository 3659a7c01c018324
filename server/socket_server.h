// The daemon's own socket loops: both run on one thread each, poll() with a
// wake-up fd, and stop promptly when asked (no detached threads).
//
// GrpcAcceptor: accepts on a gRPC Unix socket, records each connection's
// SO_PEERCRED in the PeerTable and hands the connection to gRPC.
//
// SideChannel: serves the side socket: lease connections (their EOF ends
// the session at once), chunk FD claims, answered with SCM_RIGHTS, and the
// acquires and releases a session makes on its lease (one round trip, no
// gRPC: what PyTorch's cudaMalloc waits for in transparent mode).
#ifndef ALLOCD_SERVER_SOCKET_SERVER_H_
#define ALLOCD_SERVER_SOCKET_SERVER_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "ipc/unix_socket.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/peer_table.h"

namespace grpc {
class Server;
}

namespace allocd {

// An eventfd that wakes a poll() loop.
class WakeFd {
 public:
  WakeFd();
  int fd() const { return fd_.get(); }
  void Wake();

 private:
  UniqueFd fd_;
};

class GrpcAcceptor {
 public:
  // Listens on `path` with `mode`. `server` and `peers` outlive this.
  static absl::StatusOr<std::unique_ptr<GrpcAcceptor>> Start(
      const std::string& path, mode_t mode, grpc::Server* server,
      PeerTable* peers);
  ~GrpcAcceptor();  // stops and removes the socket file

 private:
  GrpcAcceptor(std::string path, UniqueFd listener, grpc::Server* server,
               PeerTable* peers);
  void Loop();

  const std::string path_;
  UniqueFd listener_;
  grpc::Server* const server_;
  PeerTable* const peers_;
  WakeFd stop_;
  std::thread thread_;
};

class SideChannel {
 public:
  // `metrics` (which outlives the channel) times the acquires and releases
  // served on leases as allocd_rpc_duration_seconds' AcquireChunks and
  // ReleaseChunks, as if they had come over gRPC.
  static absl::StatusOr<std::unique_ptr<SideChannel>> Start(
      const std::string& path, mode_t mode, DaemonCore* core,
      Metrics* metrics);
  ~SideChannel();  // stops, closes every connection, removes the socket

 private:
  SideChannel(std::string path, UniqueFd listener, DaemonCore* core,
              Metrics* metrics);
  void Loop();

  const std::string path_;
  UniqueFd listener_;
  DaemonCore* const core_;
  Metrics* const metrics_;
  WakeFd stop_;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SOCKET_SERVER_H_
