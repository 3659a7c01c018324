// DaemonClientOptions: how a process connects to the node daemon, read by
// every part of the client (daemon_client.h composes them).
#ifndef ALLOCD_CLIENT_DAEMON_CLIENT_OPTIONS_H_
#define ALLOCD_CLIENT_DAEMON_CLIENT_OPTIONS_H_

#include <cstddef>
#include <string>

#include "absl/time/time.h"
#include "allocd.pb.h"
#include "client/client_env.h"
#include "proto/protocol.h"

namespace allocd {

struct DaemonClientOptions {
  std::string socket = kDefaultSocket;
  std::string job;
  // The client's CUDA ordinal (as CUDA_VISIBLE_DEVICES numbers it).
  int device = 0;
  // The UUID of that GPU, "GPU-..." (GpuUuid in cuda_daemon_backend.h):
  // picks the daemon's pool for it. Empty: the daemon's first device.
  std::string gpu_uuid;
  // Canonical PYTORCH_CUDA_ALLOC_CONF the job is started with: its own,
  // where a rollback returns.
  std::string initial_config;
  // The config the process started on instead, when it started on the
  // job's learned config (AskLearnedConfig, allocd run): declared at the
  // first registration (RegisterRequest.started_on_learned), so the daemon
  // knows what the process runs and pushes nothing. Empty: it started on
  // initial_config.
  std::string started_on_learned;
  std::string description = "allocd-client";
  absl::Duration telemetry_period = absl::Milliseconds(100);
  absl::Duration reconnect_min = absl::Milliseconds(50);
  absl::Duration reconnect_max = absl::Seconds(2);
  // How long Acquire waits for a lost daemon to come back.
  absl::Duration reconnect_wait = absl::Seconds(10);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Allocator events held for the autotuner between two sends (bounds the
  // client's memory: 2 x this many events); 0: events are not recorded.
  size_t event_capacity = size_t{1} << 16;
  // What the job lets the autotuner do (pinned keys, memory fraction, a
  // mode of its own).
  v1::AutotunePreferences autotune;
  // What the process does with its CUDA memory already at registration
  // (NcclRegistersSegments); what it starts doing later goes with the
  // telemetry (DaemonClient::PublishFeatures).
  v1::JobFeatures features;
  // The process's place in a job of several (RankOf): unset for a
  // process of its own.
  v1::JobRank rank;
  // How long a grant read ahead is kept for the next Acquire of its size
  // (GrantReadAhead); zero: nothing is read ahead.
  absl::Duration read_ahead_keep = absl::ZeroDuration();
  // Whether ReleaseSoon returns chunks from a background thread
  // (ChunkReleaser) rather than waiting for the daemon: off, it is Release.
  bool release_in_background = false;
};

// The features a process registers with (DaemonClientOptions::features):
// what its environment says it will do (DeclaredFeatures: ALLOCD_FEATURES
// and NCCL's registration).
v1::JobFeatures StartFeatures();

// The rank `env` says the process is, as DaemonClientOptions::rank.
inline v1::JobRank RankOf(const ClientEnv& env) {
  v1::JobRank r;
  r.set_run_id(env.run_id);
  r.set_rank(env.rank);
  r.set_world_size(env.world_size);
  return r;
}

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_CLIENT_OPTIONS_H_
