#include "client/working_set_handover.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "client/thread_name.h"

namespace allocd {

WorkingSetHandover::WorkingSetHandover(std::vector<uint64_t> plan,
                                       Callbacks callbacks,
                                       absl::Duration keep)
    : callbacks_(std::move(callbacks)),
      keep_(keep),
      plan_(plan.begin(), plan.end()) {
  thread_ = std::thread([this] { Run(); });
}

WorkingSetHandover::~WorkingSetHandover() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WorkingSetHandover::ReportHeld() { callbacks_.report(held_bytes_); }

absl::Time WorkingSetHandover::Deadline() const {
  return last_request_.has_value() ? *last_request_ + keep_
                                   : prepared_at_ + kFirstRequestWait;
}

bool WorkingSetHandover::NothingToKeep() const {
  return stopping_ || dropped_ || ready_.empty();
}

bool WorkingSetHandover::Expired() const {
  return NothingToKeep() || absl::Now() >= Deadline();
}

void WorkingSetHandover::Run() {
  NameThisThread("allocd-handover");
  absl::MutexLock lock(&mu_);
  while (!plan_.empty() && !dropped_ && !stopping_) {
    // The next run of one size, in one fetch.
    const uint64_t bytes = plan_.front();
    uint32_t count = 0;
    while (!plan_.empty() && plan_.front() == bytes && count < kMaxBatch) {
      plan_.pop_front();
      ++count;
    }
    in_flight_bytes_ = bytes;
    in_flight_count_ = count;
    mu_.Unlock();
    std::vector<ReceivedChunks> grants = callbacks_.fetch(bytes, count);
    mu_.Lock();
    // The daemon's cache is short (or it is away): what it could not give
    // now it would not give the next size either without waiting.
    if (grants.size() < count) plan_.clear();
    in_flight_count_ = static_cast<uint32_t>(grants.size());
    for (const ReceivedChunks& grant : grants) held_bytes_ += grant.bytes();
    ReportHeld();
    for (ReceivedChunks& grant : grants) {
      const uint64_t grant_bytes = grant.bytes();
      const bool wanted = !dropped_ && !stopping_;
      absl::StatusOr<Segment> segment = absl::CancelledError("dropped");
      mu_.Unlock();
      if (wanted) {
        segment = callbacks_.map(std::move(grant));
      } else {
        callbacks_.release(std::move(grant));
      }
      mu_.Lock();
      if (segment.ok()) {
        ready_[bytes].push_back(*std::move(segment));
        ++counts_.prepared;
      } else {
        held_bytes_ -= grant_bytes;
        ReportHeld();
      }
      --in_flight_count_;
    }
  }
  plan_.clear();
  in_flight_count_ = 0;
  preparing_ = false;
  prepared_at_ = absl::Now();
  while (!Expired()) {
    // A Take moves the deadline: wake for that too.
    const std::optional<absl::Time> seen = last_request_;
    auto woken = [this, &seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return NothingToKeep() || last_request_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), Deadline());
  }
  std::map<uint64_t, std::deque<Segment>> untaken = std::move(ready_);
  ready_.clear();
  for (auto& [bytes, segments] : untaken) {
    for (Segment& segment : segments) {
      held_bytes_ -= segment.bytes;
      ++counts_.given_back;
      mu_.Unlock();
      callbacks_.give_back(std::move(segment));
      mu_.Lock();
    }
  }
  ReportHeld();
}

std::optional<WorkingSetHandover::Segment> WorkingSetHandover::Take(
    uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (!last_request_.has_value()) last_request_ = now;
  if (dropped_ || stopping_) return std::nullopt;
  for (;;) {
    if (auto it = ready_.find(bytes); it != ready_.end()) {
      Segment segment = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) ready_.erase(it);
      held_bytes_ -= segment.bytes;
      ++counts_.taken;
      last_request_ = now;
      ReportHeld();
      return segment;
    }
    auto coming = [this, bytes]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return in_flight_count_ > 0 && in_flight_bytes_ == bytes && !dropped_ &&
             !stopping_;
    };
    if (!coming()) break;
    // One of this size is being fetched or mapped: wait for it.
    auto arrived = [this, bytes, &coming]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return ready_.contains(bytes) || !coming();
    };
    mu_.Await(absl::Condition(&arrived));
  }
  // The caller maps its own: one fewer of this size to prepare.
  if (auto it = std::find(plan_.begin(), plan_.end(), bytes);
      it != plan_.end()) {
    plan_.erase(it);
  }
  return std::nullopt;
}

uint64_t WorkingSetHandover::Drop() {
  absl::MutexLock lock(&mu_);
  dropped_ = true;
  return held_bytes_;
}

WorkingSetHandover::Counts WorkingSetHandover::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

bool WorkingSetHandover::prepared() const {
  absl::MutexLock lock(&mu_);
  return !preparing_;
}

bool WorkingSetHandover::WaitPrepared(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !preparing_; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

}  // namespace allocd
