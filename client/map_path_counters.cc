#include "client/map_path_counters.h"

namespace allocd {

nlohmann::json MapPathCounters::ToJson() const {
  auto read = [](const std::atomic<uint64_t>& c) {
    return c.load(std::memory_order_relaxed);
  };
  return {{"segments_mapped", read(segments_mapped)},
          {"chunks_mapped", read(chunks_mapped)},
          {"chunks_created", read(chunks_created)},
          {"acquire_ns", read(acquire_ns)},
          {"map_ns", read(map_ns)},
          {"access_ns", read(access_ns)},
          {"segments_unmapped", read(segments_unmapped)},
          {"unmap_ns", read(unmap_ns)},
          {"chunks_given", read(chunks_given)},
          {"give_ns", read(give_ns)},
          {"gives_failed", read(gives_failed)},
          {"segments_kept", read(segments_kept)},
          {"spares_taken", read(spares_taken)},
          {"large_segments", LargeSegments()}};
}

void MapPathCounters::NoteSegment(uint64_t bytes) {
  if (bytes < kLargeSegmentBytes) return;
  absl::MutexLock lock(&mu_);
  large_segments_.emplace_back(absl::GetCurrentTimeNanos(), bytes);
  if (large_segments_.size() > kLargeSegmentsKept) large_segments_.pop_front();
}

std::deque<std::pair<int64_t, uint64_t>> MapPathCounters::LargeSegments() const {
  absl::MutexLock lock(&mu_);
  return large_segments_;
}

}  // namespace allocd
