// Quotas: what one session, or all the sessions of one uid or of one
// tenant on a GPU, may hold of that GPU's pool. The pools keep and enforce
// them (NodePool::SetSessionQuota, SetUidQuota, SetTenantQuota: a quota
// lowered below what is held revokes nothing, it refuses further
// acquires); this part takes an admin's quota to the pools it concerns.
//
// Thread-safe: no state of its own.
#ifndef ALLOCD_SERVER_QUOTAS_H_
#define ALLOCD_SERVER_QUOTAS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "allocd.pb.h"
#include "server/pool/device_pools.h"
#include "server/session_registry.h"
#include "server/tenant.h"
#include "server/tenant_id.h"

namespace allocd {

class Quotas {
 public:
  // `pools` and `sessions` outlive this; `tenancy` says which tenants
  // there can be.
  Quotas(const DevicePools* pools, const SessionRegistry* sessions,
         Tenancy tenancy);

  // A session's quota (on its device's pool), a uid's (SetUid) or a
  // tenant's (SetTenant); without bytes, removes it. NotFound for a session
  // that is not live; InvalidArgument for a request that names none, or a
  // tenant no peer can have under the tenancy (ValidateTenant).
  absl::Status Set(const v1::SetQuotaRequest& r);
  // A uid quota (nullopt: none) on every device: what the uid's sessions
  // on one GPU may hold together.
  void SetUid(uid_t uid, std::optional<uint64_t> bytes);
  // A tenant quota (nullopt: none, the default's if one is set) on every
  // device: what the tenant's sessions on one GPU may hold together.
  void SetTenant(const TenantId& tenant, std::optional<uint64_t> bytes);

 private:
  const DevicePools* const pools_;
  const SessionRegistry* const sessions_;
  const Tenancy tenancy_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_QUOTAS_H_
