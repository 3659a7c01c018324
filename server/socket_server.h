// The daemon's own socket loops: both run on one thread each, wait with a
// wake-up fd, and stop promptly when asked (no detached threads).
//
// GrpcAcceptor: accepts on a gRPC Unix socket (the clients' or the admin
// socket), records each connection's SO_PEERCRED and which socket it came
// in on in the PeerTable, and hands the connection to gRPC. The clients'
// socket paces the connections each uid opens and bounds those each tenant
// holds, as the side socket does.
//
// SideChannel: serves the side socket: lease connections (their EOF ends
// the session at once), chunk FD claims, answered with SCM_RIGHTS, and the
// acquires and releases a session makes on its lease (one round trip, no
// gRPC: what PyTorch's cudaMalloc waits for in transparent mode).
#ifndef ALLOCD_SERVER_SOCKET_SERVER_H_
#define ALLOCD_SERVER_SOCKET_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/container/flat_hash_map.h"
#include "ipc/unix_socket.h"
#include "server/accept_pacer.h"
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

// The bounds on the connections of one socket's peers.
struct ConnectionLimits {
  // Held, per tenant and in total.
  AdmissionLimits held;
  // Opened, per uid.
  AcceptRate rate;
};

class GrpcAcceptor {
 public:
  // Listens on `path` with `mode`; `admin_socket`: its connections may
  // call the Admin service. `server`, `peers` and `core` outlive this.
  // `connections`, when given, paces the connections each uid opens to
  // this socket, and bounds those each tenant (by `core`'s tenancy) holds,
  // and all of them together: one past its uid's rate or a bound is closed
  // at once and the refusal logged, naming the flag that raises it (gRPC
  // gives a connection no way to be told why before it speaks HTTP/2; its
  // client sees the connection closed).
  static absl::StatusOr<std::unique_ptr<GrpcAcceptor>> Start(
      const std::string& path, mode_t mode, bool admin_socket,
      grpc::Server* server, PeerTable* peers, const DaemonCore* core,
      std::optional<ConnectionLimits> connections);
  ~GrpcAcceptor();  // stops and removes the socket file

 private:
  // A connection handed to gRPC and counted against its tenant. gRPC closes
  // connections without telling; it shuts a socket down before it closes
  // it, though, and a peer's close hangs it up too: the acceptor watches a
  // duplicate of each for that hang-up (a watch on gRPC's own fd would
  // vanish unseen with its close).
  struct Counted {
    UniqueFd duplicate;
    TenantId tenant;
  };

  GrpcAcceptor(std::string path, bool admin_socket, UniqueFd listener,
               UniqueFd epoll, grpc::Server* server, PeerTable* peers,
               const DaemonCore* core,
               std::optional<ConnectionLimits> connections);
  void Loop();
  // Hands `connection` to gRPC, counted against its tenant, unless that
  // passes a bound (then it is closed).
  void Admit(UniqueFd connection, const PeerCredentials& peer);
  // Gives back the connection whose duplicate `fd` hung up.
  void Forget(int fd);

  const std::string path_;
  const bool admin_socket_;
  UniqueFd listener_;
  UniqueFd epoll_;
  grpc::Server* const server_;
  PeerTable* const peers_;
  const DaemonCore* const core_;
  // Unbounded and unset for the admin socket (0600): its connections are
  // neither paced nor counted.
  AcceptPacer pacer_;
  std::optional<Admission> connections_;
  // By the duplicate's fd; the loop's thread only.
  absl::flat_hash_map<int, Counted> counted_;
  WakeFd stop_;
  std::thread thread_;
};

// The side socket never waits on one peer: reads and writes never block
// (FrameAssembler, FrameQueue), a peer that leaves a request half sent is
// closed after a short deadline while the others are served, one that does
// not read its answers gets no further request served until it does, and
// each connection gets at most one request served per round of the loop.
// Connections are paced per uid, and bounded per tenant and in total
// (`connections`): a peer refused is told why, and the refusal logged.
class SideChannel {
 public:
  // `metrics` (which outlives the channel) times the acquires and releases
  // served on leases as allocd_rpc_duration_seconds' AcquireChunks and
  // ReleaseChunks, as if they had come over gRPC.
  static absl::StatusOr<std::unique_ptr<SideChannel>> Start(
      const std::string& path, mode_t mode, DaemonCore* core, Metrics* metrics,
      ConnectionLimits connections);
  ~SideChannel();  // stops, closes every connection, removes the socket

 private:
  SideChannel(std::string path, UniqueFd listener, DaemonCore* core,
              Metrics* metrics, ConnectionLimits connections);
  void Loop();

  const std::string path_;
  UniqueFd listener_;
  DaemonCore* const core_;
  Metrics* const metrics_;
  // Taken by the loop's thread only; locked for its own sake.
  AcceptPacer pacer_;
  Admission connections_;
  WakeFd stop_;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SOCKET_SERVER_H_
