#include "server/pool/chunk_shares.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"

namespace allocd {

void ChunkShares::Add(const absl::Mutex&, SessionId owner, std::string token,
                      absl::Span<const uint64_t> chunk_ids) {
  sessions_[owner].shared.insert(token);
  shares_[std::move(token)] =
      Share{.owner = owner, .chunk_ids = {chunk_ids.begin(), chunk_ids.end()}};
}

absl::StatusOr<std::vector<uint64_t>> ChunkShares::Open(
    const absl::Mutex&, SessionId opener, absl::string_view token) {
  auto share = shares_.find(token);
  if (share == shares_.end() || !share->second.open) {
    return absl::NotFoundError(
        "unknown share token, or its owner freed the memory or ended");
  }
  for (uint64_t chunk_id : share->second.chunk_ids) ++chunk_opens_[chunk_id];
  ++share->second.opens;
  ++sessions_[opener].opened[share->first];
  return share->second.chunk_ids;
}

std::optional<std::vector<uint64_t>> ChunkShares::Close(
    const absl::Mutex&, SessionId opener, absl::string_view token) {
  auto session = sessions_.find(opener);
  if (session == sessions_.end()) return std::nullopt;
  auto opened = session->second.opened.find(token);
  if (opened == session->second.opened.end()) return std::nullopt;
  if (--opened->second == 0) session->second.opened.erase(opened);
  ForgetIfIdle(opener);
  auto share = shares_.find(token);  // present while opens > 0
  std::vector<uint64_t> unheld;
  for (uint64_t chunk_id : share->second.chunk_ids) {
    auto opens = chunk_opens_.find(chunk_id);  // held by this open
    if (--opens->second == 0) {
      chunk_opens_.erase(opens);
      unheld.push_back(chunk_id);
    }
  }
  if (--share->second.opens == 0 && !share->second.open) shares_.erase(share);
  return unheld;
}

std::optional<SessionId> ChunkShares::OwnerOf(const absl::Mutex&,
                                             absl::string_view token) const {
  auto share = shares_.find(token);
  if (share == shares_.end() || !share->second.open) return std::nullopt;
  return share->second.owner;
}

bool ChunkShares::IsOpen(const absl::Mutex&, uint64_t chunk_id) const {
  return chunk_opens_.contains(chunk_id);
}

void ChunkShares::EndShares(const absl::Mutex&, SessionId owner,
                            const absl::flat_hash_set<uint64_t>& given_up) {
  EndSharesIf(owner, [&](const Share& share) {
    return std::any_of(share.chunk_ids.begin(), share.chunk_ids.end(),
                       [&](uint64_t id) { return given_up.contains(id); });
  });
}

std::vector<uint64_t> ChunkShares::EndSession(const absl::Mutex& pool_mu,
                                              SessionId id) {
  EndSharesIf(id, [](const Share&) { return true; });
  std::vector<uint64_t> unheld;
  for (auto session = sessions_.find(id); session != sessions_.end();
       session = sessions_.find(id)) {
    const std::string token = session->second.opened.begin()->first;
    std::vector<uint64_t> closed = *Close(pool_mu, id, token);
    unheld.insert(unheld.end(), closed.begin(), closed.end());
  }
  return unheld;
}

void ChunkShares::EndSharesIf(SessionId owner,
                              absl::FunctionRef<bool(const Share&)> affected) {
  auto session = sessions_.find(owner);
  if (session == sessions_.end()) return;
  absl::flat_hash_set<std::string>& shared = session->second.shared;
  for (auto it = shared.begin(); it != shared.end();) {
    auto share = shares_.find(*it);  // present while the owner lists it
    if (!affected(share->second)) {
      ++it;
      continue;
    }
    share->second.open = false;
    if (share->second.opens == 0) shares_.erase(share);
    shared.erase(it++);
  }
  ForgetIfIdle(owner);
}

void ChunkShares::ForgetIfIdle(SessionId id) {
  auto session = sessions_.find(id);
  if (session != sessions_.end() && session->second.shared.empty() &&
      session->second.opened.empty()) {
    sessions_.erase(session);
  }
}

}  // namespace allocd
