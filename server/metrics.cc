#include "server/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace allocd {
namespace {

template <typename Builder>
auto& Register(Builder builder, prometheus::Registry& registry,
               const char* name, const char* help) {
  return builder.Name(name).Help(help).Register(registry);
}

int64_t StatOr0(const std::map<std::string, int64_t>& stats,
                const std::string& key) {
  auto it = stats.find(key);
  return it == stats.end() ? 0 : it->second;
}

// Why `address` ("HOST:PORT", "[::1]:PORT") cannot be listened on, found
// by binding it the way an HTTP server does; the exposer itself only says
// "null context when constructing CivetServer".
std::string WhyCannotListen(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "it is not HOST:PORT";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(),
                          &hints, &found);
      e != 0) {
    return absl::StrCat("'", address, "' is not a host and port (", gai_strerror(e), ")");
  }
  std::string why = "the HTTP server did not start";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const int result = bind(fd, a->ai_addr, a->ai_addrlen);
    const int error = errno;
    close(fd);
    if (result == 0) continue;
    if (error == EADDRINUSE) {
      why = absl::StrCat("port ", port, " is already in use (another allocd serve, or another exporter)");
    } else if (error == EADDRNOTAVAIL) {
      why = absl::StrCat(host, " is not an address of this machine");
    } else if (error == EACCES) {
      why = absl::StrCat("port ", port, " needs privileges (ports below 1024)");
    } else {
      why = std::strerror(error);
    }
    break;
  }
  freeaddrinfo(found);
  return why;
}

}  // namespace

struct Metrics::SessionSeries {
  prometheus::Labels labels;
  prometheus::Gauge* reserved;
  prometheus::Gauge* allocated;
  prometheus::Gauge* peak_reserved;
  prometheus::Gauge* inactive_split;
  prometheus::Gauge* fragmentation;
  prometheus::Counter* ooms;
  prometheus::Counter* retries;
  prometheus::Counter* device_allocs;
  prometheus::Gauge* config_version;
  prometheus::Gauge* held;
  // The client's cumulative counts at the last report.
  int64_t retries_seen = 0;
  int64_t device_allocs_seen = 0;
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      reserved_(Register(prometheus::BuildGauge(), *registry_,
                         "allocd_reserved_bytes",
                         "Device memory the session's caching allocator "
                         "reserved (reserved_bytes.all.current).")),
      allocated_(Register(prometheus::BuildGauge(), *registry_,
                          "allocd_allocated_bytes",
                          "Memory in live tensors of the session "
                          "(allocated_bytes.all.current).")),
      peak_reserved_(Register(prometheus::BuildGauge(), *registry_,
                              "allocd_peak_reserved_bytes",
                              "Peak reserved memory of the session "
                              "(reserved_bytes.all.peak).")),
      inactive_split_(Register(prometheus::BuildGauge(), *registry_,
                               "allocd_inactive_split_bytes",
                               "Free bytes inside split segments: "
                               "fragmentation (inactive_split_bytes.all).")),
      fragmentation_(Register(prometheus::BuildGauge(), *registry_,
                              "allocd_fragmentation_ratio",
                              "(reserved - allocated) / reserved of the "
                              "session; 0 when nothing is reserved.")),
      held_(Register(prometheus::BuildGauge(), *registry_,
                     "allocd_session_held_bytes",
                     "Chunks the session holds from the node pool.")),
      ooms_(Register(prometheus::BuildCounter(), *registry_,
                     "allocd_ooms_total",
                     "Out-of-memory errors the session reported.")),
      retries_(Register(prometheus::BuildCounter(), *registry_,
                        "allocd_alloc_retries_total",
                        "Allocations that freed the cache and retried "
                        "(num_alloc_retries).")),
      device_allocs_(Register(prometheus::BuildCounter(), *registry_,
                              "allocd_device_allocs_total",
                              "Segment allocations (num_device_alloc).")),
      config_version_(Register(prometheus::BuildGauge(), *registry_,
                               "allocd_config_version",
                               "Allocator config version the session runs "
                               "(0: its own initial config).")),
      predicted_peak_reserved_(Register(
          prometheus::BuildGauge(), *registry_,
          "allocd_config_predicted_peak_reserved_bytes",
          "Peak reserved bytes allocd tune predicted for the job under its "
          "newest config (set with the config; compare with "
          "allocd_peak_reserved_bytes).")),
      pushes_(Register(prometheus::BuildCounter(), *registry_,
                       "allocd_config_pushes_total",
                       "Config pushes by how they ended: ack, nack, "
                       "rollback.")),
      reclaims_(Register(prometheus::BuildCounter(), *registry_,
                         "allocd_reclaim_requests_total",
                         "Times the daemon asked sessions to release "
                         "cached memory for another session.")),
      autotune_runs_(Register(prometheus::BuildCounter(), *registry_,
                              "allocd_autotune_runs_total",
                              "Autotuner runs (replays of the job's window "
                              "under candidate configs), by job.")),
      autotune_decisions_(Register(
          prometheus::BuildCounter(), *registry_,
          "allocd_autotune_decisions_total",
          "Autotuner decisions by job and result: pushed, recommended, kept, "
          "rolled_back, skipped (a pushed decision that is rolled back "
          "counts once for each).")),
      autotune_predicted_saving_(Register(
          prometheus::BuildGauge(), *registry_,
          "allocd_autotune_predicted_saving_bytes",
          "Peak reserved bytes the autotuner's newest proposal for the job "
          "predicted to save over the rest of its run.")),
      autotune_realized_saving_(Register(
          prometheus::BuildGauge(), *registry_,
          "allocd_autotune_realized_saving_bytes",
          "Peak reserved bytes the job saved after the autotuner's push: "
          "the predicted peak on its old config minus the peak its "
          "sessions reported since.")),
      autotune_start_configs_(Register(
          prometheus::BuildCounter(), *registry_,
          "allocd_autotune_start_configs_total",
          "Sessions in apply mode started on a config the daemon chose "
          "before their first allocation, by source: learned (the job's "
          "learned config), prior (the node's prior, or the seed prior "
          "while no learned configs agree), replaced (a harmful "
          "start config made safe).")),
      reloads_(Register(prometheus::BuildCounter(), *registry_,
                        "allocd_config_reloads_total",
                        "Config file versions applied (at start and on "
                        "change).")),
      reload_errors_(Register(prometheus::BuildCounter(), *registry_,
                              "allocd_config_reload_errors_total",
                              "Config file versions rejected; the last good "
                              "one stayed in force.")),
      pool_bytes_(Register(prometheus::BuildGauge(), *registry_,
                           "allocd_pool_bytes",
                           "Node pool memory by state: capacity, in_use "
                           "(held by sessions), free (cached for reuse).")),
      chunks_(Register(prometheus::BuildCounter(), *registry_,
                       "allocd_pool_chunks_total",
                       "Chunks handed out, by origin: created (new "
                       "memory the daemon made), reused (freed by a "
                       "session) or client_made (granted for the client "
                       "to make; one it could not make is asked for again "
                       "and counted as created too).")),
      trimmed_bytes_(Register(prometheus::BuildCounter(), *registry_,
                              "allocd_pool_trimmed_bytes_total",
                              "Cached chunks given back to the device "
                              "(idle past --trim-after, above "
                              "--cache-high-water, or allocctl pool trim).")),
      adopted_bytes_(Register(prometheus::BuildCounter(), *registry_,
                              "allocd_pool_adopted_bytes_total",
                              "Chunks surviving clients re-declared to this "
                              "daemon after a restart, adopted into the "
                              "pool's accounting.")),
      sessions_(Register(prometheus::BuildGauge(), *registry_,
                         "allocd_sessions", "Live client sessions.")),
      rpc_seconds_(Register(prometheus::BuildHistogram(), *registry_,
                            "allocd_rpc_duration_seconds",
                            "Handling time of the daemon's RPCs.")) {
  sessions_.Add({}).Set(0);
  // Zero series exist from the start, so rate() and alerts see them.
  reclaims_.Add({});
  reloads_.Add({});
  reload_errors_.Add({});
  for (const char* result : {"ack", "nack", "rollback"}) {
    pushes_.Add({{"result", result}});
  }
}

Metrics::~Metrics() = default;

absl::Status Metrics::Serve(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception&) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", WhyCannotListen(address),
        ". Give another --metrics-addr HOST:PORT, or --metrics-addr '' for "
        "no metrics"));
  }
  exposer_->RegisterCollectable(registry_);
  return absl::OkStatus();
}

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::SessionStarted(uint64_t session, absl::string_view job,
                             int device, absl::string_view gpu_uuid,
                             pid_t pid) {
  auto s = std::make_unique<SessionSeries>();
  s->labels = {{"session", absl::StrCat(session)},
               {"job", std::string(job)},
               {"device", absl::StrCat(device)},
               {"gpu_uuid", std::string(gpu_uuid)},
               {"pid", absl::StrCat(pid)}};
  s->reserved = &reserved_.Add(s->labels);
  s->allocated = &allocated_.Add(s->labels);
  s->peak_reserved = &peak_reserved_.Add(s->labels);
  s->inactive_split = &inactive_split_.Add(s->labels);
  s->fragmentation = &fragmentation_.Add(s->labels);
  s->ooms = &ooms_.Add(s->labels);
  s->retries = &retries_.Add(s->labels);
  s->device_allocs = &device_allocs_.Add(s->labels);
  s->config_version = &config_version_.Add(s->labels);
  s->held = &held_.Add(s->labels);
  absl::MutexLock lock(&mu_);
  series_[session] = std::move(s);
  sessions_.Add({}).Set(static_cast<double>(series_.size()));
}

void Metrics::SessionEnded(uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(session);
  if (it == series_.end()) return;
  SessionSeries& s = *it->second;
  reserved_.Remove(s.reserved);
  allocated_.Remove(s.allocated);
  peak_reserved_.Remove(s.peak_reserved);
  inactive_split_.Remove(s.inactive_split);
  fragmentation_.Remove(s.fragmentation);
  ooms_.Remove(s.ooms);
  retries_.Remove(s.retries);
  device_allocs_.Remove(s.device_allocs);
  config_version_.Remove(s.config_version);
  held_.Remove(s.held);
  series_.erase(it);
  sessions_.Add({}).Set(static_cast<double>(series_.size()));
}

void Metrics::Telemetry(uint64_t session,
                        const std::map<std::string, int64_t>& stats,
                        uint64_t config_version) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(session);
  if (it == series_.end()) return;
  SessionSeries& s = *it->second;
  const int64_t reserved = StatOr0(stats, "reserved_bytes.all.current");
  const int64_t allocated = StatOr0(stats, "allocated_bytes.all.current");
  s.reserved->Set(static_cast<double>(reserved));
  s.allocated->Set(static_cast<double>(allocated));
  s.peak_reserved->Set(
      static_cast<double>(StatOr0(stats, "reserved_bytes.all.peak")));
  s.inactive_split->Set(
      static_cast<double>(StatOr0(stats, "inactive_split_bytes.all.current")));
  s.fragmentation->Set(
      reserved > 0 ? static_cast<double>(reserved - allocated) / reserved : 0);
  // The client's counts are cumulative; a counter only moves up, so add
  // what is new (a client that reset its stats restarts from its value).
  auto advance = [](prometheus::Counter* counter, int64_t& seen,
                    int64_t now) {
    if (now > seen) counter->Increment(static_cast<double>(now - seen));
    seen = now;
  };
  advance(s.retries, s.retries_seen, StatOr0(stats, "num_alloc_retries"));
  advance(s.device_allocs, s.device_allocs_seen,
          StatOr0(stats, "num_device_alloc"));
  s.config_version->Set(static_cast<double>(config_version));
}

void Metrics::Oom(uint64_t session) {
  absl::MutexLock lock(&mu_);
  if (auto it = series_.find(session); it != series_.end()) {
    it->second->ooms->Increment();
  }
}

void Metrics::Held(uint64_t session, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (auto it = series_.find(session); it != series_.end()) {
    it->second->held->Set(static_cast<double>(bytes));
  }
}

void Metrics::ConfigPushResult(absl::string_view result) {
  pushes_.Add({{"result", std::string(result)}}).Increment();
}

void Metrics::ConfigPushed(uint64_t session, uint64_t version) {
  absl::MutexLock lock(&mu_);
  if (auto it = series_.find(session); it != series_.end()) {
    it->second->config_version->Set(static_cast<double>(version));
  }
}

void Metrics::ConfigPrediction(absl::string_view job,
                               uint64_t predicted_bytes) {
  const prometheus::Labels labels{{"job", std::string(job)}};
  absl::MutexLock lock(&mu_);  // Has-then-Remove must not interleave with Add
  if (predicted_bytes > 0) {
    predicted_peak_reserved_.Add(labels).Set(
        static_cast<double>(predicted_bytes));
  } else if (predicted_peak_reserved_.Has(labels)) {
    predicted_peak_reserved_.Remove(&predicted_peak_reserved_.Add(labels));
  }
}

void Metrics::ReclaimRequested() { reclaims_.Add({}).Increment(); }

void Metrics::AutotuneRun(absl::string_view job) {
  autotune_runs_.Add({{"job", std::string(job)}}).Increment();
  // Every result's series exists from the job's first run, at 0, so that
  // increase() sees a job's first rollback (a series born at 1 shows none).
  for (const NamedValue<AutotuneResult>& result : kAutotuneResults) {
    autotune_decisions_.Add({{"job", std::string(job)}, {"result", result.name}});
  }
  // Nothing predicted or saved until a decision says otherwise.
  autotune_predicted_saving_.Add({{"job", std::string(job)}});
  autotune_realized_saving_.Add({{"job", std::string(job)}});
}

void Metrics::AutotuneDecision(absl::string_view job, AutotuneResult result) {
  autotune_decisions_
      .Add({{"job", std::string(job)}, {"result", AutotuneResultName(result)}})
      .Increment();
}

void Metrics::AutotunePredictedSaving(absl::string_view job, int64_t bytes) {
  autotune_predicted_saving_.Add({{"job", std::string(job)}})
      .Set(static_cast<double>(bytes));
}

void Metrics::AutotuneStartConfig(absl::string_view source) {
  autotune_start_configs_.Add({{"source", std::string(source)}}).Increment();
}

void Metrics::AutotuneRealizedSaving(absl::string_view job, int64_t bytes) {
  autotune_realized_saving_.Add({{"job", std::string(job)}})
      .Set(static_cast<double>(bytes));
}

void Metrics::ConfigReload(bool ok) {
  (ok ? reloads_ : reload_errors_).Add({}).Increment();
}

void Metrics::Pool(int device, absl::string_view gpu_uuid,
                   const PoolGauges& pool) {
  const std::string index = absl::StrCat(device);
  const std::string uuid(gpu_uuid);
  auto labels = [&](const char* key, const char* value) {
    return prometheus::Labels{
        {key, value}, {"device", index}, {"gpu_uuid", uuid}};
  };
  pool_bytes_.Add(labels("state", "capacity"))
      .Set(static_cast<double>(pool.capacity));
  pool_bytes_.Add(labels("state", "in_use"))
      .Set(static_cast<double>(pool.in_use));
  pool_bytes_.Add(labels("state", "free")).Set(static_cast<double>(pool.free));
  // The pool's totals are monotonic; the counters follow them.
  auto follow = [](prometheus::Counter& counter, uint64_t total,
                   uint64_t& seen) {
    if (total > seen) counter.Increment(static_cast<double>(total - seen));
    seen = std::max(seen, total);
  };
  absl::MutexLock lock(&mu_);
  PoolTotalsSeen& seen = pool_seen_[device];
  follow(chunks_.Add(labels("origin", "created")), pool.chunks_created_total,
         seen.chunks_created);
  follow(chunks_.Add(labels("origin", "reused")), pool.chunks_reused_total,
         seen.chunks_reused);
  follow(chunks_.Add(labels("origin", "client_made")),
         pool.chunks_client_made_total, seen.chunks_client_made);
  follow(trimmed_bytes_.Add({{"device", index}, {"gpu_uuid", uuid}}),
         pool.trimmed_bytes_total, seen.trimmed_bytes);
  follow(adopted_bytes_.Add({{"device", index}, {"gpu_uuid", uuid}}),
         pool.adopted_bytes_total, seen.adopted_bytes);
}

void Metrics::Rpc(absl::string_view method, double seconds, bool ok) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
      5e-3,  10e-3, 25e-3,  50e-3,  0.1,    0.25, 1};
  rpc_seconds_
      .Add({{"method", std::string(method)}, {"code", ok ? "OK" : "error"}},
           kBuckets)
      .Observe(seconds);
}

std::string Metrics::Render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace allocd
