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

void RefusalLog::Refused(absl::Time now, absl::string_view what,
                         absl::FunctionRef<std::string()> last) {
  ++unlogged_;
  if (now - logged_at_ < kPeriod) return;
  LogError(absl::StrCat("refused ", unlogged_, " ", what, "(s), the last ", last()));
  unlogged_ = 0;
  logged_at_ = now;
}

}  // namespace allocd
