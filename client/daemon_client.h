// DaemonClient: a process's connection to the node daemon (`allocd serve`).
//
// Connect() registers a session and opens its lease (the side-socket
// connection whose life is the session's). Then:
// - Acquire/Release get and return chunks; Acquire's FDs arrive over the
//   lease connection with SCM_RIGHTS;
// - a background thread watches the daemon's control stream (config pushes,
//   reclaim requests) and queues what arrives for the engine's thread to
//   handle at a safe point (TakeControl), since the engine is not
//   thread-safe;
// - a background thread streams the latest stats (PublishStats) as
//   telemetry, and with them, in packed batches, the allocator events the
//   engine recorded (events()) for the daemon's autotuner;
// - when the daemon goes away, the same thread reconnects with exponential
//   backoff and registers a new session (the epoch goes up), and before
//   the new session serves any call it re-declares every chunk the process
//   holds (Acquire'd and not Released), so the restarted daemon counts
//   them and promises their memory to nobody else (NodePool::Adopt). What
//   the client proves: in sim mode the chunk's memfd (the client keeps an
//   FD of each chunk it holds, and passes a copy back); with CUDA, ids and
//   sizes alone, since the client holds the imported allocation handles
//   but exporting each again would cost about 1 ms per chunk. Chunks the
//   new daemon adopted are released to it as usual (Release with the epoch
//   they were granted in); one it refused stays mapped and usable, and its
//   Release only drops it here. The new session also re-declares the
//   config the process runs (SetRunning), so a restarted daemon does not
//   push it again.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_DAEMON_CLIENT_H_
#define ALLOCD_CLIENT_DAEMON_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocd.pb.h"
#include "client/event_recorder.h"
#include "ipc/unix_socket.h"

namespace allocd {

struct DaemonClientOptions {
  std::string socket = "/run/allocd/allocd.sock";
  std::string job;
  // The client's CUDA ordinal (as CUDA_VISIBLE_DEVICES numbers it).
  int device = 0;
  // The UUID of that GPU, "GPU-..." (GpuUuid in cuda_daemon_backend.h):
  // picks the daemon's pool for it. Empty: the daemon's first device.
  std::string gpu_uuid;
  // Canonical PYTORCH_CUDA_ALLOC_CONF the process starts with.
  std::string initial_config;
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
  // How long a grant read ahead is kept for the next Acquire of its size
  // (GrantReadAhead); zero: nothing is read ahead.
  absl::Duration read_ahead_keep = absl::ZeroDuration();
};

// Chunks the daemon handed over, in id order: chunk i is sizes[i] bytes at
// offsets[i] of fds[i], mapped whole.
struct ReceivedChunks {
  uint64_t epoch = 0;
  std::vector<uint64_t> ids;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  uint32_t reused = 0;
  // The last client_made chunks (Acquire with client_creates) have no FD
  // (fds[i] invalid, offsets[i] 0): the process makes each itself, one
  // allocation of sizes[i], and holds and releases it as a granted one.
  uint32_t client_made = 0;

  // The bytes of all the chunks.
  uint64_t bytes() const {
    return std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  }
};

// The grants of `grant`, which holds several of `each` bytes in a row (a
// read-ahead's answer, AcquireChunksRequest.count): each its chunks,
// adding up to `each`, in order, reused chunks counted first and
// client-made ones (the answer's last) last.
// InvalidArgument when its chunks do not fall on those boundaries.
absl::StatusOr<std::vector<ReceivedChunks>> SplitGrant(ReceivedChunks grant,
                                                       uint64_t each);

// A job's autotune preferences as JSON, the form the Python package and
// the C ABI pass them in: {"pinned_keys": ["expandable_segments"],
// "allow_memory_fraction": false, "mode": "apply"}, every field optional;
// "" is no preference. InvalidArgument naming the field otherwise.
absl::StatusOr<v1::AutotunePreferences> ParseAutotunePreferences(
    absl::string_view json);

class DaemonClient {
 public:
  // Unavailable, naming the socket, when no daemon answers there.
  static absl::StatusOr<std::unique_ptr<DaemonClient>> Connect(
      DaemonClientOptions options);
  // Stops the threads and closes the lease: the daemon ends the session
  // and takes back every chunk of the current epoch.
  ~DaemonClient();

  // At least `bytes` of chunks, none larger than `max_chunk_bytes` (the
  // daemon's chunk sizes up to it, largest first; chunk_bytes() for chunks
  // of the smallest size only, e.g. to unmap any of them on its own later).
  // ResourceExhausted when the node (or a quota) has no more; Unavailable
  // when the daemon stayed away longer than reconnect_wait. With
  // read_ahead_keep, the second call in a row with the same arguments
  // starts asking for the next grants like it in the background
  // (GrantReadAhead). With `client_creates`, the chunks the daemon has not
  // cached come as ReceivedChunks.client_made, for the caller to make
  // (AcquireChunksRequest.client_creates; a daemon before it creates them).
  absl::StatusOr<ReceivedChunks> Acquire(uint64_t bytes,
                                         uint64_t max_chunk_bytes = UINT64_MAX,
                                         bool client_creates = false);
  // Up to `count` grants of `bytes` each (as Acquire's, split), asked for
  // ahead of need (AcquireChunksRequest.read_ahead): only what the daemon
  // gives at once from its cache, or, with `client_creates`, as budget;
  // none when it would wait or create, is away, or refused.
  std::vector<ReceivedChunks> AcquireAhead(uint64_t bytes,
                                           uint64_t max_chunk_bytes,
                                           uint32_t count,
                                           bool client_creates = false);
  // Returns chunks granted in `epoch` to the daemon that owns them now (the
  // one that granted them, or a restarted one that adopted them); chunks no
  // live daemon owns are only forgotten here.
  absl::Status Release(uint64_t epoch, absl::Span<const uint64_t> ids);

  // Sharing chunks with other processes (CUDA IPC). Share: a token under
  // which other sessions of the daemon may open chunks `ids` of `epoch`,
  // which this process holds (FailedPrecondition for an older epoch's that
  // the daemon now did not adopt).
  absl::StatusOr<std::string> Share(uint64_t epoch,
                                    absl::Span<const uint64_t> ids);
  // The chunks another process shared under `share_token`, to map while it
  // keeps them; CloseShare (with the answer's epoch) when done. NotFound
  // when the token is unknown or its owner freed the memory or ended.
  absl::StatusOr<ReceivedChunks> OpenShare(const std::string& share_token);
  // Closes an open of `epoch` (of an older epoch: a no-op, that daemon
  // closed it when the session ended).
  absl::Status CloseShare(uint64_t epoch, const std::string& share_token);
  // Gives the daemon the memory of client-made chunks `ids` of `epoch`, an
  // FD of each in `fds` (the same order; the caller keeps its own), so it
  // can share them (NodePool::GiveMemory). FailedPrecondition for an older
  // epoch's chunks, as Share.
  absl::Status GiveMemory(uint64_t epoch, absl::Span<const uint64_t> ids,
                          absl::Span<const int> fds);

  // Control messages received since the last call, in order.
  std::vector<v1::ControlMessage> TakeControl();
  // ACK (applied) or NACK a pushed config version.
  absl::Status Ack(uint64_t version, bool applied, absl::string_view error);
  absl::Status ReportOom(uint64_t requested_bytes, absl::string_view message,
                         uint64_t config_version);
  // The stats the telemetry thread sends next (PyTorch's names).
  void PublishStats(std::map<std::string, int64_t> stats,
                    uint64_t config_version);
  // Sends the latest published stats now (and waits for them to be sent).
  absl::Status FlushTelemetry();

  // The working set: the segment sizes the process held when its
  // segments' bytes were highest, in the order it asked for them (at most
  // kMaxWorkingSetSegments), sent with the next telemetry. The daemon
  // keeps the last one of a session that ends for the job's next session.
  void PublishWorkingSet(std::vector<uint64_t> segment_bytes);
  // What the daemon handed over when this client registered: the job's
  // last session's working set on this device (empty: none).
  const std::vector<uint64_t>& handed_working_set() const;
  // Bytes the process holds of the working set handed over and has not
  // taken into a segment: reported as read ahead, which a reclaim counts
  // as cached.
  void SetHandedOverBytes(uint64_t bytes);
  // `drop` runs (on the client's thread) when the daemon asks the process
  // to give memory back, before the request is queued for TakeControl; it
  // must not wait for the caller's own locks. OnReclaim(nullptr) returns
  // after a call in progress.
  void OnReclaim(std::function<void()> drop);

  // Where the engine records its malloc/free/free_completed stream; null
  // when event_capacity is 0.
  EventRecorder* events();

  // The config the process runs now (canonical) and the version it came
  // with, after applying a push: declared again when the client registers
  // anew, so a restarted daemon knows it and pushes nothing twice.
  void SetRunning(std::string config, uint64_t version);
  // The version to report the running config under: the one SetRunning
  // gave, or the one a new daemon registered it as after a reconnect.
  uint64_t running_version() const;

  uint64_t session_id() const;
  uint64_t epoch() const;
  bool connected() const;
  // The daemon's smallest chunk: every grant is a multiple of it. This,
  // capacity_bytes() and gpu_uuid() are the last daemon's word while none
  // answers (they are never 0 after Connect).
  uint64_t chunk_bytes() const;
  uint64_t capacity_bytes() const;
  // The device whose pool serves the session, as the daemon named it
  // ("" from a daemon before per-GPU pools).
  std::string gpu_uuid() const;

  struct State;

 private:
  explicit DaemonClient(std::unique_ptr<State> state);
  // Acquire's round trip: waits for a lost daemon and for other sessions
  // to give memory back. `read_ahead` > 0: up to that many grants of
  // `bytes` in one (SplitGrant parts them), asked as GrantReadAhead does,
  // and nullopt where it would wait (the daemon is away, the node is short
  // or would be left less than as much again, its cache holds too little,
  // the daemon grants nothing on the lease).
  absl::StatusOr<std::optional<ReceivedChunks>> AcquireGrant(
      uint64_t bytes, uint64_t max_chunk_bytes, uint32_t read_ahead,
      bool client_creates = false);
  std::unique_ptr<State> state_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_CLIENT_H_
