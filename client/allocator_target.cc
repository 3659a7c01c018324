#include "client/allocator_target.h"

#include "allocator/stats.h"

namespace allocd {

absl::Status EngineTarget::Reconfigure(const AllocatorConfig& config) {
  allocator_.Reconfigure(config);
  return absl::OkStatus();
}

void EngineTarget::EmptyCache() { allocator_.EmptyCache(); }

void EngineTarget::ReleaseCached(uint64_t bytes) {
  allocator_.ReleaseCached(bytes);
}

std::map<std::string, int64_t> EngineTarget::Stats() {
  return MemoryStatsDict(allocator_.Stats());
}

}  // namespace allocd
