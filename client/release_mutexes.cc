// Linked into what allocd ships (the allocd binary, liballocd_client.so,
// liballocd_interpose.so and liballocd_torch.so), never into a test: abseil's
// mutex deadlock detection is off in those processes before any thread runs.
//
// Debian's abseil is built without NDEBUG, so with detection on every
// absl::Mutex lock and unlock updates a process-wide lock graph, and a cycle
// it suspects aborts the process. On the allocation tracker's path that is
// 1.4-3x the CPU of recording an event (bench/client_hot_path_bench.cc,
// BM_Record_* deadlock:1 against deadlock:0). The tests keep detection, and
// the clang build checks lock order statically (-Wthread-safety).
//
// Only on, then off: a mutex locked while detection was on and unlocked
// after leaves a stale entry in its thread's held list, which nothing reads
// with detection off; the other way round abseil would abort.
#include "absl/synchronization/mutex.h"

namespace {

[[maybe_unused]] const bool kDeadlockDetectionOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace
