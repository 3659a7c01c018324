#include "server/peer_table.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace allocd {

void PeerTable::Add(int fd, const PeerCredentials& credentials,
                    bool admin_socket) {
  ConnectedPeer peer;
  static_cast<PeerCredentials&>(peer) = credentials;
  peer.admin_socket = admin_socket;
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = peer;
}

absl::StatusOr<ConnectedPeer> PeerTable::Find(
    absl::string_view grpc_peer) const {
  int fd = -1;
  if (absl::ConsumePrefix(&grpc_peer, "fd:") &&
      absl::SimpleAtoi(grpc_peer,
                       &fd)) {
    absl::MutexLock lock(&mu_);
    if (auto it = by_fd_.find(fd); it != by_fd_.end()) return it->second;
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "unknown peer \"", grpc_peer,
      "\": allocd serves only connections it accepted on its sockets"));
}

}  // namespace allocd
