// AcceptPacer: how fast each peer uid may open connections to one of the
// daemon's sockets: a token bucket per uid, taken at accept, from the
// kernel's SO_PEERCRED, before anything else is spent on the connection (no
// tenant lookup, no gRPC handshake). A connection past its uid's rate is
// closed at once, so that one uid opening and closing connections as fast
// as it can costs the daemon an accept and a close each, and its accepting
// thread keeps up with the others' connections. A refusal is logged (a
// flood of them at most every 10 s, with their count), naming the flag.
//
// Not thread-safe: one socket's loop owns it.
#ifndef ALLOCD_SERVER_ACCEPT_PACER_H_
#define ALLOCD_SERVER_ACCEPT_PACER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/log.h"

namespace allocd {

struct AcceptRate {
  // Connections one uid may open per second, on average; 0: no bound.
  double per_second = 0;
  // How many it may open at once, after a quiet while: processes that
  // start together connect together.
  double burst = 0;
};

class AcceptPacer {
 public:
  // `what` names the socket in refusals ("client-socket connection");
  // `flag` is the flag that sets the rate.
  AcceptPacer(std::string what, std::string flag, AcceptRate rate);

  // Takes one of `uid`'s tokens at `now`, or ResourceExhausted (nothing
  // taken) saying the rate and the flag that raises it; `pid` goes in the
  // log line.
  absl::Status Take(uid_t uid, pid_t pid, absl::Time now);

  // The uids it keeps a bucket for (its memory): past a few thousand, those
  // whose bucket has filled up again, as if never seen, are dropped.
  size_t tracked_uids() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    absl::Time filled_at;
  };

  const std::string what_;
  const std::string flag_;
  const AcceptRate rate_;
  absl::flat_hash_map<uid_t, Bucket> buckets_;
  RefusalLog refusals_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_ACCEPT_PACER_H_
