// Reclaimer: when a device's pool is short, asks the other sessions of the
// device to give back what they cache, and waits for it to come back.
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

#include "absl/base/thread_annotations.h"
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

  // Asks every session of `except`'s device but `except` that caches
  // memory and is not itself waiting in an acquire to release it, then
  // waits until `shortfall` bytes (ShortfallBytes of the refusal: short of
  // the pool's capacity, or of the device's memory) came back to `pool`
  // (the device's) or the wait passes. Asks nobody when what the others
  // cache cannot cover the shortfall.
  void Reclaim(const Session& except, NodePool& pool, uint64_t shortfall)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes Reclaim()s waiting for memory to come back.
  void SignalReleased() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const SessionRegistry* const sessions_;
  Metrics* const metrics_;
  const absl::Duration wait_;
  // Signalled whenever chunks return to a pool or telemetry comes.
  absl::Mutex mu_;
  absl::CondVar released_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_RECLAIMER_H_
