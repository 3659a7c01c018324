// WorkingSetHandover: the segments a job held last time, mapped before the
// process asks for them.
//
// A job that starts again (a restart, the next run of a pipeline) asks for
// the segments its last run held, one cudaMalloc at a time. From a warm
// pool each costs the import, map and access of cached chunks, which alone
// are about 1.4x a native cudaMalloc on an H100, before any round trip; no
// path that maps on demand gets near native there. So the daemon hands a
// registering session its job's last working set (the segment sizes at its
// peak, RegisterResponse.working_set), and this class fetches those
// segments' chunks from the daemon's cache and maps them on a background
// thread while the job starts (imports, loads its model); a segment request
// of a size it has ready takes one, mapped, at the cost of a lookup.
//
// It only ever holds memory the daemon had cached and nobody used: a fetch
// is a read-ahead (DaemonClient::AcquireAhead: nothing created, nothing
// waited for, the pool left as much again free), and the first one the
// daemon refuses ends the preparation. What is ready and not taken is
// reported as read ahead (a reclaim counts it as cached) and given back
// - when the daemon asks the process to give memory back (Drop);
// - `keep` after the process last took one, or after its first request if
//   none matched; before any request, kFirstRequestWait after the
//   preparation (a job loading its model from slow storage);
// - when this object is destroyed.
// A request of a size still to be prepared takes that size off the plan
// (the caller maps its own), unless the thread is fetching or mapping one
// of that size now: then it waits for it, which is never slower than
// mapping its own beside it (the driver serialises the two).
//
// Thread-safe. One background thread fetches, maps and gives back.
#ifndef ALLOCD_CLIENT_WORKING_SET_HANDOVER_H_
#define ALLOCD_CLIENT_WORKING_SET_HANDOVER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/received_chunks.h"

namespace allocd {

class WorkingSetHandover {
 public:
  // A grant mapped into a range of its own, ready to be a segment: what a
  // Map made; `handle`s and all are the mapper's business.
  struct Segment {
    uint64_t address = 0;
    uint64_t bytes = 0;
    uint64_t epoch = 0;
    std::vector<uint64_t> ids;
    std::vector<uint64_t> sizes;
    std::vector<uint64_t> handles;
  };
  // Up to `count` grants of `bytes` each from the daemon's cache
  // (DaemonClient::AcquireAhead); none ends the preparation.
  using Fetch =
      std::function<std::vector<ReceivedChunks>(uint64_t bytes, uint32_t count)>;
  // Maps `grant` whole into a new range; on failure it has given the grant
  // back itself.
  using Map = std::function<absl::StatusOr<Segment>(ReceivedChunks grant)>;
  // Unmaps a segment nobody took and returns its chunks.
  using GiveBack = std::function<void(Segment)>;
  // Returns a grant fetched and not mapped (dropped meanwhile).
  using Release = std::function<void(ReceivedChunks)>;
  // The bytes held and not taken, after every change.
  using Report = std::function<void(uint64_t bytes)>;

  struct Callbacks {
    Fetch fetch;
    Map map;
    GiveBack give_back;
    Release release;
    Report report;
  };

  // How long segments are kept for a process that has not asked for any.
  static constexpr absl::Duration kFirstRequestWait = absl::Seconds(60);
  // The most grants one fetch asks for (as GrantReadAhead).
  static constexpr uint32_t kMaxBatch = 8;

  // Starts preparing `plan` (segment sizes, in the order the job asked for
  // them) at once.
  WorkingSetHandover(std::vector<uint64_t> plan, Callbacks callbacks,
                     absl::Duration keep);
  // Stops and gives back everything not taken.
  ~WorkingSetHandover();
  WorkingSetHandover(const WorkingSetHandover&) = delete;
  WorkingSetHandover& operator=(const WorkingSetHandover&) = delete;

  // The process needs a segment of `bytes`: one mapped ahead, or nullopt
  // (the caller maps its own). Call it for every segment request: the first
  // starts the keep.
  std::optional<Segment> Take(uint64_t bytes);
  // Gives back everything not taken and prepares nothing more; returns
  // the bytes that held, at once (the background thread unmaps).
  uint64_t Drop();

  struct Counts {
    uint64_t prepared = 0;    // segments mapped ahead
    uint64_t taken = 0;       // of them, taken by Take
    uint64_t given_back = 0;  // of them, given back untaken
  };
  Counts counts() const;
  // Whether the preparation ended (plan done, refused or dropped).
  bool prepared() const;
  // Waits until the preparation ended; false after `timeout`.
  bool WaitPrepared(absl::Duration timeout) const;

 private:
  void Run();
  // Whether nothing is (or may be) kept any longer; Expired: that, or
  // the keep has run out.
  bool NothingToKeep() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool Expired() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Time Deadline() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ReportHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Callbacks callbacks_;
  const absl::Duration keep_;

  mutable absl::Mutex mu_;
  std::deque<uint64_t> plan_ ABSL_GUARDED_BY(mu_);
  // Segments ready, by size, oldest first.
  std::map<uint64_t, std::deque<Segment>> ready_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The size being fetched or mapped now, and how many of it are coming.
  uint64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t in_flight_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool preparing_ ABSL_GUARDED_BY(mu_) = true;
  bool dropped_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time prepared_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::optional<absl::Time> last_request_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_WORKING_SET_HANDOVER_H_
