#include "server/session_limits.h"

namespace allocd {

SessionLimits::SessionLimits(SessionLimitsOptions options)
    : sessions_("session", "--max-sessions-per-tenant", "--max-sessions",
                options.sessions),
      unleased_("unleased session",
                "--max-unleased-sessions-per-tenant",
                "--max-unleased-sessions",
                options.unleased) {}

absl::Status SessionLimits::Admit(SessionId id, const TenantId& tenant,
                                  absl::string_view who) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = unleased_.Take(tenant, who); !s.ok()) return s;
  if (absl::Status s = sessions_.Take(tenant, who); !s.ok()) {
    unleased_.Give(tenant);
    return s;
  }
  counted_[id] = {.tenant = tenant};
  return absl::OkStatus();
}

void SessionLimits::Leased(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = counted_.find(id);
  if (it == counted_.end() || !it->second.unleased) return;
  it->second.unleased = false;
  unleased_.Give(it->second.tenant);
}

void SessionLimits::Ended(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = counted_.find(id);
  if (it == counted_.end()) return;
  if (it->second.unleased) unleased_.Give(it->second.tenant);
  sessions_.Give(it->second.tenant);
  counted_.erase(it);
}

}  // namespace allocd
