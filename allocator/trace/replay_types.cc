#include "allocator/trace/replay_types.h"

namespace allocd {

void SetRunTotals(std::chrono::steady_clock::time_point start, uint64_t events,
                  ReplayResult& result) {
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  result.events = events;
}

}  // namespace allocd
