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
                        std::vector<uint64_t> ids) {
  if (owner == nullptr || ids.empty()) return;
  absl::MutexLock lock(&mu_);
  ++added_;
  pending_chunks_ += ids.size();
  for (Batch& batch : waiting_) {
    if (batch.owner != owner) continue;
    batch.ids.insert(batch.ids.end(), ids.begin(), ids.end());
    return;
  }
  waiting_.push_back({.owner = std::move(owner), .ids = std::move(ids)});
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
    for (Batch& batch : batches) {
      chunks += batch.ids.size();
      deliver_(batch.owner, std::move(batch.ids));
    }
    mu_.Lock();
    pending_chunks_ -= chunks;
    deliveries_ += batches.size();
    delivered_ = upto;
  }
  mu_.Unlock();
}

}  // namespace allocd
