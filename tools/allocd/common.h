// Pieces every allocd subcommand shares: loading a trace, a progress bar
// (size flags and exit codes: tools/common/cli.h).
#ifndef ALLOCD_TOOLS_ALLOCD_COMMON_H_
#define ALLOCD_TOOLS_ALLOCD_COMMON_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"
#include "tools/common/cli.h"

namespace allocd {

// Reads a snapshot; errors name the path, and a file that is no pickle
// (a text file, a log) says "not a pickle snapshot".
absl::StatusOr<Trace> LoadTrace(const std::string& path, int device);

// OK unless `device_bytes`, given as `flag`, is less than the memory the
// trace itself holds at its peak (its peak allocated under PyTorch's
// defaults): no config fits the job on such a device, so the number is a
// mistake. 0 (not given) is OK.
absl::Status CheckDeviceHoldsTrace(const Trace& trace, const std::string& flag,
                                   uint64_t device_bytes);

// A one-line progress bar on stderr, drawn only when stderr is a terminal
// and at most ten times a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void Update(size_t done, size_t total);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_COMMON_H_
