// ControlStream: what the daemon asks of the process (config pushes,
// reclaim requests, what it reads of the allocation stream) and the process's answers (ACKs, OOM reports).
//
// The session thread reads the daemon's control stream (Watch) and queues
// what arrives for the engine's thread to handle at a safe point (Take),
// since the engine is not thread-safe. A reclaim request first gives back
// what the client read ahead and delivers its pending releases, then runs
// the process's reclaim hook, and is queued for what the allocator still
// has to give back.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_CONTROL_STREAM_H_
#define ALLOCD_CLIENT_CONTROL_STREAM_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocd.pb.h"
#include "client/daemon_connection.h"

namespace allocd {

class ControlStream {
 public:
  // Answers on `active`'s current session within `rpc_timeout`;
  // `give_back` gives back what the client read ahead and delivers the
  // releases it has pending (ChunkGrants::GiveBackForReclaim), and returns
  // the bytes read ahead it gave back. `active` outlives the stream.
  ControlStream(ActiveConnection& active, absl::Duration rpc_timeout,
                std::function<uint64_t()> give_back);

  // Reads the control stream of `c` until it ends: the daemon or the
  // session went away, or `active` lost `c` or stopped (it cancels the
  // read). On the session thread.
  void Watch(Connection& c) ABSL_LOCKS_EXCLUDED(mu_, reclaim_mu_);
  // Forgets what is queued: after a reconnect it names versions the new
  // daemon does not know, so it is not to be done.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // Control messages received since the last call, in order. A reclaim's
  // bytes are what the allocator has to give back once what the client
  // read ahead and the reclaim hook gave went (0, as the daemon asks it:
  // everything); a reclaim they covered is not queued.
  std::vector<v1::ControlMessage> Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for a message to be queued; true when one is
  // (left for Take). Lets a caller that polls Take act on a push as it
  // arrives, not at its next round.
  bool AwaitMessage(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every AwaitMessage now and makes later ones return at once: a
  // caller that blocks there for as long as no message comes (no wake-ups
  // to check whether it should stop) is stopped with this.
  void StopWaiting() ABSL_LOCKS_EXCLUDED(mu_);
  // ACK (applied) or NACK a pushed config version.
  absl::Status Ack(uint64_t version, bool applied, absl::string_view error);
  // An allocation of `requested_bytes` failed under `config_version`;
  // `message` (PyTorch's text) is cut to 4 KiB.
  absl::Status ReportOom(uint64_t requested_bytes, absl::string_view message,
                         uint64_t config_version);

  // `drop` runs (on the session thread) when the daemon asks the process
  // to give memory back and what was read ahead did not cover it, before
  // the request is queued for Take: with the bytes still asked (0:
  // everything), it returns the bytes it gives back. It must not wait for
  // the caller's own locks. OnReclaim(nullptr) returns after a call in
  // progress.
  void OnReclaim(std::function<uint64_t(uint64_t bytes)> drop)
      ABSL_LOCKS_EXCLUDED(reclaim_mu_);
  // Reclaim requests received.
  int64_t reclaims() const { return reclaims_.load(); }
  // The daemon's StreamDemands (not queued for Take: the engine has
  // nothing to do for one): how many came, and the newest.
  struct StreamDemands {
    int64_t count = 0;
    uint64_t from_reserved = 0;
    std::string reason;
  };
  StreamDemands stream_demands() const ABSL_LOCKS_EXCLUDED(mu_);
  // When the daemon last asked the process to give memory back
  // (absl::InfinitePast() before it first asks).
  absl::Time last_reclaim() const {
    const int64_t ns = last_reclaim_ns_.load(std::memory_order_relaxed);
    return ns == 0 ? absl::InfinitePast() : absl::FromUnixNanos(ns);
  }

 private:
  ActiveConnection& active_;
  const absl::Duration rpc_timeout_;
  // Gives back what the client read ahead, then runs the reclaim hook,
  // for `reclaim`, which it leaves asking what is left for the allocator;
  // false when nothing is.
  bool GiveBackFirst(v1::ReclaimRequest& reclaim)
      ABSL_LOCKS_EXCLUDED(reclaim_mu_);

  const std::function<uint64_t()> give_back_;
  std::atomic<int64_t> reclaims_ = 0;

  mutable absl::Mutex mu_;
  std::deque<v1::ControlMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool waiting_stopped_ ABSL_GUARDED_BY(mu_) = false;
  StreamDemands stream_demands_ ABSL_GUARDED_BY(mu_);
  // Held while the reclaim hook runs.
  absl::Mutex reclaim_mu_;
  std::function<uint64_t(uint64_t)> on_reclaim_ ABSL_GUARDED_BY(reclaim_mu_);
  std::atomic<int64_t> last_reclaim_ns_{0};
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CONTROL_STREAM_H_
