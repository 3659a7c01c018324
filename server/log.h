// One line per event on stderr, with a UTC timestamp: what a node operator
// reads with `kubectl logs` or journalctl. Thread-safe (one write per line).
#ifndef ALLOCD_SERVER_LOG_H_
#define ALLOCD_SERVER_LOG_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace allocd {

void LogInfo(absl::string_view line);
void LogError(absl::string_view line);

// A flood of refusals as one error line at most every `kPeriod`: "refused N
// WHAT(s), the last " and the newest refusal's account, which `last` makes
// only when a line is written. Not thread-safe: its owner's lock guards it.
class RefusalLog {
 public:
  static constexpr absl::Duration kPeriod = absl::Seconds(10);

  void Refused(absl::Time now, absl::string_view what,
               absl::FunctionRef<std::string()> last);

 private:
  uint64_t unlogged_ = 0;
  absl::Time logged_at_ = absl::InfinitePast();
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_LOG_H_
