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
// Thread-safe.
#ifndef ALLOCD_SERVER_WORKING_SET_STORE_H_
#define ALLOCD_SERVER_WORKING_SET_STORE_H_

#include <cstdint>
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
  explicit WorkingSetStore(uint64_t max_segment_bytes);

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

 private:
  const uint64_t max_segment_bytes_;
  mutable absl::Mutex mu_;
  // By (tenant, job label, node device).
  std::map<std::tuple<TenantId, std::string, int>, std::vector<uint64_t>>
      by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_WORKING_SET_STORE_H_
