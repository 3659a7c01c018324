#include "ipc/background_fd_closer.h"

#include <utility>

namespace allocd {

BackgroundFdCloser::BackgroundFdCloser(size_t max_pending)
    : max_pending_(max_pending), thread_([this] { Loop(); }) {}

BackgroundFdCloser::~BackgroundFdCloser() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void BackgroundFdCloser::Close(UniqueFd fd) {
  if (!fd.valid()) return;
  absl::MutexLock lock(&mu_);
  if (pending_.size() >= max_pending_) {
    fd.reset();  // the closer is behind: this caller pays
    return;
  }
  pending_.push_back(std::move(fd));
  ++queued_;
}

void BackgroundFdCloser::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = queued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ >= target;
  };
  mu_.Await(absl::Condition(&done));
}

void BackgroundFdCloser::Loop() {
  for (;;) {
    std::vector<UniqueFd> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // stopping, nothing left
      batch.swap(pending_);
    }
    const size_t n = batch.size();
    batch.clear();  // the closes, outside the lock
    absl::MutexLock lock(&mu_);
    closed_ += n;
  }
}

}  // namespace allocd
