// ChunkReleaser: chunks go back to the daemon off the freeing thread.
//
// A process that frees memory (PyTorch's cudaFree of a segment, an
// empty_cache of dozens) waited one ReleaseChunks round trip per segment,
// under the interposer's one lock, so every other allocating thread waited
// too. Here the caller hands the chunk ids over and returns; one
// background thread delivers them at once, and what is handed over while
// a delivery is in flight goes in the next, so a burst of frees costs the
// daemon a few calls and the freeing threads none. The daemon hears of a
// release within about a round trip; Flush waits for it where the caller
// needs the daemon to have heard (an acquire it could not grant at once, a
// reclaim request).
//
// The caller forgets the chunks before it hands them over (HeldChunks), so
// they are nobody's to map or re-declare while they wait here, and the
// daemon grants them to no one (this process included) until it hears.
//
// Thread-safe. One background thread.
#ifndef ALLOCD_CLIENT_CHUNK_RELEASER_H_
#define ALLOCD_CLIENT_CHUNK_RELEASER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/daemon_connection.h"

namespace allocd {

class ChunkReleaser {
 public:
  // Releases `ids` on the session of `owner` (ReleaseChunks, in as many
  // calls as it takes); on the background thread, or in the destructor.
  using Deliver = std::function<void(const std::shared_ptr<Connection>& owner,
                                     std::vector<uint64_t> ids)>;

  explicit ChunkReleaser(Deliver deliver);
  // Delivers what is handed over, then stops.
  ~ChunkReleaser();
  ChunkReleaser(const ChunkReleaser&) = delete;
  ChunkReleaser& operator=(const ChunkReleaser&) = delete;

  // Hands over chunks `ids`, which the session of `owner` holds in the
  // daemon's books, for release; returns at once.
  void Add(std::shared_ptr<Connection> owner, std::vector<uint64_t> ids)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once everything handed over before the call is delivered;
  // whether some of it was not yet.
  bool Flush() ABSL_LOCKS_EXCLUDED(mu_);

  // Chunks handed over and not yet delivered.
  size_t pending_chunks() const ABSL_LOCKS_EXCLUDED(mu_);
  // Deliver calls made: one per session per batch.
  uint64_t deliveries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // What one session's chunks wait for: one Deliver.
  struct Batch {
    std::shared_ptr<Connection> owner;
    std::vector<uint64_t> ids;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const Deliver deliver_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Not yet taken for delivery, a batch per session.
  std::vector<Batch> waiting_ ABSL_GUARDED_BY(mu_);
  // Chunks handed over and not delivered: waiting, and in flight.
  size_t pending_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  // Add calls made, and how many of the first of them are delivered.
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deliveries_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CHUNK_RELEASER_H_
