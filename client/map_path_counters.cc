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
          {"gives_failed", read(gives_failed)}};
}

}  // namespace allocd
