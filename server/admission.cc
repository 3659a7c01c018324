#include "server/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/log.h"

namespace allocd {

Admission::Admission(std::string what, std::string per_tenant_flag,
                     std::string total_flag, AdmissionLimits limits)
    : what_(std::move(what)),
      per_tenant_flag_(std::move(per_tenant_flag)),
      total_flag_(std::move(total_flag)),
      limits_(limits) {}

absl::Status Admission::Take(const TenantId& tenant, absl::string_view who) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  const size_t held = it == held_.end() ? 0 : it->second;
  absl::Status refused;
  if (limits_.per_tenant != 0 && held >= limits_.per_tenant) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", tenant, " holds ", held, " ", what_, "s, its limit (",
        per_tenant_flag_, "=", limits_.per_tenant,
        "): end some first, or ask the node's admin to raise the limit"));
  } else if (limits_.total != 0 && total_ >= limits_.total) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "the daemon holds ", total_, " ", what_, "s of all tenants, its "
        "limit (", total_flag_, "=", limits_.total,
        "): retry later, or ask the node's admin to raise the limit"));
  }
  if (refused.ok()) {
    ++held_[tenant];
    ++total_;
    return refused;
  }
  refusals_.Refused(absl::Now(), what_, [&] {
    return absl::StrCat(who, "'s: ", refused.message());
  });
  return refused;
}

void Admission::Give(const TenantId& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  if (it == held_.end()) return;
  if (--it->second == 0) held_.erase(it);
  --total_;
}

size_t Admission::held(const TenantId& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant);
  return it == held_.end() ? 0 : it->second;
}

size_t Admission::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace allocd
