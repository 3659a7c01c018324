#include "tools/allocd/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/trace/snapshot_reader.h"

namespace allocd {

absl::StatusOr<uint64_t> ParseSizeFlag(const std::string& flag,
                                       const std::string& value) {
  if (value.empty()) return 0;
  absl::StatusOr<uint64_t> size = ParseSize(value);
  if (!size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", size.status().message()));
  }
  if (*size == 0) return absl::InvalidArgumentError(absl::StrCat(flag, " must be more than 0"));
  return size;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path, int device) {
  absl::StatusOr<Trace> trace = ReadSnapshotFile(path, SnapshotReadOptions{device});
  if (!trace.ok()) {
    return absl::Status(trace.status().code(),
                        absl::StrCat(path, ": ", trace.status().message()));
  }
  return trace;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void ProgressBar::Update(size_t done, size_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  constexpr int kWidth = 30;
  const int filled = total == 0 ? 0 : static_cast<int>(kWidth * std::min(done, total) / total);
  std::fprintf(stderr, "\r%s [%s%s] %zu/%zu", label_.c_str(),
               std::string(filled, '=').c_str(), std::string(kWidth - filled, ' ').c_str(),
               done, total);
  std::fflush(stderr);
}

}  // namespace allocd
