// GrantReadAhead: the daemon's next grant, asked for before the process
// needs it.
//
// A process that fills its cache segment after segment of one size
// (PyTorch taking a model's working set in 2 GiB cudaMallocs) pays a round
// trip to the daemon for each segment, then maps it. From the second
// request in a row of one size on, the next grant of that size is asked for
// in the background as soon as the caller has its own, so the round trip
// runs while the caller maps; the caller's next request of that size takes
// the parked grant without asking.
//
// Memory read ahead is the session's in the daemon's books but no
// segment's, so it is held briefly and given back early:
// - at most one grant is parked, for at most `keep`;
// - a request of another size gives it back first (before the caller asks
//   for its own, so the two never count against a quota together);
// - Drop() gives it back (the daemon asked the session to give memory back);
// - a fetch is never one that waits for other sessions to give memory
//   back: Fetch answers nullopt then, and nothing is read ahead until the
//   size changes.
//
// Thread-safe. One background thread fetches and gives back.
#ifndef ALLOCD_CLIENT_GRANT_READ_AHEAD_H_
#define ALLOCD_CLIENT_GRANT_READ_AHEAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/daemon_client.h"

namespace allocd {

class GrantReadAhead {
 public:
  // What a grant was asked for with (DaemonClient::Acquire's arguments).
  struct Key {
    uint64_t bytes = 0;
    uint64_t max_chunk_bytes = 0;
    bool operator==(const Key&) const = default;
  };
  // A grant the daemon gives at once, or nullopt (it would wait for other
  // sessions, it is away, or it refused).
  using Fetch = std::function<std::optional<ReceivedChunks>(const Key&)>;
  // Returns a grant nobody took to the daemon.
  using GiveBack = std::function<void(ReceivedChunks)>;


  GrantReadAhead(Fetch fetch, GiveBack give_back, absl::Duration keep);
  // Waits for a fetch in flight; gives back what is parked.
  ~GrantReadAhead();
  GrantReadAhead(const GrantReadAhead&) = delete;
  GrantReadAhead& operator=(const GrantReadAhead&) = delete;

  // The grant read ahead for `key`, waiting for one in flight; nullopt when
  // there is none (a parked grant of another key is given back first).
  std::optional<ReceivedChunks> Take(const Key& key);
  // The caller holds a grant of `key` (taken or its own): from the second
  // in a row of one key, the next is read ahead.
  void Granted(const Key& key);
  // Gives back what is parked and what a fetch in flight brings.
  void Drop();

  uint64_t parked_bytes() const;

 private:
  struct Parked {
    Key key;
    ReceivedChunks chunks;
    absl::Time until;
  };
  void Run();

  const Fetch fetch_;
  const GiveBack give_back_;
  const absl::Duration keep_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The last key Granted, how many times in a row, and whether the daemon
  // refused to read it ahead.
  std::optional<Key> last_ ABSL_GUARDED_BY(mu_);
  int run_ ABSL_GUARDED_BY(mu_) = 0;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Key> wanted_ ABSL_GUARDED_BY(mu_);
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped by Drop: a fetch that began before brings back nothing to keep.
  uint64_t drops_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Parked> parked_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_GRANT_READ_AHEAD_H_
