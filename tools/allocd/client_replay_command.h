// `allocd client-replay`: drives the real client library with a trace: a
// session with the node daemon, segments from daemon chunks (mapped and
// touched), telemetry, config pushes applied between events and ACKed,
// reclaim requests answered, OOMs reported. How the daemon is load-tested
// and demonstrated without a GPU.
#ifndef ALLOCD_TOOLS_ALLOCD_CLIENT_REPLAY_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_CLIENT_REPLAY_COMMAND_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "proto/protocol.h"

namespace allocd {

struct ClientReplayCommandOptions {
  std::string trace_path;
  std::string socket = kDefaultSocket;
  std::string job;
  std::string config;
  int device = -1;
  // The daemon's GPU whose pool serves the replay, by UUID (a sim daemon's
  // are SIM-GPU-0, SIM-GPU-1, ...); empty: the daemon's first.
  std::string gpu_uuid;
  // Replays the trace this many times...
  int loops = 1;
  // ...or, when > 0, again and again until this many seconds have passed,
  // stopping in the middle of a replay when time is up.
  double duration_seconds = 0;
  // > 0: each event waits for its time in the recorded run (time_us)
  // divided by this, so the daemon sees the job's real event rate; 0: as
  // fast as it can.
  double speed = 0;
  bool json = false;
  // The job's autotune preferences.
  std::vector<std::string> pinned_keys;
  std::string autotune_mode;
};

// SIGINT and SIGTERM, once the session is up, stop the replay at its next
// safe point, as when the duration is up. Returns the exit code: 0 when
// every loop ran or it was stopped (OOMs included, reported), 1 on an error
// printed to `err` (no daemon, bad trace or config).
int RunClientReplay(const ClientReplayCommandOptions& options,
                    std::ostream& out, std::ostream& err);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_CLIENT_REPLAY_COMMAND_H_
