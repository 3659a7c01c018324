#include "server/pool/claim_tokens.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace allocd {

absl::StatusOr<std::string> NewToken() {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("getrandom for a claim token: ", strerror(errno)));
    }
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof bytes));
}

void ClaimTokens::Add(const absl::Mutex&, std::string token,
                      PendingClaim claim) {
  claim.expires = now_() + ttl_;
  claims_[std::move(token)] = std::move(claim);
}

absl::StatusOr<PendingClaim> ClaimTokens::TakeFor(const absl::Mutex&,
                                                  absl::string_view token,
                                                  pid_t pid) {
  auto it = claims_.find(token);
  if (it == claims_.end()) {
    return absl::NotFoundError("unknown, used or expired claim token");
  }
  if (it->second.pid != pid) {
    // Which process it was granted to is that process's business.
    return absl::PermissionDeniedError(absl::StrCat(
        "the claim token was granted to another process; pid ", pid,
        " may not claim it"));
  }
  PendingClaim claim = std::move(it->second);
  claims_.erase(it);
  return claim;
}

std::optional<PendingClaim> ClaimTokens::Take(const absl::Mutex&,
                                              absl::string_view token) {
  auto it = claims_.find(token);
  if (it == claims_.end()) return std::nullopt;
  PendingClaim claim = std::move(it->second);
  claims_.erase(it);
  return claim;
}

void ClaimTokens::PutBack(const absl::Mutex&, std::string token,
                          PendingClaim claim) {
  claims_.emplace(std::move(token), std::move(claim));
}

std::vector<PendingClaim> ClaimTokens::TakeExpired(const absl::Mutex&) {
  const absl::Time now = now_();
  std::vector<PendingClaim> expired;
  absl::erase_if(claims_, [&](auto& c) {
    if (c.second.expires > now) return false;
    expired.push_back(std::move(c.second));
    return true;
  });
  return expired;
}

void ClaimTokens::EndSession(const absl::Mutex&, SessionId id) {
  absl::erase_if(claims_,
                 [id](const auto& c) { return c.second.session == id; });
}

}  // namespace allocd
