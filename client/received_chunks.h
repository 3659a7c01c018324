// ReceivedChunks: chunks the daemon handed this process (a grant, an open
// share), and SplitGrant, which parts a read-ahead's grant into the grants
// it holds. What the client's parts pass each other; it needs nothing of
// the connection they came over.
#ifndef ALLOCD_CLIENT_RECEIVED_CHUNKS_H_
#define ALLOCD_CLIENT_RECEIVED_CHUNKS_H_

#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "ipc/unix_socket.h"

namespace allocd {

// Chunks the daemon handed over, in id order: chunk i is sizes[i] bytes at
// offsets[i] of fds[i], mapped whole.
struct ReceivedChunks {
  uint64_t epoch = 0;
  std::vector<uint64_t> ids;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  uint32_t reused = 0;
  // The last client_made chunks (Acquire with client_creates) have no FD
  // (fds[i] invalid, offsets[i] 0): the process makes each itself, one
  // allocation of sizes[i], and holds and releases it as a granted one.
  uint32_t client_made = 0;

  // The bytes of all the chunks.
  uint64_t bytes() const {
    return std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  }
};

// The grants of `grant`, which holds several of `each` bytes in a row (a
// read-ahead's answer, AcquireChunksRequest.count): each its chunks,
// adding up to `each`, in order, reused chunks counted first and
// client-made ones (the answer's last) last.
// InvalidArgument when its chunks do not fall on those boundaries.
absl::StatusOr<std::vector<ReceivedChunks>> SplitGrant(ReceivedChunks grant,
                                                       uint64_t each);

}  // namespace allocd

#endif  // ALLOCD_CLIENT_RECEIVED_CHUNKS_H_
