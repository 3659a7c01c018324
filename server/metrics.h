// Metrics: the daemon's Prometheus series (prometheus-cpp), named by
// Prometheus' conventions (base units, _total for counters, _bytes,
// _seconds). Per-session series carry {session, job, device, gpu_uuid, pid}
// and are removed when the session ends, so a busy node's /metrics stays
// bounded. Pool series carry {device, gpu_uuid}: one pool per GPU. `device`
// is the GPU's index on the node (the daemon's, not the client's
// CUDA_VISIBLE_DEVICES ordinal); gpu_uuid names it for good.
//
// Thread-safe (prometheus-cpp metrics are atomic; the session index has
// its own mutex).
#ifndef ALLOCD_SERVER_METRICS_H_
#define ALLOCD_SERVER_METRICS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/autotune/autotune_types.h"

namespace allocd {

struct PoolGauges {
  uint64_t capacity = 0;
  uint64_t in_use = 0;
  uint64_t free = 0;
  uint64_t chunks_created_total = 0;
  uint64_t chunks_reused_total = 0;
  uint64_t chunks_client_made_total = 0;
  uint64_t trimmed_bytes_total = 0;
  uint64_t adopted_bytes_total = 0;
};

class Metrics {
 public:
  Metrics();
  ~Metrics();

  // Serves /metrics on `address` ("127.0.0.1:9464", "0.0.0.0:0" for any
  // free port). Unavailable with the reason when it cannot bind.
  absl::Status Serve(const std::string& address);
  // The port Serve bound (0 before).
  int port() const;

  // `device`, `gpu_uuid`: the node's device whose pool serves it.
  void SessionStarted(uint64_t session, absl::string_view job, int device,
                      absl::string_view gpu_uuid, pid_t pid);
  void SessionEnded(uint64_t session);
  // A telemetry report: torch.cuda.memory_stats() under PyTorch's names.
  void Telemetry(uint64_t session, const std::map<std::string, int64_t>& stats,
                 uint64_t config_version);
  void Oom(uint64_t session);
  // Chunks the session holds from the node pool.
  void Held(uint64_t session, uint64_t bytes);
  // result: "ack", "nack", "rollback".
  void ConfigPushResult(absl::string_view result);
  void ConfigPushed(uint64_t session, uint64_t version);
  // allocd tune's predicted peak reserved bytes for `job`'s newest config
  // (the empty job: the default); 0 removes the series.
  void ConfigPrediction(absl::string_view job, uint64_t predicted_bytes);
  void ReclaimRequested();
  // The autotuner: a run for `job` started (its series exist from then on,
  // at 0); one of its decisions reached `result` (labelled by its name in
  // kAutotuneResults);
  // the saving it predicted for the job's newest proposal, and the saving
  // realised after a push (peak reserved bytes).
  void AutotuneRun(absl::string_view job);
  void AutotuneDecision(absl::string_view job, AutotuneResult result);
  void AutotunePredictedSaving(absl::string_view job, int64_t bytes);
  void AutotuneRealizedSaving(absl::string_view job, int64_t bytes);
  // A session of a job in apply mode started on a config the daemon chose
  // before its first allocation: `source` "learned", "prior" or "replaced"
  // (StartConfigSourceName).
  void AutotuneStartConfig(absl::string_view source);
  // The config file was read again: applied, or rejected (last good kept).
  void ConfigReload(bool ok);
  // Device `device`'s pool (its series exist from the first call).
  void Pool(int device, absl::string_view gpu_uuid, const PoolGauges& pool);
  void Rpc(absl::string_view method, double seconds, bool ok);

  // The exposition text, as a scrape would get it.
  std::string Render() const;

 private:
  struct SessionSeries;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  prometheus::Family<prometheus::Gauge>& reserved_;
  prometheus::Family<prometheus::Gauge>& allocated_;
  prometheus::Family<prometheus::Gauge>& peak_reserved_;
  prometheus::Family<prometheus::Gauge>& inactive_split_;
  prometheus::Family<prometheus::Gauge>& fragmentation_;
  prometheus::Family<prometheus::Gauge>& held_;
  prometheus::Family<prometheus::Counter>& ooms_;
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Family<prometheus::Counter>& device_allocs_;
  prometheus::Family<prometheus::Gauge>& config_version_;
  prometheus::Family<prometheus::Gauge>& predicted_peak_reserved_;
  prometheus::Family<prometheus::Counter>& pushes_;
  prometheus::Family<prometheus::Counter>& reclaims_;
  prometheus::Family<prometheus::Counter>& autotune_runs_;
  prometheus::Family<prometheus::Counter>& autotune_decisions_;
  prometheus::Family<prometheus::Gauge>& autotune_predicted_saving_;
  prometheus::Family<prometheus::Gauge>& autotune_realized_saving_;
  prometheus::Family<prometheus::Counter>& autotune_start_configs_;
  prometheus::Family<prometheus::Counter>& reloads_;
  prometheus::Family<prometheus::Counter>& reload_errors_;
  prometheus::Family<prometheus::Gauge>& pool_bytes_;
  prometheus::Family<prometheus::Counter>& chunks_;
  prometheus::Family<prometheus::Counter>& trimmed_bytes_;
  prometheus::Family<prometheus::Counter>& adopted_bytes_;
  prometheus::Family<prometheus::Gauge>& sessions_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<SessionSeries>> series_
      ABSL_GUARDED_BY(mu_);
  // Last cumulative counts seen per device pool, to turn them into
  // increments.
  struct PoolTotalsSeen {
    uint64_t chunks_created = 0;
    uint64_t chunks_reused = 0;
    uint64_t chunks_client_made = 0;
    uint64_t trimmed_bytes = 0;
    uint64_t adopted_bytes = 0;
  };
  absl::flat_hash_map<int, PoolTotalsSeen> pool_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_METRICS_H_
