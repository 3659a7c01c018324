// The daemon's own socket loops: both run on one thread each, poll() with a
// wake-up fd, and stop promptly when asked (no detached threads).
//
// GrpcAcceptor: accepts on a gRPC Unix socket (the clients' or the admin
// socket), records each connection's SO_PEERCRED and which socket it came
// in on in the PeerTable, and hands the connection to gRPC. The clients'
// socket bounds the connections each tenant holds, as the side socket does.
//
// SideChannel: serves the side socket: lease connections (their EOF ends
// the session at once), chunk FD claims, answered with SCM_RIGHTS, and the
// acquires and releases a session makes on its lease (one round trip, no
// gRPC: what PyTorch's cudaMalloc waits for in transparent mode).
#ifndef ALLOCD_SERVER_SOCKET_SERVER_H_
#define ALLOCD_SERVER_SOCKET_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "ipc/unix_socket.h"
#include "server/admission.h"
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
  // Listens on `path` with `mode`; `admin_socket`: its connections may
  // call the Admin service. `server`, `peers` and `core` outlive this.
  // `connections`, when given, bounds the connections each tenant (by
  // `core`'s tenancy) holds to this socket, and all of them together: one
  // past a bound is closed at once and the refusal logged, naming the flag
  // that raises it (gRPC gives a connection no way to be told why before
  // it speaks HTTP/2; its client sees the connection closed).
  static absl::StatusOr<std::unique_ptr<GrpcAcceptor>> Start(
      const std::string& path, mode_t mode, bool admin_socket,
      grpc::Server* server, PeerTable* peers, const DaemonCore* core,
      std::optional<AdmissionLimits> connections);
  ~GrpcAcceptor();  // stops and removes the socket file

 private:
  // A connection handed to gRPC and counted against its tenant. gRPC closes
  // connections without telling, so the acceptor knows one is gone when
  // its fd number no longer names the socket it accepted (by inode).
  struct Handed {
    ino_t inode;
    TenantId tenant;
  };

  GrpcAcceptor(std::string path, bool admin_socket, UniqueFd listener,
               grpc::Server* server, PeerTable* peers, const DaemonCore* core,
               std::optional<AdmissionLimits> connections);
  void Loop();
  void Accept();
  // Gives back the connections gRPC has closed since the last look.
  void ForgetClosed();

  const std::string path_;
  const bool admin_socket_;
  UniqueFd listener_;
  grpc::Server* const server_;
  PeerTable* const peers_;
  const DaemonCore* const core_;
  // Unset: connections are not counted (the admin socket, 0600).
  std::optional<Admission> connections_;
  // By fd number; the loop's thread only.
  std::map<int, Handed> handed_;
  WakeFd stop_;
  std::thread thread_;
};

// The side socket never waits on one peer: reads and writes never block
// (FrameAssembler, FrameQueue), a peer that leaves a request half sent is
// closed after a short deadline while the others are served, one that does
// not read its answers gets no further request served until it does, and
// each connection gets at most one request served per round of the loop.
// Connections are bounded per tenant and in total (`connections`): a peer
// refused is told why, and the refusal logged.
class SideChannel {
 public:
  // `metrics` (which outlives the channel) times the acquires and releases
  // served on leases as allocd_rpc_duration_seconds' AcquireChunks and
  // ReleaseChunks, as if they had come over gRPC.
  static absl::StatusOr<std::unique_ptr<SideChannel>> Start(
      const std::string& path, mode_t mode, DaemonCore* core, Metrics* metrics,
      AdmissionLimits connections);
  ~SideChannel();  // stops, closes every connection, removes the socket

 private:
  SideChannel(std::string path, UniqueFd listener, DaemonCore* core,
              Metrics* metrics, AdmissionLimits connections);
  void Loop();

  const std::string path_;
  UniqueFd listener_;
  DaemonCore* const core_;
  Metrics* const metrics_;
  // Taken by the loop's thread only; locked for its own sake.
  Admission connections_;
  WakeFd stop_;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SOCKET_SERVER_H_
