// TelemetryStream: what the process tells the daemon between its calls,
// sent by a background thread on the current connection's telemetry stream
// every telemetry_period (at once when flushed, sooner when the event
// recorder fills up):
// - the latest stats the process published (PyTorch's names), with the
//   bytes it holds read ahead as one stat of allocd's own (kReadAheadStat);
// - in packed batches, the allocator events the engine recorded (events())
//   for the daemon's autotuner; while the daemon is away they stay in the
//   recorder, up to its capacity;
// - the working set, with the next stats;
// - what the process started doing with its CUDA memory (features), with
//   the next stats.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_TELEMETRY_STREAM_H_
#define ALLOCD_CLIENT_TELEMETRY_STREAM_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "allocd.pb.h"
#include "client/daemon_client_options.h"
#include "client/daemon_connection.h"
#include "client/event_recorder.h"
#include "grpcpp/grpcpp.h"

namespace allocd {

class TelemetryStream {
 public:
  // Starts the thread, which streams on `active`'s current connection.
  // Both outlive the stream.
  TelemetryStream(const DaemonClientOptions& options,
                  const ActiveConnection& active);
  // Stop()s.
  ~TelemetryStream();
  TelemetryStream(const TelemetryStream&) = delete;
  TelemetryStream& operator=(const TelemetryStream&) = delete;

  // Ends the stream and waits for the thread; what is not sent yet is not.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The stats the thread sends next (PyTorch's names).
  void PublishStats(std::map<std::string, int64_t> stats,
                    uint64_t config_version) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends the latest published stats now (and waits for them to be sent);
  // DeadlineExceeded after `timeout` (rpc_timeout when infinite).
  absl::Status Flush(absl::Duration timeout = absl::InfiniteDuration())
      ABSL_LOCKS_EXCLUDED(mu_);

  // The working set: the segment sizes the process held when its
  // segments' bytes were highest, in the order it asked for them (at most
  // kMaxWorkingSetSegments), sent with the next stats.
  void PublishWorkingSet(std::vector<uint64_t> segment_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Features the process uses now (v1::JobFeatures; they only turn on):
  // the ones it did not use yet are sent with the next stats, at once.
  void PublishFeatures(const v1::JobFeatures& features) ABSL_LOCKS_EXCLUDED(mu_);
  // A daemon registered the session anew: it knows nothing of the working
  // set or of the features published since the start yet, so they go again
  // with the next stats.
  void NewSession() ABSL_LOCKS_EXCLUDED(mu_);

  // Memory the process holds mapped or granted that no allocation uses, by
  // what holds it: the read-ahead, the working set handed over and not
  // taken, the spare segments (SpareSegments).
  enum class Unused { kReadAhead, kHandedOver, kSpare, kCount };
  // What `holder` holds now: sent at once, summed with the others' as one
  // stat (kReadAheadStat), which a reclaim counts as cached.
  void SetUnusedBytes(Unused holder, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Where the engine records its malloc/free/free_completed stream; null
  // when options.event_capacity is 0.
  EventRecorder* events() { return recorder_.get(); }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `stats` (when not null) and `batches` on the stream, for `c`'s
  // session; false when it broke (unsent batches go back to the recorder as
  // a gap).
  bool Send(grpc::ClientWriter<v1::TelemetryReport>& writer,
            const Connection& c, v1::TelemetryReport* stats,
            std::vector<RecordedBatch>& batches);
  void PublishAheadBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What every holder of SetUnusedBytes holds.
  int64_t UnusedTotal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Into the stats to send, as one stat (kReadAheadStat).
  void WriteAheadBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DaemonClientOptions& options_;
  const ActiveConnection& active_;
  // Whether the client reads grants ahead (options.read_ahead_keep): its
  // stat goes with every stats then.
  const bool reads_ahead_;
  std::unique_ptr<EventRecorder> recorder_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  v1::TelemetryReport stats_ ABSL_GUARDED_BY(mu_);
  uint64_t stats_published_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stats_sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool flush_ ABSL_GUARDED_BY(mu_) = false;
  // The recorder is half full: send before the period ends.
  bool events_waiting_ ABSL_GUARDED_BY(mu_) = false;
  // SetUnusedBytes's, by holder.
  std::array<int64_t, static_cast<size_t>(Unused::kCount)> unused_bytes_
      ABSL_GUARDED_BY(mu_) = {};
  // The last PublishWorkingSet, and whether the daemon has it yet (it goes
  // with the next stats).
  v1::WorkingSet working_set_ ABSL_GUARDED_BY(mu_);
  bool working_set_unsent_ ABSL_GUARDED_BY(mu_) = false;
  // Every feature published, and whether the daemon has them yet.
  v1::JobFeatures features_ ABSL_GUARDED_BY(mu_);
  bool features_unsent_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_TELEMETRY_STREAM_H_
