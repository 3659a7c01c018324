#include "client/grant_read_ahead.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "client/thread_name.h"

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

void GrantReadAhead::GiveBackAll(std::deque<ReceivedChunks> grants) {
  mu_.Unlock();
  for (ReceivedChunks& grant : grants) give_back_(std::move(grant));
  mu_.Lock();
}

void GrantReadAhead::GiveBackParked() {
  if (!parked_.has_value()) return;
  std::deque<ReceivedChunks> grants = std::move(parked_->grants);
  parked_.reset();
  GiveBackAll(std::move(grants));
}

void GrantReadAhead::Keep(const Key& key, std::deque<ReceivedChunks> grants) {
  parked_ = Parked{
      .key = key, .grants = std::move(grants), .until = absl::Now() + keep_};
}

std::optional<ReceivedChunks> GrantReadAhead::Take(const Key& key) {
  absl::MutexLock lock(&mu_);
  // A fetch wanted or in flight is one round trip from done, never a wait
  // for other sessions: for this key, waiting beats asking twice.
  if (wanted_.has_value() && !(*wanted_ == key)) wanted_.reset();
  auto settled = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !fetching_ && !wanted_.has_value() &&
           !(parking_.has_value() && parking_->first == key);
  };
  mu_.Await(absl::Condition(&settled));
  if (!parked_.has_value()) return std::nullopt;
  if (!(parked_->key == key)) {
    GiveBackParked();
    return std::nullopt;
  }
  ReceivedChunks next = std::move(parked_->grants.front());
  parked_->grants.pop_front();
  if (parked_->grants.empty()) parked_.reset();
  return next;
}

void GrantReadAhead::Granted(const Key& key, bool readable_ahead) {
  absl::MutexLock lock(&mu_);
  if (last_ == key) {
    ++run_;
  } else {
    last_ = key;
    run_ = 1;
    refused_ = false;
    batch_ = 1;
  }
  if (readable_ahead) refused_ = false;
  if (run_ >= 2 && !refused_ && !parked_.has_value() && !fetching_) {
    wanted_ = key;
  }
}

uint64_t GrantReadAhead::Drop() {
  absl::MutexLock lock(&mu_);
  ++drops_;
  wanted_.reset();
  if (parked_.has_value()) parked_->until = absl::InfinitePast();
  return ParkedBytes();
}

void GrantReadAhead::BeginPark(const Key& key) {
  absl::MutexLock lock(&mu_);
  parking_.emplace(key, drops_);
}

bool GrantReadAhead::Park(const Key& key, std::optional<ReceivedChunks> grant) {
  absl::MutexLock lock(&mu_);
  const bool dropped = parking_.has_value() && parking_->second != drops_;
  parking_.reset();
  if (!grant.has_value()) return false;
  std::deque<ReceivedChunks> grants;
  grants.push_back(*std::move(grant));
  if (dropped || stopping_) {
    GiveBackAll(std::move(grants));
    return false;
  }
  wanted_.reset();
  auto settled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !fetching_; };
  mu_.Await(absl::Condition(&settled));
  GiveBackParked();
  Keep(key, std::move(grants));
  parked_by_caller_ = true;
  return true;
}

uint64_t GrantReadAhead::parked_bytes() const {
  absl::MutexLock lock(&mu_);
  return ParkedBytes();
}

uint64_t GrantReadAhead::ParkedBytes() const {
  uint64_t bytes = 0;
  if (parked_.has_value()) {
    for (const ReceivedChunks& grant : parked_->grants) bytes += grant.bytes();
  }
  return bytes;
}

void GrantReadAhead::Run() {
  NameThisThread("allocd-readahd");
  mu_.Lock();
  for (;;) {
    auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || parked_by_caller_ ||
             (wanted_.has_value() && !parked_.has_value()) ||
             (parked_.has_value() && parked_->until <= absl::Now());
    };
    mu_.AwaitWithDeadline(absl::Condition(&work),
                          parked_.has_value() ? parked_->until
                                              : absl::InfiniteFuture());
    parked_by_caller_ = false;
    if (parked_.has_value() &&
        (stopping_ || parked_->until <= absl::Now())) {
      GiveBackParked();
      continue;
    }
    if (stopping_) break;
    if (!wanted_.has_value() || parked_.has_value()) continue;
    const Key key = *wanted_;
    const uint32_t count = batch_;
    wanted_.reset();
    fetching_ = true;
    const uint64_t drops = drops_;
    mu_.Unlock();
    std::vector<ReceivedChunks> got = fetch_(key, count);
    mu_.Lock();
    fetching_ = false;
    std::deque<ReceivedChunks> grants(std::make_move_iterator(got.begin()),
                                      std::make_move_iterator(got.end()));
    if (grants.empty()) {
      if (last_ == key) refused_ = true;
      continue;
    }
    // Dropped meanwhile, or the caller moved on to another size.
    if (drops != drops_ || stopping_ || last_ != key) {
      GiveBackAll(std::move(grants));
      continue;
    }
    batch_ = std::min(batch_ * 2, kMaxBatch);
    Keep(key, std::move(grants));
  }
  mu_.Unlock();
}

}  // namespace allocd
