#include "server/quotas.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace allocd {

Quotas::Quotas(const DevicePools* pools, const SessionRegistry* sessions,
               Tenancy tenancy)
    : pools_(pools), sessions_(sessions), tenancy_(tenancy) {}

absl::Status Quotas::Set(const v1::SetQuotaRequest& r) {
  std::optional<size_t> bytes;
  if (r.has_bytes()) bytes = r.bytes();
  switch (r.target_case()) {
    case v1::SetQuotaRequest::kSessionId: {
      std::shared_ptr<Session> session = sessions_->Find(r.session_id());
      if (session == nullptr) {
        return absl::NotFoundError(
            absl::StrCat("no session ", r.session_id()));
      }
      pools_->at(session->identity().node_device)
          .pool->SetSessionQuota(r.session_id(), bytes);
      return absl::OkStatus();
    }
    case v1::SetQuotaRequest::kUid:
      SetUid(r.uid(), bytes);
      return absl::OkStatus();
    case v1::SetQuotaRequest::kTenant:
      if (absl::Status valid = ValidateTenant(tenancy_, r.tenant());
          !valid.ok()) {
        return valid;
      }
      SetTenant(r.tenant(), bytes);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "a quota names a session_id, a uid or a tenant");
  }
}

void Quotas::SetUid(uid_t uid, std::optional<uint64_t> bytes) {
  for (const DevicePool& device : pools_->devices()) {
    device.pool->SetUidQuota(uid, bytes);
  }
}

void Quotas::SetTenant(const TenantId& tenant, std::optional<uint64_t> bytes) {
  for (const DevicePool& device : pools_->devices()) {
    device.pool->SetTenantQuota(tenant, bytes);
  }
}

}  // namespace allocd
