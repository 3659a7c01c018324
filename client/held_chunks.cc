#include "client/held_chunks.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "proto/protocol.h"

namespace allocd {
namespace {

// A dup() of `fd`, raising RLIMIT_NOFILE once when this process runs out:
// a sim-mode client keeps an FD per chunk it holds.
UniqueFd DupProof(int fd) {
  static std::atomic<bool> raised{false};
  UniqueFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid() && errno == EMFILE && !raised.exchange(true) &&
      RaiseOpenFileLimit().ok()) {
    copy.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  }
  return copy;
}

}  // namespace

bool HeldChunks::Record(const Connection& c, const ReceivedChunks& chunks) {
  absl::MutexLock lock(&mu_);
  if (declared_epoch_ > c.epoch) return false;
  for (size_t i = 0; i < chunks.ids.size(); ++i) {
    held_[{c.epoch, chunks.ids[i]}] = Chunk{
        .bytes = chunks.sizes[i],
        .offset = chunks.offsets[i],
        .proof = c.declare_fds ? DupProof(chunks.fds[i].get()) : UniqueFd(),
        .owner_epoch = c.epoch};
  }
  return true;
}

uint64_t HeldChunks::OwnerEpoch(uint64_t epoch, uint64_t id) const {
  auto it = held_.find({epoch, id});
  return it == held_.end() ? epoch : it->second.owner_epoch;
}

HeldChunks::Forgotten HeldChunks::Forget(uint64_t epoch,
                                         absl::Span<const uint64_t> ids,
                                         const ActiveConnection& active) {
  absl::MutexLock lock(&mu_);
  Forgotten out{.owner = active.Current()};
  for (uint64_t id : ids) {
    const uint64_t owner = OwnerEpoch(epoch, id);
    held_.erase({epoch, id});
    if (out.owner != nullptr && owner == out.owner->epoch) out.ids.push_back(id);
  }
  return out;
}

bool HeldChunks::OwnedBy(const Connection& c, uint64_t epoch,
                         absl::Span<const uint64_t> ids) const {
  absl::ReaderMutexLock lock(&mu_);
  return std::all_of(ids.begin(), ids.end(), [&](uint64_t id) {
    mu_.AssertReaderHeld();
    return OwnerEpoch(epoch, id) == c.epoch;
  });
}

void HeldChunks::DeclareTo(Connection& c, absl::Duration rpc_timeout) {
  std::vector<Key> keys;
  {
    absl::MutexLock lock(&mu_);
    declared_epoch_ = c.epoch;
    if (!c.adopts_chunks) return;
    keys.reserve(held_.size());
    for (const auto& [key, chunk] : held_) keys.push_back(key);
  }
  std::vector<uint64_t> stale;  // adopted, but released meanwhile
  for (size_t begin = 0; begin == 0 || begin < keys.size();
       begin += kMaxFdsPerMessage) {
    const size_t end = std::min(keys.size(), begin + kMaxFdsPerMessage);
    v1::SideRequest request;
    v1::DeclareChunks* declare = request.mutable_declare();
    std::vector<UniqueFd> proofs;
    std::map<uint64_t, Key> by_id;  // this frame's chunks
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = begin; i < end; ++i) {
        auto it = held_.find(keys[i]);
        if (it == held_.end() || !by_id.emplace(keys[i].second, keys[i]).second) {
          continue;  // released since, or an id twice (ids of two daemons)
        }
        if (c.declare_fds) {
          if (!it->second.proof.valid()) continue;  // nothing to prove it
          proofs.push_back(DupProof(it->second.proof.get()));
          if (!proofs.back().valid()) {
            proofs.pop_back();
            by_id.erase(keys[i].second);
            continue;
          }
        }
        declare->add_chunk_ids(keys[i].second);
        declare->add_sizes(it->second.bytes);
        declare->add_offsets(it->second.offset);
      }
    }
    declare->set_more(end < keys.size());
    std::vector<int> fds;
    for (const UniqueFd& fd : proofs) fds.push_back(fd.get());
    // Failed, the daemon went away again (the next one gets them), or
    // adopts nothing (an old daemon).
    absl::StatusOr<v1::SideResponse> answer = LeaseCall(c, request, nullptr, fds);
    if (!answer.ok()) return;
    absl::MutexLock lock(&mu_);
    for (uint64_t id : answer->adopted_chunk_ids()) {
      auto key = by_id.find(id);
      if (key == by_id.end()) continue;
      auto it = held_.find(key->second);
      if (it == held_.end()) {
        stale.push_back(id);
      } else {
        it->second.owner_epoch = c.epoch;
      }
    }
    for (uint64_t id : answer->refused_chunk_ids()) {
      auto key = by_id.find(id);
      if (key == by_id.end()) continue;
      if (auto it = held_.find(key->second); it != held_.end()) {
        it->second.owner_epoch = 0;
      }
    }
  }
  // `c` serves no call yet: the client's Release would not find it. A
  // daemon gone again takes them back when the session ends.
  if (!stale.empty()) (void)ReleaseChunks(c, stale, rpc_timeout);
}

}  // namespace allocd
