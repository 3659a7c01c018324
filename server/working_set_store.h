// WorkingSetStore: the working set an ended session reported (its
// segments' sizes at its peak, TelemetryReport.working_set), kept for the
// next session of its job on its device (RegisterResponse.working_set),
// which can then ask for those segments up front. By tenant, job label and
// node device, the last session to end wins: a label is its tenant's, so a
// session of another tenant under the same label is handed nothing and
// what it reports never reaches this tenant's next session. A job without a
// label has no next session to recognise. In memory only: a restarted daemon hands over
// nothing until a session of the job ends again.
//
// Bounded, so that a flood of labels leaves nothing behind: what is kept
// for one tenant, and for all, is at most so many bytes (about 8 a segment
// and the label), the least recently remembered going first; a tenant's
// flood drops only its own beyond its share.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_WORKING_SET_STORE_H_
#define ALLOCD_SERVER_WORKING_SET_STORE_H_

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "allocd.pb.h"
#include "server/session_registry.h"
#include "server/tenant_id.h"

namespace allocd {

class WorkingSetStore {
 public:
  // A segment is at most `max_segment_bytes` (what one acquire may ask).
  // What is kept is at most `max_bytes`, of which one tenant's is at most
  // `max_bytes_per_tenant`.
  explicit WorkingSetStore(uint64_t max_segment_bytes, uint64_t max_bytes = 32 << 20,
                           uint64_t max_bytes_per_tenant = 8 << 20);

  // `session`'s telemetry reported `set`, made of chunks of `chunk_bytes`
  // (its pool's smallest): the session keeps it (Session::SetWorkingSet)
  // until it ends. InvalidArgument, keeping the one before, for a set that
  // cannot be one: over kMaxWorkingSetSegments segments, or a segment that
  // is not a positive multiple of `chunk_bytes` up to the largest.
  absl::Status Report(Session& session, const v1::WorkingSet& set,
                      uint64_t chunk_bytes) const;
  // Keeps what `ended` reported last for its job's next session. Call
  // before the registry forgets it: that session may register the moment
  // it is gone.
  void Remember(const Session& ended) ABSL_LOCKS_EXCLUDED(mu_);
  // What to hand a new session of `tenant`'s `job` on node device
  // `node_device`: empty when nothing is kept (or `job` is empty).
  std::vector<uint64_t> Last(const TenantId& tenant, const std::string& job,
                             int node_device) const ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes kept, all told and for `tenant`.
  uint64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t bytes(const TenantId& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // (tenant, job label, node device).
  using Key = std::tuple<TenantId, std::string, int>;
  struct Kept {
    std::vector<uint64_t> segments;
    uint64_t bytes = 0;
    std::list<Key>::iterator in_all;     // its place in `remembered_`
    std::list<Key>::iterator in_tenant;  // and in its tenant's
  };
  void Forget(std::map<Key, Kept>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_segment_bytes_;
  const uint64_t max_bytes_;
  const uint64_t max_bytes_per_tenant_;
  mutable absl::Mutex mu_;
  std::map<Key, Kept> by_job_ ABSL_GUARDED_BY(mu_);
  // Least recently remembered first: all, and each tenant's.
  std::list<Key> remembered_ ABSL_GUARDED_BY(mu_);
  std::map<TenantId, std::list<Key>> remembered_by_tenant_ ABSL_GUARDED_BY(mu_);
  std::map<TenantId, uint64_t> tenant_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_WORKING_SET_STORE_H_
