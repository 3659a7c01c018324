#include "server/log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace allocd {
namespace {

void Write(absl::string_view level, absl::string_view line) {
  std::string out = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " allocd ", level, " ", line, "\n");
  (void)!write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace

void LogInfo(absl::string_view line) { Write("info", line); }
void LogError(absl::string_view line) { Write("error", line); }

}  // namespace allocd
