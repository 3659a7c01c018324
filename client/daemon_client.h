// DaemonClient: a process's connection to the node daemon (`allocd serve`),
// composed of the client's parts, each with its own header and lock:
// - the connection (daemon_connection.h): Connect() registers a session and
//   opens its lease, the side-socket connection whose life is the
//   session's;
// - chunks and grants (chunk_grants.h, held_chunks.h): Acquire/Release get
//   and return chunks, whose FDs arrive over the lease with SCM_RIGHTS;
//   grants can be read ahead (GrantReadAhead), chunks returned off the
//   freeing thread (ChunkReleaser) and shared;
// - the control stream (control_stream.h): a background thread watches the
//   daemon's config pushes and reclaim requests and queues what arrives for
//   the engine's thread to handle at a safe point (TakeControl), since the
//   engine is not thread-safe;
// - the telemetry stream (telemetry_stream.h): a background thread streams
//   the latest stats (PublishStats), and with them, in packed batches, the
//   allocator events the engine recorded (events()) for the daemon's
//   autotuner, and the working set;
// - reconnecting (reconnector.h): when the daemon goes away, the session
//   thread reconnects with exponential backoff and registers a new session
//   (the epoch goes up), and before the new session serves any call it
//   re-declares every chunk the process holds (HeldChunks says what is
//   proven and what a refused chunk's Release does) and the config the
//   process runs (SetRunning), so a restarted daemon counts the chunks,
//   promises their memory to nobody else, and pushes nothing twice.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_DAEMON_CLIENT_H_
#define ALLOCD_CLIENT_DAEMON_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocd.pb.h"
#include "client/chunk_grants.h"
#include "client/control_stream.h"
#include "client/daemon_client_options.h"
#include "client/daemon_connection.h"
#include "client/event_recorder.h"
#include "client/held_chunks.h"
#include "client/map_path_counters.h"
#include "client/received_chunks.h"
#include "client/reconnector.h"
#include "client/telemetry_stream.h"

namespace allocd {

class DaemonClient {
 public:
  // Unavailable, naming the socket, when no daemon answers there.
  static absl::StatusOr<std::unique_ptr<DaemonClient>> Connect(
      DaemonClientOptions options);
  // Stops the threads and closes the lease: the daemon ends the session
  // and takes back every chunk of the current epoch.
  ~DaemonClient();
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  // Chunks and grants: ChunkGrants says what each does.
  absl::StatusOr<ReceivedChunks> Acquire(uint64_t bytes,
                                         uint64_t max_chunk_bytes = UINT64_MAX,
                                         bool client_creates = false) {
    return grants_.Acquire(bytes, max_chunk_bytes, client_creates);
  }
  std::vector<ReceivedChunks> AcquireAhead(uint64_t bytes,
                                           uint64_t max_chunk_bytes,
                                           uint32_t count,
                                           bool client_creates = false) {
    return grants_.AcquireAhead(bytes, max_chunk_bytes, count, client_creates);
  }
  absl::Status Prewarm(uint64_t bytes, uint64_t max_chunk_bytes,
                       bool client_creates) {
    return grants_.Prewarm(bytes, max_chunk_bytes, client_creates);
  }
  std::optional<ReceivedChunks> TakeParked(uint64_t bytes,
                                           uint64_t max_chunk_bytes,
                                           bool client_creates) {
    return grants_.TakeParked(bytes, max_chunk_bytes, client_creates);
  }
  absl::Status Release(uint64_t epoch, absl::Span<const uint64_t> ids) {
    return grants_.Release(epoch, ids);
  }
  void ReleaseSoon(uint64_t epoch, absl::Span<const uint64_t> ids) {
    grants_.ReleaseSoon(epoch, ids);
  }
  bool FlushReleases() { return grants_.FlushReleases(); }
  uint64_t background_release_calls() const {
    return grants_.background_release_calls();
  }
  uint64_t own_acquires() const { return grants_.own_acquires(); }
  absl::StatusOr<std::string> Share(uint64_t epoch,
                                    absl::Span<const uint64_t> ids) {
    return grants_.Share(epoch, ids);
  }
  absl::StatusOr<ReceivedChunks> OpenShare(const std::string& share_token) {
    return grants_.OpenShare(share_token);
  }
  absl::Status CloseShare(uint64_t epoch, const std::string& share_token) {
    return grants_.CloseShare(epoch, share_token);
  }
  absl::Status GiveMemory(uint64_t epoch, absl::Span<const uint64_t> ids,
                          absl::Span<const int> fds, absl::Duration timeout) {
    return grants_.GiveMemory(epoch, ids, fds, timeout);
  }

  // The control stream: ControlStream says what each does.
  std::vector<v1::ControlMessage> TakeControl() { return control_.Take(); }
  bool AwaitControl(absl::Duration timeout) { return control_.AwaitMessage(timeout); }
  void StopAwaitingControl() { control_.StopWaiting(); }
  absl::Status Ack(uint64_t version, bool applied, absl::string_view error) {
    return control_.Ack(version, applied, error);
  }
  absl::Status ReportOom(uint64_t requested_bytes, absl::string_view message,
                         uint64_t config_version) {
    return control_.ReportOom(requested_bytes, message, config_version);
  }
  void OnReclaim(std::function<uint64_t(uint64_t bytes)> drop) {
    control_.OnReclaim(std::move(drop));
  }
  int64_t reclaims() const { return control_.reclaims(); }
  // ControlStream::stream_demands.
  ControlStream::StreamDemands stream_demands() const { return control_.stream_demands(); }
  // Whether the daemon asked the process to give memory back within
  // `window`: another session on the GPU is short.
  bool ReclaimAskedWithin(absl::Duration window) const {
    return absl::Now() - control_.last_reclaim() <= window;
  }

  // The telemetry stream: TelemetryStream says what each does.
  void PublishStats(std::map<std::string, int64_t> stats,
                    uint64_t config_version) {
    telemetry_.PublishStats(std::move(stats), config_version);
  }
  // TelemetryStream::Flush.
  absl::Status FlushTelemetry(absl::Duration timeout = absl::InfiniteDuration()) {
    return telemetry_.Flush(timeout);
  }
  // The working set, sent with the next telemetry. The daemon keeps the
  // last one of a session that ends for the job's next session.
  void PublishWorkingSet(std::vector<uint64_t> segment_bytes) {
    telemetry_.PublishWorkingSet(std::move(segment_bytes));
  }
  // What the process started doing with its CUDA memory (only ever more):
  // sent with the next telemetry, at once (TelemetryStream::PublishFeatures).
  void PublishFeatures(const v1::JobFeatures& features) {
    telemetry_.PublishFeatures(features);
  }
  // Bytes the process holds that no allocation uses (the working set
  // handed over and not taken, spare segments), by holder: reported as read
  // ahead, which a reclaim counts as cached.
  void SetUnusedBytes(TelemetryStream::Unused holder, uint64_t bytes) {
    telemetry_.SetUnusedBytes(holder, bytes);
  }
  EventRecorder* events() { return telemetry_.events(); }

  // What the daemon handed over when this client registered: the job's
  // last session's working set on this device (empty: none).
  const std::vector<uint64_t>& handed_working_set() const {
    return handed_working_set_;
  }

  // The config the process runs: Reconnector says what each does.
  void SetRunning(std::string config, uint64_t version) {
    reconnector_.SetRunning(std::move(config), version);
  }
  uint64_t running_version() const { return reconnector_.running_version(); }

  const DaemonClientOptions& options() const { return options_; }
  uint64_t session_id() const;
  // Where the config the session started on came from (the first
  // registration's RegisterResponse.start_config_source; "own" before it).
  std::string start_config_source() const;
  // The connection's RegisterResponse.stream_from_reserved (0 before it).
  uint64_t stream_from_reserved() const;
  uint64_t epoch() const { return active_.epoch(); }
  bool connected() const { return active_.Current() != nullptr; }
  // The daemon's smallest chunk: every grant is a multiple of it. This,
  // capacity_bytes() and gpu_uuid() are the last daemon's word while none
  // answers (they are never 0 after Connect).
  uint64_t chunk_bytes() const { return active_.terms().chunk_bytes; }
  uint64_t capacity_bytes() const { return active_.terms().capacity; }
  // The device whose pool serves the session, as the daemon named it
  // ("" from a daemon before per-GPU pools).
  std::string gpu_uuid() const { return active_.terms().gpu_uuid; }

  // Where the time of mapping this session's chunks goes (the backends
  // that map them count it).
  MapPathCounters& map_path() { return map_path_; }
  const MapPathCounters& map_path() const { return map_path_; }

 private:
  DaemonClient(DaemonClientOptions options, std::shared_ptr<Connection> first);

  // In the order the parts need each other: each is made after, and
  // destroyed before, the ones it uses.
  const DaemonClientOptions options_;
  const std::vector<uint64_t> handed_working_set_;
  MapPathCounters map_path_;
  ActiveConnection active_;
  HeldChunks held_;
  TelemetryStream telemetry_;
  ControlStream control_;
  ChunkGrants grants_;
  Reconnector reconnector_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_CLIENT_H_
