#include "client/chunk_releaser.h"

#include <utility>

#include "client/thread_name.h"

namespace allocd {

ChunkReleaser::ChunkReleaser(Deliver deliver)
    : deliver_(std::move(deliver)), thread_([this] { Run(); }) {}

ChunkReleaser::~ChunkReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void ChunkReleaser::Add(std::shared_ptr<Connection> owner,
                        std::vector<uint64_t> ids,
                        std::function<void()> first) {
  if (owner == nullptr) ids.clear();  // nobody's to release: only forgotten
  if (ids.empty() && first == nullptr) return;
  absl::MutexLock lock(&mu_);
  ++added_;
  pending_chunks_ += ids.size();
  for (Batch& batch : waiting_) {
    if (batch.owner != owner) continue;
    batch.ids.insert(batch.ids.end(), ids.begin(), ids.end());
    if (first != nullptr) batch.first.push_back(std::move(first));
    return;
  }
  Batch batch{.owner = std::move(owner), .ids = std::move(ids)};
  if (first != nullptr) batch.first.push_back(std::move(first));
  waiting_.push_back(std::move(batch));
}

bool ChunkReleaser::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = added_;
  if (delivered_ >= target) return false;
  auto delivered = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return delivered_ >= target;
  };
  mu_.Await(absl::Condition(&delivered));
  return true;
}

size_t ChunkReleaser::pending_chunks() const {
  absl::MutexLock lock(&mu_);
  return pending_chunks_;
}

uint64_t ChunkReleaser::deliveries() const {
  absl::MutexLock lock(&mu_);
  return deliveries_;
}

void ChunkReleaser::Run() {
  NameThisThread("allocd-release");
  mu_.Lock();
  for (;;) {
    auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || !waiting_.empty();
    };
    mu_.Await(absl::Condition(&work));
    if (waiting_.empty()) break;  // stopping, all delivered
    std::vector<Batch> batches = std::move(waiting_);
    waiting_.clear();
    const uint64_t upto = added_;
    mu_.Unlock();
    size_t chunks = 0;
    uint64_t deliveries = 0;
    // Every batch's first work before any delivery: the one Add that
    // carries an unmap may share it with ids of its other sessions.
    for (Batch& batch : batches) {
      for (std::function<void()>& first : batch.first) first();
    }
    for (Batch& batch : batches) {
      if (batch.ids.empty()) continue;
      chunks += batch.ids.size();
      ++deliveries;
      deliver_(batch.owner, std::move(batch.ids));
    }
    mu_.Lock();
    pending_chunks_ -= chunks;
    deliveries_ += deliveries;
    delivered_ = upto;
  }
  mu_.Unlock();
}

}  // namespace allocd
