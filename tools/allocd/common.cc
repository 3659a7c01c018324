#include "tools/allocd/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <zlib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"

namespace allocd {

namespace {

// The first bytes of the file, gunzipped if it is gzipped ("" when it
// cannot be read).
std::string FirstBytes(const std::string& path, size_t n) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return "";
  std::string bytes(n, '\0');
  const int got = gzread(file, bytes.data(), static_cast<unsigned>(n));
  gzclose(file);
  bytes.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return bytes;
}

// "hello world" as a person would recognise it, non-printing bytes as '.'.
std::string Printable(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) {
    if (c == '\n' || c == '\r') break;
    out += absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '.';
  }
  return out;
}

}  // namespace

absl::StatusOr<Trace> LoadTrace(const std::string& path, int device) {
  // The reader's errors name the path.
  absl::StatusOr<Trace> trace = ReadSnapshotFile(path, SnapshotReadOptions{device});
  if (trace.ok() || trace.status().code() != absl::StatusCode::kInvalidArgument) {
    return trace;
  }
  // pickle.dump writes protocol 2 or later, which starts with PROTO (0x80):
  // a file that does not and fails to parse is something else, and the
  // unpickler's complaint about its first bytes would only confuse.
  const std::string head = FirstBytes(path, 24);
  if (head.empty() || head[0] == '\x80') return trace;
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": not a pickle snapshot (it starts with \"", Printable(head),
      "\"). Give the file that pickle.dump(torch.cuda.memory._snapshot(), f) "
      "wrote, after torch.cuda.memory._record_memory_history(); .pickle or "
      ".pickle.gz"));
}

absl::Status CheckDeviceHoldsTrace(const Trace& trace, const std::string& flag,
                                   uint64_t device_bytes) {
  if (device_bytes == 0) return absl::OkStatus();
  absl::StatusOr<ReplayResult> defaults = Replay(trace, AllocatorConfig{});
  if (!defaults.ok()) return defaults.status();
  const auto peak = static_cast<uint64_t>(defaults->peak_allocated);
  if (device_bytes >= peak) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " ", FormatSize(device_bytes), " is less than the ", FormatSize(peak),
      " the trace's tensors hold at its peak: the job could not have run on "
      "that device. Give the device's total memory, e.g. 80GB for an H100 "
      "80GB (torch.cuda.get_device_properties(0).total_memory, in bytes: "
      "append B)"));
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
