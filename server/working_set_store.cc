#include "server/working_set_store.h"

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"

namespace allocd {

WorkingSetStore::WorkingSetStore(uint64_t max_segment_bytes)
    : max_segment_bytes_(max_segment_bytes) {}

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
  absl::MutexLock lock(&mu_);
  by_job_[{who.tenant, who.job, who.node_device}] = std::move(segments);
}

std::vector<uint64_t> WorkingSetStore::Last(const TenantId& tenant,
                                            const std::string& job,
                                            int node_device) const {
  if (job.empty()) return {};
  absl::MutexLock lock(&mu_);
  auto it = by_job_.find({tenant, job, node_device});
  return it == by_job_.end() ? std::vector<uint64_t>{} : it->second;
}

}  // namespace allocd
