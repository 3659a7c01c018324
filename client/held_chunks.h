// HeldChunks: every chunk the process holds (granted and not released),
// and which daemon session owns each in its books.
//
// When the daemon goes away and comes back, the new session re-declares
// them before it serves any call (DeclareTo), so the restarted daemon
// counts them and promises their memory to nobody else (NodePool::Adopt).
// What the client proves: in sim mode the chunk's memfd (the client keeps
// an FD of each chunk it holds, and passes a copy back); with CUDA, ids and
// sizes alone, since the client holds the imported allocation handles but
// exporting each again would cost about 1 ms per chunk. Chunks the new
// daemon adopted are released to it as usual (with the epoch they were
// granted in); one it refused stays mapped and usable, and its release
// only drops it here.
//
// Thread-safe. Lock order: mu_, then ActiveConnection's (Forget reads the
// current connection under mu_).
#ifndef ALLOCD_CLIENT_HELD_CHUNKS_H_
#define ALLOCD_CLIENT_HELD_CHUNKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/daemon_connection.h"
#include "client/received_chunks.h"
#include "ipc/unix_socket.h"

namespace allocd {

class HeldChunks {
 public:
  // Records `chunks`, granted on `c`, as held and owned by its session.
  // False, recording nothing, when a newer connection's declaration began
  // meanwhile: the new daemon has heard what the process holds already,
  // so they are nobody's now (the caller drops them and asks again).
  bool Record(const Connection& c, const ReceivedChunks& chunks)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets chunks `ids` of `epoch`. Returns the current connection of
  // `active` and those of `ids` its session owns (to release on it), read
  // together with the book so that no restart falls between the two.
  struct Forgotten {
    std::shared_ptr<Connection> owner;
    std::vector<uint64_t> ids;
  };
  Forgotten Forget(uint64_t epoch, absl::Span<const uint64_t> ids,
                   const ActiveConnection& active) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the session of `c` owns every chunk of `ids` granted in
  // `epoch`: it granted them, or adopted them after a restart.
  bool OwnedBy(const Connection& c, uint64_t epoch,
               absl::Span<const uint64_t> ids) const ABSL_LOCKS_EXCLUDED(mu_);

  // After a reconnect, before `c` serves calls: re-declares every chunk
  // held to its daemon (SideRequest.declare, in frames of
  // kMaxFdsPerMessage) and records which it adopted; those released
  // meanwhile are released on `c`. From here on, chunks an Acquire on an
  // older connection claims are not recorded (Record). A daemon that goes
  // away again ends the declaration: the next one gets them.
  void DeclareTo(Connection& c, absl::Duration rpc_timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A chunk the process holds, by the epoch it was granted in and its id.
  using Key = std::pair<uint64_t, uint64_t>;
  struct Chunk {
    uint64_t bytes = 0;
    uint64_t offset = 0;
    // An FD of the chunk, to prove it to a restarted daemon (declare_fds);
    // invalid when that daemon takes ids and sizes alone.
    UniqueFd proof;
    // The epoch of the session that owns it in its daemon's books: the
    // granting one, then the one a restarted daemon adopted it into; 0
    // when a restarted daemon refused it (it is nobody's to release).
    uint64_t owner_epoch = 0;
  };
  // The epoch of the session that owns chunk `id` of `epoch`: not held
  // (never recorded, a claim that failed) is its granting session's.
  uint64_t OwnerEpoch(uint64_t epoch, uint64_t id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<Key, Chunk> held_ ABSL_GUARDED_BY(mu_);
  // The epoch of the newest connection whose declaration began.
  uint64_t declared_epoch_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_HELD_CHUNKS_H_
