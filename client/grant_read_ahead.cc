#include "client/grant_read_ahead.h"

#include <utility>

#include "absl/time/clock.h"

namespace allocd {

GrantReadAhead::GrantReadAhead(Fetch fetch, GiveBack give_back,
                               absl::Duration keep)
    : fetch_(std::move(fetch)),
      give_back_(std::move(give_back)),
      keep_(keep),
      thread_([this] { Run(); }) {}

GrantReadAhead::~GrantReadAhead() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::optional<ReceivedChunks> GrantReadAhead::Take(const Key& key) {
  std::optional<ReceivedChunks> other;  // parked for another key
  {
    absl::MutexLock lock(&mu_);
    // A fetch wanted or in flight is one round trip from done, never a
    // wait for other sessions: for this key, waiting beats asking twice.
    if (wanted_.has_value() && !(*wanted_ == key)) wanted_.reset();
    auto settled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !fetching_ && !wanted_.has_value();
    };
    mu_.Await(absl::Condition(&settled));
    if (!parked_.has_value()) return std::nullopt;
    std::optional<ReceivedChunks> chunks = std::move(parked_->chunks);
    const bool match = parked_->key == key;
    parked_.reset();
    if (match) return chunks;
    other = std::move(chunks);
  }
  give_back_(*std::move(other));
  return std::nullopt;
}

void GrantReadAhead::Granted(const Key& key) {
  absl::MutexLock lock(&mu_);
  if (last_ == key) {
    ++run_;
  } else {
    last_ = key;
    run_ = 1;
    refused_ = false;
  }
  if (run_ >= 2 && !refused_ && !parked_.has_value() && !fetching_) {
    wanted_ = key;
  }
}

void GrantReadAhead::Drop() {
  absl::MutexLock lock(&mu_);
  ++drops_;
  wanted_.reset();
  if (parked_.has_value()) parked_->until = absl::InfinitePast();
}

uint64_t GrantReadAhead::parked_bytes() const {
  absl::MutexLock lock(&mu_);
  return parked_.has_value() ? parked_->chunks.bytes() : 0;
}

void GrantReadAhead::Run() {
  mu_.Lock();
  for (;;) {
    auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || (wanted_.has_value() && !parked_.has_value()) ||
             (parked_.has_value() && parked_->until <= absl::Now());
    };
    mu_.AwaitWithDeadline(absl::Condition(&work),
                          parked_.has_value() ? parked_->until
                                              : absl::InfiniteFuture());
    if (parked_.has_value() &&
        (stopping_ || parked_->until <= absl::Now())) {
      ReceivedChunks back = std::move(parked_->chunks);
      parked_.reset();
      mu_.Unlock();
      give_back_(std::move(back));
      mu_.Lock();
      continue;
    }
    if (stopping_) break;
    if (!wanted_.has_value() || parked_.has_value()) continue;
    const Key key = *wanted_;
    wanted_.reset();
    fetching_ = true;
    const uint64_t drops = drops_;
    mu_.Unlock();
    std::optional<ReceivedChunks> got = fetch_(key);
    mu_.Lock();
    fetching_ = false;
    if (!got.has_value()) {
      if (last_ == key) refused_ = true;
      continue;
    }
    // Dropped meanwhile, or the caller moved on to another size.
    if (drops != drops_ || stopping_ || last_ != key) {
      mu_.Unlock();
      give_back_(*std::move(got));
      mu_.Lock();
      continue;
    }
    parked_ = Parked{
        .key = key, .chunks = *std::move(got), .until = absl::Now() + keep_};
  }
  mu_.Unlock();
}

}  // namespace allocd
