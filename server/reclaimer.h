// Reclaimer: when a device's pool is short, asks the other sessions of the
// device to give back what they cache, and waits for it to come back.
//
// It asks only whom it takes: the largest caches first, as few as cover
// the shortfall, each for what is still short (at most what it caches). A
// small shortfall beside a trainer leaves an inference server's cache (the
// segments its next requests reuse) alone.
//
// What a session caches is what its last telemetry says: what its
// allocator reserves but has not allocated, and what its client read ahead
// (kReadAheadStat) and holds unmapped. The asker waits on chunks coming
// back and on fresh telemetry: every path that returns chunks to a pool, or
// takes a session's stats, calls SignalReleased.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_RECLAIMER_H_
#define ALLOCD_SERVER_RECLAIMER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics.h"
#include "server/pool/node_pool.h"
#include "server/session_registry.h"

namespace allocd {

class Reclaimer {
 public:
  // `sessions` and `metrics` outlive this. A reclaim waits at most `wait`.
  Reclaimer(const SessionRegistry* sessions, Metrics* metrics,
            absl::Duration wait);

  // Asks the sessions of `except`'s device but `except` that cache memory
  // and are not themselves waiting in an acquire to release it, the
  // largest caches first (ties: the oldest session first) until what they
  // are asked covers `shortfall` bytes (ShortfallBytes of the refusal:
  // short of the pool's capacity, or of the device's memory), or more:
  // what the rest of `except`'s peak needs beyond what `pool` has free,
  // by the working set it last reported (its peak, gathered one segment at
  // a time, then costs one reclaim, not one a segment). Where that working
  // set says nothing (none reported yet, or `except` holds it already),
  // each session asked is asked for all it caches. Then waits until the
  // shortfall came back to `pool` (the device's) or the wait passes.
  // Asks nobody when what the others cache cannot cover the shortfall.
  //
  // A session asked and not reporting since counts as caching nothing: its
  // telemetry is stale, what it had is on its way back or was overstated.
  // So when what came back falls short and the acquire fails, the job's
  // next acquire (its allocator retries on the OOM path) reclaims its
  // recomputed shortfall from the next caches.
  void Reclaim(const Session& except, NodePool& pool, uint64_t shortfall)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes Reclaim()s waiting for memory to come back.
  void SignalReleased() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The sessions a reclaim for `except` could ask, by their last telemetry.
  struct Cacher {
    std::shared_ptr<Session> session;
    uint64_t cached;
    // The stats_version `cached` was read at.
    uint64_t version;
  };
  struct Others {
    // Those caching memory, the largest caches first.
    std::vector<Cacher> cachers;
    uint64_t reclaimable = 0;
    // Those holding memory, with the stats_version they were counted by.
    std::vector<std::pair<std::shared_ptr<Session>, uint64_t>> holders;
  };
  Others CountOthers(const Session& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionRegistry* const sessions_;
  Metrics* const metrics_;
  const absl::Duration wait_;
  // Signalled whenever chunks return to a pool or telemetry comes.
  absl::Mutex mu_;
  absl::CondVar released_;
  // The sessions asked to give back, by id, with the stats_version they
  // were asked at (until they report again or end).
  absl::flat_hash_map<SessionId, uint64_t> asked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_RECLAIMER_H_
