#include "server/pool/watched_process.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace allocd {

std::shared_ptr<const WatchedProcess> WatchedProcess::Watch(pid_t pid) {
  UniqueFd pidfd;
  if (pid > 0) {
    // glibc wraps pidfd_open only from 2.36; the syscall is Linux 5.3's.
    // Closed on exec by the kernel (pidfds are always O_CLOEXEC).
    pidfd.reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  }
  return std::make_shared<const WatchedProcess>(pid, std::move(pidfd));
}

bool WatchedProcess::Exited() const {
  if (exited_.load(std::memory_order_relaxed)) return true;
  if (!pidfd_.valid()) return false;
  pollfd p{.fd = pidfd_.get(), .events = POLLIN, .revents = 0};
  if (poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) return false;
  exited_.store(true, std::memory_order_relaxed);
  return true;
}

}  // namespace allocd
