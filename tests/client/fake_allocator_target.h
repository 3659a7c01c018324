// An AllocatorTarget whose memory a test sets: it counts what the control
// loop asks of it, and refuses configs it is told to.
#ifndef ALLOCD_TESTS_CLIENT_FAKE_ALLOCATOR_TARGET_H_
#define ALLOCD_TESTS_CLIENT_FAKE_ALLOCATOR_TARGET_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "allocator/config.h"
#include "client/allocator_target.h"
#include "client/second_release.h"

namespace allocd {

class FakeAllocatorTarget final : public AllocatorTarget {
 public:
  absl::Status Reconfigure(const AllocatorConfig& config) override {
    if (!refuse.empty()) return absl::FailedPreconditionError(refuse);
    configs.push_back(FormatAllocatorConfig(config));
    return absl::OkStatus();
  }
  void EmptyCache() override { ++empty_cache_calls; }
  void ReleaseCached(uint64_t) override {}
  std::map<std::string, int64_t> Stats() override {
    return {{SecondRelease::kAllocated, allocated}};
  }

  // What Stats() reports as allocated now.
  int64_t allocated = 0;
  // Non-empty: Reconfigure refuses with this.
  std::string refuse;
  std::vector<std::string> configs;
  int empty_cache_calls = 0;
};

}  // namespace allocd

#endif  // ALLOCD_TESTS_CLIENT_FAKE_ALLOCATOR_TARGET_H_
