// One line per event on stderr, with a UTC timestamp: what a node operator
// reads with `kubectl logs` or journalctl. Thread-safe (one write per line).
#ifndef ALLOCD_SERVER_LOG_H_
#define ALLOCD_SERVER_LOG_H_

#include "absl/strings/string_view.h"

namespace allocd {

void LogInfo(absl::string_view line);
void LogError(absl::string_view line);

}  // namespace allocd

#endif  // ALLOCD_SERVER_LOG_H_
