// GrantReadAhead: the daemon's next grants, asked for before the process
// needs them.
//
// A process that fills its cache segment after segment of one size
// (PyTorch taking a model's working set in 2 GiB cudaMallocs) pays a round
// trip to the daemon for each segment, then maps it. From the second
// request in a row of one size on, the next grants of that size are asked
// for in the background as soon as the caller has its own, so the round
// trip runs while the caller maps; the caller's next requests of that size
// take the parked grants without asking. Each fetch of a run asks for
// twice as many grants as the last (1, 2, 4, ... up to kMaxBatch), so a
// long run pays one round trip per kMaxBatch segments and a short one
// holds little it will not use.
//
// Memory read ahead is the session's in the daemon's books but no
// segment's, so it is held briefly and given back early:
// - at most one fetch's grants are parked, for at most `keep`;
// - a request of another size gives them back first (before the caller
//   asks for its own, so the two never count against a quota together);
// - Drop() gives them back (the daemon asked the session to give memory
//   back);
// - a grant the caller asks for itself ahead of a need it foresees
//   (BeginPark, Park: the pre-warm of a recurring peak) is parked as a
//   fetch's are, and the request it foresees, come while it is asked for,
//   waits for it as for a fetch;
// - a fetch is never one that waits for other sessions to give memory
//   back, nor one that makes the daemon create memory: Fetch answers
//   nothing then, and nothing is read ahead until the size changes or the
//   caller's own grant is one the daemon made no memory for (a process
//   that frees its working set and takes it again reads ahead the second
//   time);
// - for a caller that makes the chunks the daemon has not cached
//   (Key::client_creates), the daemon grants those as budget: a cold pool
//   is read ahead too, holding no memory, and so is a peak gathered from
//   what a reclaim brought back (the neighbour's chunks made in its own
//   process leave the pool when released: the grants after the reclaim
//   are budget), though fetches refused while the pool was short came
//   before.
//
// Thread-safe. One background thread fetches and gives back.
#ifndef ALLOCD_CLIENT_GRANT_READ_AHEAD_H_
#define ALLOCD_CLIENT_GRANT_READ_AHEAD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/received_chunks.h"

namespace allocd {

class GrantReadAhead {
 public:
  // What a grant was asked for with (ChunkGrants::Acquire's arguments).
  struct Key {
    uint64_t bytes = 0;
    uint64_t max_chunk_bytes = 0;
    // The caller makes what the daemon has not cached: a grant read ahead
    // may be budget only (client-made chunks), which holds no memory.
    bool client_creates = false;
    bool operator==(const Key&) const = default;
  };
  // Up to `count` grants of `key` (each one segment's chunks) that the
  // daemon gives at once from its cache; none when it would wait for other
  // sessions or create memory, is away, or refused.
  using Fetch =
      std::function<std::vector<ReceivedChunks>(const Key&, uint32_t count)>;
  // Returns a grant nobody took to the daemon.
  using GiveBack = std::function<void(ReceivedChunks)>;

  // The most grants one fetch asks for.
  static constexpr uint32_t kMaxBatch = 8;

  GrantReadAhead(Fetch fetch, GiveBack give_back, absl::Duration keep);
  // Waits for a fetch in flight; gives back what is parked.
  ~GrantReadAhead();
  GrantReadAhead(const GrantReadAhead&) = delete;
  GrantReadAhead& operator=(const GrantReadAhead&) = delete;

  // The next grant read ahead for `key`, waiting for a fetch in flight;
  // nullopt when there is none (grants parked for another key are given
  // back first).
  std::optional<ReceivedChunks> Take(const Key& key);
  // The caller holds a grant of `key` (taken or its own; `readable_ahead`:
  // the daemon made none of its chunks, they were cached or budget, so a
  // fetch would be given its like now, even after one was refused): from
  // the second in a row of one key, once the parked grants are taken, the
  // next are read ahead.
  void Granted(const Key& key, bool readable_ahead);
  // Gives back what is parked and what a fetch in flight brings; returns
  // the bytes parked.
  uint64_t Drop();
  // The caller asks for a grant of `key` itself, ahead of a need it
  // foresees (ChunkGrants::Prewarm): until its Park, a Take of `key` waits
  // for it as for a fetch in flight (the request it foresees, come early,
  // takes it rather than asking the daemon for the same memory again,
  // since that waits for the same reclaim). One at a time.
  void BeginPark(const Key& key);
  // Ends BeginPark(`key`): parks `grant` (nullopt: none came) for the next
  // Take of `key`, kept for `keep` as a fetch's grants are; what was parked
  // before is given back first (after a fetch in flight), and a fetch
  // wanted is not made. A grant that comes after a Drop since BeginPark
  // (the daemon asked for memory back meanwhile) is given back at once.
  // Returns whether `grant` was parked.
  bool Park(const Key& key, std::optional<ReceivedChunks> grant);

  uint64_t parked_bytes() const;

 private:
  struct Parked {
    Key key;
    std::deque<ReceivedChunks> grants;  // never empty
    absl::Time until;
  };
  void Run();
  uint64_t ParkedBytes() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Gives every one of `grants` back, with `mu_` released meanwhile.
  void GiveBackAll(std::deque<ReceivedChunks> grants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back what is parked, if anything (GiveBackAll).
  void GiveBackParked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parks `grants` (not empty) of `key` for `keep_` from now.
  void Keep(const Key& key, std::deque<ReceivedChunks> grants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  // How many grants the run's next fetch asks for.
  uint32_t batch_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<Key> wanted_ ABSL_GUARDED_BY(mu_);
  bool fetching_ ABSL_GUARDED_BY(mu_) = false;
  // Between BeginPark and Park: the key, and drops_ at BeginPark.
  std::optional<std::pair<Key, uint64_t>> parking_ ABSL_GUARDED_BY(mu_);
  // Set by Park: the thread's wait is for another deadline now.
  bool parked_by_caller_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped by Drop: a fetch that began before brings back nothing to keep.
  uint64_t drops_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Parked> parked_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_GRANT_READ_AHEAD_H_
