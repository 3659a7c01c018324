// AllocatorTarget: the allocator a LiveSession drives, whatever it is:
// allocd's engine (EngineTarget: `allocd client-replay`, liballocd_torch.so)
// or PyTorch's own, native or pluggable, driven from Python through the C
// ABI (allocd_poll).
#ifndef ALLOCD_CLIENT_ALLOCATOR_TARGET_H_
#define ALLOCD_CLIENT_ALLOCATOR_TARGET_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"

namespace allocd {

class AllocatorTarget {
 public:
  virtual ~AllocatorTarget() = default;

  // Makes the allocator run `config` from now on (its cache is emptied
  // after, by the caller). An error when the allocator refuses `config`.
  virtual absl::Status Reconfigure(const AllocatorConfig& config) = 0;
  // Releases the cached blocks no allocation uses (torch.cuda.empty_cache).
  virtual void EmptyCache() = 0;
  // Releases at least `bytes` (> 0) of the cache, keeping the rest cached
  // where the allocator can choose (allocd's engine:
  // CachingAllocator::ReleaseCached); one that cannot releases it all.
  virtual void ReleaseCached(uint64_t bytes) = 0;
  // The allocator's counters as torch.cuda.memory_stats() names them.
  virtual std::map<std::string, int64_t> Stats() = 0;
};

// allocd's engine. Not thread-safe, as the engine is not.
class EngineTarget final : public AllocatorTarget {
 public:
  // `allocator` outlives the target.
  explicit EngineTarget(CachingAllocator& allocator) : allocator_(allocator) {}

  absl::Status Reconfigure(const AllocatorConfig& config) override;
  void EmptyCache() override;
  void ReleaseCached(uint64_t bytes) override;
  std::map<std::string, int64_t> Stats() override;

 private:
  CachingAllocator& allocator_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_ALLOCATOR_TARGET_H_
