#include "server/pool/chunk_shares.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace allocd {

absl::Status ChunkShares::Add(const absl::Mutex&, SessionId owner,
                              std::string token,
                              absl::Span<const uint64_t> chunk_ids) {
  for (uint64_t chunk_id : chunk_ids) {
    auto named = chunk_shares_.find(chunk_id);
    if (named != chunk_shares_.end() &&
        named->second.size() >= kMaxSharesPerChunk) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chunk ", chunk_id, " is already in ", kMaxSharesPerChunk,
          " shares; nothing was shared (share a segment once and pass its "
          "token on; a share ends when its owner releases the memory)"));
    }
  }
  for (uint64_t chunk_id : chunk_ids) chunk_shares_[chunk_id].insert(token);
  sessions_[owner].shared.insert(token);
  shares_[std::move(token)] =
      Share{.owner = owner, .chunk_ids = {chunk_ids.begin(), chunk_ids.end()}};
  return absl::OkStatus();
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

void ChunkShares::EndShares(const absl::Mutex&,
                            const absl::flat_hash_set<uint64_t>& given_up) {
  std::vector<std::string> ending;
  for (uint64_t chunk_id : given_up) {
    auto named = chunk_shares_.find(chunk_id);
    if (named == chunk_shares_.end()) continue;
    ending.insert(ending.end(), named->second.begin(), named->second.end());
  }
  // A share of several given-up chunks is listed once for each.
  std::sort(ending.begin(), ending.end());
  ending.erase(std::unique(ending.begin(), ending.end()), ending.end());
  for (const std::string& token : ending) EndShare(token);
}

std::vector<uint64_t> ChunkShares::EndSession(const absl::Mutex& pool_mu,
                                              SessionId id) {
  if (auto session = sessions_.find(id); session != sessions_.end()) {
    const std::vector<std::string> shared(session->second.shared.begin(),
                                          session->second.shared.end());
    for (const std::string& token : shared) EndShare(token);
  }
  std::vector<uint64_t> unheld;
  for (auto session = sessions_.find(id); session != sessions_.end();
       session = sessions_.find(id)) {
    const std::string token = session->second.opened.begin()->first;
    std::vector<uint64_t> closed = *Close(pool_mu, id, token);
    unheld.insert(unheld.end(), closed.begin(), closed.end());
  }
  return unheld;
}

void ChunkShares::EndShare(const std::string& token) {
  auto share = shares_.find(token);  // present while it takes opens
  Share& ended = share->second;
  ended.open = false;
  for (uint64_t chunk_id : ended.chunk_ids) {
    auto named = chunk_shares_.find(chunk_id);
    named->second.erase(token);
    if (named->second.empty()) chunk_shares_.erase(named);
  }
  const SessionId owner = ended.owner;
  if (ended.opens == 0) shares_.erase(share);
  sessions_[owner].shared.erase(token);
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
