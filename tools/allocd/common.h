// Pieces every allocd subcommand shares: size flags, loading a trace,
// a progress bar.
#ifndef ALLOCD_TOOLS_ALLOCD_COMMON_H_
#define ALLOCD_TOOLS_ALLOCD_COMMON_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"

namespace allocd {

// Parses a size flag ("80GB", "79.1GiB", bytes); "" is 0 (not given).
absl::StatusOr<uint64_t> ParseSizeFlag(const std::string& flag,
                                       const std::string& value);

// Reads a snapshot, with the path in the error.
absl::StatusOr<Trace> LoadTrace(const std::string& path, int device);

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
