#include "server/pool/session_ledger.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {

absl::Status SessionLedger::Add(const absl::Mutex&, SessionId id, uid_t uid,
                                pid_t pid, TenantId tenant) {
  if (id == 0) {
    return absl::InvalidArgumentError("session id 0 is reserved");
  }
  if (tenant.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", id, " has no tenant"));
  }
  if (!sessions_
           .try_emplace(id, Session{.uid = uid,
                                    .pid = pid,
                                    .tenant = std::move(tenant),
                                    .incarnation = next_incarnation_})
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("session ", id, " is already in the node pool"));
  }
  ++next_incarnation_;
  return absl::OkStatus();
}

absl::StatusOr<SessionLedger::Session*> SessionLedger::Find(const absl::Mutex&,
                                                            SessionId id) {
  auto s = sessions_.find(id);
  if (s == sessions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no session ", id, " in the node pool"));
  }
  return &s->second;
}

SessionLedger::Session* SessionLedger::FindIncarnation(const absl::Mutex&,
                                                       SessionId id,
                                                       uint64_t incarnation) {
  auto s = sessions_.find(id);
  return s != sessions_.end() && s->second.incarnation == incarnation
             ? &s->second
             : nullptr;
}

void SessionLedger::End(const absl::Mutex& pool_mu, SessionId id) {
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return;
  SubtractHeld(pool_mu, s->second, s->second.held);
  sessions_.erase(s);
}

void SessionLedger::ForEach(
    const absl::Mutex&,
    absl::FunctionRef<void(SessionId, const Session&)> visit) const {
  for (const auto& [id, s] : sessions_) visit(id, s);
}

void SessionLedger::AddHeld(const absl::Mutex&, Session& s, uint64_t bytes) {
  ++version_;
  s.held += bytes;
  uid_held_[s.uid] += bytes;
  tenant_held_[s.tenant] += bytes;
}

void SessionLedger::SubtractHeld(const absl::Mutex&, Session& s,
                                 uint64_t bytes) {
  if (bytes == 0) return;
  ++version_;
  s.held -= bytes;
  auto it = uid_held_.find(s.uid);  // present: it counts s.held
  it->second -= bytes;
  if (it->second == 0) uid_held_.erase(it);
  auto t = tenant_held_.find(s.tenant);  // present, as above
  t->second -= bytes;
  if (t->second == 0) tenant_held_.erase(t);
}

absl::Status SessionLedger::CheckQuotas(const absl::Mutex&, SessionId id,
                                        const Session& s,
                                        uint64_t bytes) const {
  if (s.quota && s.held + bytes > *s.quota) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session quota exceeded: session ", id, " holds ", FormatSize(s.held),
        ", asks ", FormatSize(bytes), ", quota ", FormatSize(*s.quota)));
  }
  if (auto q = uid_quotas_.find(s.uid); q != uid_quotas_.end()) {
    auto h = uid_held_.find(s.uid);
    const uint64_t held = h == uid_held_.end() ? 0 : h->second;
    if (held + bytes > q->second) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid quota exceeded: the sessions of uid ", s.uid, " hold ",
          FormatSize(held), ", asks ", FormatSize(bytes), ", quota ",
          FormatSize(q->second)));
    }
  }
  std::optional<uint64_t> tenant_quota = default_tenant_quota_;
  if (auto q = tenant_quotas_.find(s.tenant); q != tenant_quotas_.end()) {
    tenant_quota = q->second;
  }
  if (tenant_quota) {
    auto h = tenant_held_.find(s.tenant);
    const uint64_t held = h == tenant_held_.end() ? 0 : h->second;
    if (held + bytes > *tenant_quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", s.tenant, " quota exceeded: its sessions hold ",
          FormatSize(held), ", asks ", FormatSize(bytes), ", quota ",
          FormatSize(*tenant_quota)));
    }
  }
  return absl::OkStatus();
}

bool SessionLedger::SetSessionQuota(const absl::Mutex&, SessionId id,
                                    std::optional<uint64_t> bytes) {
  auto s = sessions_.find(id);
  if (s == sessions_.end()) return false;
  s->second.quota = bytes;
  return true;
}

void SessionLedger::SetUidQuota(const absl::Mutex&, uid_t uid,
                                std::optional<uint64_t> bytes) {
  if (bytes) {
    uid_quotas_[uid] = *bytes;
  } else {
    uid_quotas_.erase(uid);
  }
}

void SessionLedger::SetTenantQuota(const absl::Mutex&, const TenantId& tenant,
                                   std::optional<uint64_t> bytes) {
  if (bytes) {
    tenant_quotas_[tenant] = *bytes;
  } else {
    tenant_quotas_.erase(tenant);
  }
}

void SessionLedger::SetDefaultTenantQuota(const absl::Mutex&,
                                          std::optional<uint64_t> bytes) {
  default_tenant_quota_ = bytes;
}

uint64_t SessionLedger::NewGrant(const absl::Mutex&) { return next_grant_++; }

void SessionLedger::NoteChange(const absl::Mutex&) { ++version_; }

}  // namespace allocd
