// SpareSegments: mapped segments that no allocation uses, kept for the next
// request of their size.
//
// A segment request that a spare of its exact size serves costs a lookup:
// no daemon round trip, no mapping. Spares come from two places:
// - a pre-warm (DaemonBackend::MapPrewarmed): the grant for a recurring
//   peak, mapped ahead on the advisor's thread;
// - a reclaim's partial give-back (DaemonBackend::KeepFreedSegments):
//   PyTorch's empty_cache() releases its whole cache, but a neighbour is
//   short of only part of it. The segments it freed stay mapped here, and
//   only the largest ones, enough to cover what was asked, go back. A job
//   whose small segments (an inference server's KV caches) serve every
//   request does not map them again after each reclaim of its large ones.
//
// What a request takes is chosen by size only; which spares to give back
// is chosen largest first (the fewest segments to map again), or by age.
// A container, no I/O: the caller unmaps what it takes. Not thread-safe
// (DaemonBackend's callers hold its lock).
#ifndef ALLOCD_CLIENT_SPARE_SEGMENTS_H_
#define ALLOCD_CLIENT_SPARE_SEGMENTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/time/time.h"

namespace allocd {

class SpareSegments {
 public:
  enum class Origin {
    kPrewarmed,  // mapped ahead of a foreseen request
    kKept,       // freed during a reclaim and kept mapped
  };
  struct Spare {
    uint64_t address = 0;
    uint64_t bytes = 0;
    Origin origin = Origin::kKept;
    absl::Time since;  // when it became spare
  };

  // `spare` waits for a request of its size.
  void Add(const Spare& spare);
  // The address of a spare of exactly `bytes`, which stops being spare (the
  // oldest of that size); nullopt when there is none.
  std::optional<uint64_t> Take(uint64_t bytes);
  // Takes spares, largest first, until their bytes reach `bytes`; every
  // spare when `bytes` is 0 or more than all of them.
  std::vector<Spare> TakeLargestCovering(uint64_t bytes);
  // Takes every spare of `origin`.
  std::vector<Spare> TakeAll(Origin origin);
  // Takes every spare that has been spare since `cutoff` or before.
  std::vector<Spare> TakeSpareSince(absl::Time cutoff);

  // The spares' bytes, and how many there are.
  uint64_t bytes() const { return bytes_; }
  size_t size() const { return by_size_.size(); }
  bool empty() const { return by_size_.empty(); }

 private:
  // Takes the spares `pick` says yes to.
  template <typename Pick>
  std::vector<Spare> TakeIf(Pick pick);

  // By size; those of one size in the order they came.
  std::multimap<uint64_t, Spare> by_size_;
  uint64_t bytes_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_SPARE_SEGMENTS_H_
