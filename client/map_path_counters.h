// MapPathCounters: where a process's time goes when it maps daemon memory
// into a segment and gives it back: the daemon's round trip for the chunks
// (a reclaim from the job's neighbours waits inside it), importing and
// mapping each chunk, enabling access to the range, and unmapping. A
// reclaimed peak that takes longer than a native cudaMalloc says here which
// of them it waited for (allocd.stats()["map_path"]).
//
// Thread-safe: relaxed atomics, a few nanoseconds on a path that waits
// microseconds for the driver; the log of large segments takes a mutex, once
// a segment of a GiB or more.
#ifndef ALLOCD_CLIENT_MAP_PATH_COUNTERS_H_
#define ALLOCD_CLIENT_MAP_PATH_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace allocd {

struct MapPathCounters {
  std::atomic<uint64_t> segments_mapped{0};  // runs of chunks mapped whole
  std::atomic<uint64_t> chunks_mapped{0};    // imported from the daemon
  std::atomic<uint64_t> chunks_created{0};   // made by the process itself
  std::atomic<uint64_t> acquire_ns{0};       // asking the daemon for chunks
  std::atomic<uint64_t> map_ns{0};           // import (or create) and map
  std::atomic<uint64_t> access_ns{0};        // enabling access to the run
  std::atomic<uint64_t> segments_unmapped{0};
  std::atomic<uint64_t> unmap_ns{0};  // synchronize, unmap and release
  // Chunks made here whose memory was given to the daemon before they were
  // released or shared, and the time that took (export, GiveMemory),
  // failed gives' included.
  std::atomic<uint64_t> chunks_given{0};
  std::atomic<uint64_t> give_ns{0};
  // Gives that failed: an export, or the daemon did not take the memory
  // within the give's deadline (what it took of a give across epochs
  // before that is in chunks_given; what it takes after, nowhere).
  std::atomic<uint64_t> gives_failed{0};
  // Segments freed during a reclaim and kept mapped as spares, and
  // segment requests a spare served (kept or pre-warmed: no round trip, no
  // mapping). SpareSegments.
  std::atomic<uint64_t> segments_kept{0};
  std::atomic<uint64_t> spares_taken{0};

  // The segments logged by LargeSegments.
  static constexpr uint64_t kLargeSegmentBytes = uint64_t{1} << 30;
  static constexpr size_t kLargeSegmentsKept = 8;

  // A segment of `bytes` was mapped now: logged when it is large.
  void NoteSegment(uint64_t bytes);
  // The last kLargeSegmentsKept segments of at least kLargeSegmentBytes
  // mapped, oldest first, as (when: Unix time in ns, bytes): when a job's
  // largest allocations came from the daemon rather than its cache (the
  // Python advisor forecasts a recurring peak from them: allocd/
  // _prewarm.py).
  std::deque<std::pair<int64_t, uint64_t>> LargeSegments() const;

  // Every counter by its name: times in ns; "large_segments" as
  // [[ns, bytes], ...].
  nlohmann::json ToJson() const;

 private:
  mutable absl::Mutex mu_;
  std::deque<std::pair<int64_t, uint64_t>> large_segments_ ABSL_GUARDED_BY(mu_);
};

// Adds the nanoseconds from its construction to its destruction to a
// counter.
class NanosInto {
 public:
  explicit NanosInto(std::atomic<uint64_t>& total)
      : total_(total), start_(absl::GetCurrentTimeNanos()) {}
  ~NanosInto() {
    total_.fetch_add(static_cast<uint64_t>(absl::GetCurrentTimeNanos() - start_),
                     std::memory_order_relaxed);
  }
  NanosInto(const NanosInto&) = delete;
  NanosInto& operator=(const NanosInto&) = delete;

 private:
  std::atomic<uint64_t>& total_;
  const int64_t start_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_MAP_PATH_COUNTERS_H_
