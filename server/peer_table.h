// PeerTable: the kernel's credentials of each connection the daemon handed
// to gRPC. gRPC does not tell a handler who is calling over a Unix socket,
// so the daemon accepts connections itself, reads SO_PEERCRED, and gives
// gRPC the fd; for such channels ServerContext::peer() is "fd:N", which this
// table maps back to the credentials. Thread-safe.
#ifndef ALLOCD_SERVER_PEER_TABLE_H_
#define ALLOCD_SERVER_PEER_TABLE_H_

#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ipc/unix_socket.h"

namespace allocd {

// A connection's credentials, and the socket it came in on.
struct ConnectedPeer : PeerCredentials {
  // The admin socket (the Admin service answers only there), not the
  // clients'.
  bool admin_socket = false;
};

class PeerTable {
 public:
  // Records the credentials of connection `fd`, accepted on the admin
  // socket or not, replacing those of an earlier connection that had the
  // same fd number (it is closed by then).
  void Add(int fd, const PeerCredentials& credentials, bool admin_socket);

  // The connection gRPC names `grpc_peer`. Unauthenticated for a peer the
  // daemon did not accept itself.
  absl::StatusOr<ConnectedPeer> Find(absl::string_view grpc_peer) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, ConnectedPeer> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_PEER_TABLE_H_
