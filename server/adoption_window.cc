#include "server/adoption_window.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace allocd {

SessionsByPid ReadSessionsFile(const std::string& path,
                               const std::function<bool(pid_t)>& alive) {
  SessionsByPid sessions;
  std::ifstream in(path);
  long pid = 0;
  while (in >> pid) {
    if (pid > 0 && alive(static_cast<pid_t>(pid))) {
      ++sessions[static_cast<pid_t>(pid)];
    }
  }
  return sessions;
}

absl::Status WriteSessionsFile(const std::string& path,
                               const SessionsByPid& sessions) {
  const std::string temporary = path + ".new";
  {
    std::ofstream out(temporary, std::ios::trunc);
    for (const auto& [pid, count] : sessions) {
      for (int i = 0; i < count; ++i) out << pid << "\n";
    }
    out.flush();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("writing ", temporary, ": ", strerror(errno)));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("renaming ", temporary, " to ",
                                            path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

bool ProcessAlive(pid_t pid) {
  // EPERM: it exists, as another user's.
  return kill(pid, 0) == 0 || errno == EPERM;
}

AdoptionWindow::AdoptionWindow(SessionsByPid expected, absl::Time deadline,
                               std::function<bool(pid_t)> alive)
    : deadline_(deadline),
      alive_(std::move(alive)),
      pending_(std::move(expected)),
      open_(!pending_.empty()) {}

void AdoptionWindow::CloseIfDone(absl::Time now) {
  if (open_ && (pending_.empty() || now >= deadline_)) open_ = false;
}

void AdoptionWindow::Returned(pid_t pid) {
  absl::MutexLock lock(&mu_);
  if (auto it = pending_.find(pid); it != pending_.end() && --it->second == 0) {
    pending_.erase(it);
  }
  CloseIfDone(absl::Now());
}

void AdoptionWindow::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!open_) return;
  std::erase_if(pending_, [&](const auto& p) { return !alive_(p.first); });
  CloseIfDone(now);
}

void AdoptionWindow::Wait() {
  absl::MutexLock lock(&mu_);
  auto closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !open_; };
  mu_.AwaitWithDeadline(absl::Condition(&closed), deadline_);
  CloseIfDone(absl::Now());
}

bool AdoptionWindow::open() const {
  absl::MutexLock lock(&mu_);
  return open_ && absl::Now() < deadline_;
}

SessionsByPid AdoptionWindow::pending() const {
  absl::MutexLock lock(&mu_);
  return open_ ? pending_ : SessionsByPid{};
}

}  // namespace allocd
