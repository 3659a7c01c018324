#include "server/working_set_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"

namespace allocd {

WorkingSetStore::WorkingSetStore(uint64_t max_segment_bytes, uint64_t max_bytes,
                                 uint64_t max_bytes_per_tenant)
    : max_segment_bytes_(max_segment_bytes),
      max_bytes_(max_bytes),
      max_bytes_per_tenant_(std::min(max_bytes_per_tenant, max_bytes)) {}

absl::Status WorkingSetStore::Report(Session& session,
                                     const v1::WorkingSet& set,
                                     uint64_t chunk_bytes) const {
  if (static_cast<size_t>(set.segment_bytes_size()) > kMaxWorkingSetSegments) {
    return absl::InvalidArgumentError(
        absl::StrCat("the working set holds ", set.segment_bytes_size(),
                     " segments; at most ", kMaxWorkingSetSegments));
  }
  for (uint64_t bytes : set.segment_bytes()) {
    if (bytes == 0 || bytes % chunk_bytes != 0 || bytes > max_segment_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a working set's segment of ", bytes,
          " bytes: each must be a multiple of ", FormatSize(chunk_bytes),
          " up to ", FormatSize(max_segment_bytes_)));
    }
  }
  session.SetWorkingSet(
      {set.segment_bytes().begin(), set.segment_bytes().end()});
  return absl::OkStatus();
}

void WorkingSetStore::Remember(const Session& ended) {
  const SessionIdentity& who = ended.identity();
  std::vector<uint64_t> segments = ended.WorkingSet();
  if (who.job.empty() || segments.empty()) return;
  Key key{who.tenant, who.job, who.node_device};
  // What a map node and list entries cost beside the segments and label.
  constexpr uint64_t kEntryBytes = 256;
  const uint64_t bytes = segments.size() * sizeof(uint64_t) + who.job.size() + kEntryBytes;
  absl::MutexLock lock(&mu_);
  if (auto it = by_job_.find(key); it != by_job_.end()) Forget(it);
  if (bytes > max_bytes_per_tenant_) return;
  std::list<Key>& tenant_order = remembered_by_tenant_[who.tenant];
  auto it = by_job_.emplace(key, Kept{std::move(segments), bytes, {}, {}}).first;
  it->second.in_all = remembered_.insert(remembered_.end(), key);
  it->second.in_tenant = tenant_order.insert(tenant_order.end(), key);
  bytes_ += bytes;
  tenant_bytes_[who.tenant] += bytes;
  while (tenant_bytes_[who.tenant] > max_bytes_per_tenant_) {
    Forget(by_job_.find(remembered_by_tenant_[who.tenant].front()));
  }
  while (bytes_ > max_bytes_) Forget(by_job_.find(remembered_.front()));
}

void WorkingSetStore::Forget(std::map<Key, Kept>::iterator it) {
  const TenantId& tenant = std::get<0>(it->first);
  remembered_.erase(it->second.in_all);
  auto order = remembered_by_tenant_.find(tenant);
  order->second.erase(it->second.in_tenant);
  bytes_ -= it->second.bytes;
  auto charged = tenant_bytes_.find(tenant);
  charged->second -= it->second.bytes;
  if (order->second.empty()) {
    remembered_by_tenant_.erase(order);
    tenant_bytes_.erase(charged);
  }
  by_job_.erase(it);
}

uint64_t WorkingSetStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

uint64_t WorkingSetStore::bytes(const TenantId& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenant_bytes_.find(tenant);
  return it == tenant_bytes_.end() ? 0 : it->second;
}

std::vector<uint64_t> WorkingSetStore::Last(const TenantId& tenant,
                                            const std::string& job,
                                            int node_device) const {
  if (job.empty()) return {};
  absl::MutexLock lock(&mu_);
  auto it = by_job_.find({tenant, job, node_device});
  return it == by_job_.end() ? std::vector<uint64_t>{} : it->second.segments;
}

}  // namespace allocd
