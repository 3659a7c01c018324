#include "tools/allocd/client_replay_command.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/config_check.h"
#include "allocator/stats.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/replay_observer.h"
#include "client/allocator_target.h"
#include "client/client_env.h"
#include "client/daemon_backend.h"
#include "client/daemon_client.h"
#include "client/live_session.h"
#include "nlohmann/json.hpp"
#include "tools/allocd/common.h"

namespace allocd {
namespace {

// Control messages and telemetry are handled every this many events: often
// enough that a push lands within milliseconds, rarely enough to cost
// nothing next to the replay.
constexpr uint64_t kSafePointEvents = 512;

// Set by SIGINT and SIGTERM: the replay stops at its next safe point and
// reports what ran, as when its time is up (a job stopped by hand, or by a
// test once it has seen what it waited for, whatever the machine's speed).
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free,
              "set from a signal handler");

// Routes SIGINT and SIGTERM to `stop_requested` while alive; restores the
// handlers it found.
class StopOnSignals {
 public:
  StopOnSignals() {
    stop_requested.store(false);
    struct sigaction request = {};
    request.sa_handler = [](int) { stop_requested.store(true); };
    sigemptyset(&request.sa_mask);
    request.sa_flags = SA_RESTART;  // the client's blocking calls go on
    sigaction(SIGINT, &request, &old_int_);
    sigaction(SIGTERM, &request, &old_term_);
  }
  ~StopOnSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};

// Holds each event back until its time in the recorded run, divided by the
// speed, has come: the daemon sees the job's own event rate, so its client
// has the time a real process has to send what it records.
class Pacer {
 public:
  using Clock = std::chrono::steady_clock;

  // `times_us`: the trace's event times (empty, or `speed` 0: no pacing).
  Pacer(const std::vector<int64_t>& times_us, double speed)
      : times_us_(speed > 0 ? times_us : std::vector<int64_t>{}),
        speed_(speed) {}

  // A replay of the trace starts now: its first event is due at once.
  void StartLoop() { loop_start_ = Clock::now(); }

  // When event `index` is due; nullopt when nothing paces.
  std::optional<Clock::time_point> Due(uint64_t index) const {
    if (times_us_.empty()) return std::nullopt;
    const double since_first_us =
        static_cast<double>(times_us_[index] - times_us_.front()) / speed_;
    return loop_start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double, std::micro>(
                                 std::max(since_first_us, 0.0)));
  }

 private:
  const std::vector<int64_t> times_us_;
  const double speed_;
  Clock::time_point loop_start_ = Clock::now();
};

// Drives a LiveSession between trace events, records the events that ran
// for the daemon's autotuner, and stops the replay when its time is up or a
// stop was requested.
class LiveReplay final : public ReplayObserver {
 public:
  using Clock = std::chrono::steady_clock;

  // Replays end at the first safe point once Stopped(). `events`: where to
  // record (null: not recorded).
  LiveReplay(LiveSession& session, const Trace& trace, EventRecorder* events,
             Clock::time_point stop_at, Pacer& pacer)
      : session_(session),
        trace_(trace),
        events_(events),
        live_(trace.num_ids),
        stop_at_(stop_at),
        pacer_(pacer) {}

  // The next replay is a new lifetime of the traced process: its ids are
  // new to the daemon.
  void NextLoop() {
    id_base_ += trace_.num_ids;
    pacer_.StartLoop();
  }

  // Past `stop_at`, or a stop was requested.
  bool Stopped() const {
    return Clock::now() >= stop_at_ || stop_requested.load();
  }

  void OnEvent(uint64_t, const TraceEvent&) override {}
  void OnDeviceCall(DeviceCall, uint64_t, uint64_t) override {}
  void OnCacheFlush() override {}

  void OnBlock(const TraceEvent& event, const Allocation& a) override {
    // The memory is real: write into every new block.
    if (event.op == TraceOp::kAlloc && a.size > 0) {
      *reinterpret_cast<volatile char*>(a.address) = 1;
    }
    if (events_ == nullptr) return;
    if (event.op == TraceOp::kAlloc) live_[event.id] = event;
    if (event.op == TraceOp::kFreeCompleted) live_[event.id].reset();
    events_->Record(event.op, trace_.streams[event.stream],
                    id_base_ + event.id, event.size);
  }

  void OnOutOfMemory(const TraceEvent& event, uint64_t device_free) override {
    oom_since_safe_point_ = true;
    session_.ReportOom(
        event.size,
        absl::StrCat("CUDA out of memory. Tried to allocate ",
                     FormatSize(event.size), " (", FormatSize(device_free),
                     " free on the node pool)"));
  }

  bool AfterEvent(uint64_t index, CachingAllocator& allocator) override {
    if (index + 1 < trace_.events.size()) {
      if (!WaitUntil(pacer_.Due(index + 1), allocator)) return false;
    }
    // An OOM took round trips to the daemon already: under memory pressure
    // events are slow, and pushes and reclaims must not wait 512 of them.
    if (index % kSafePointEvents != 0 && !oom_since_safe_point_) return true;
    oom_since_safe_point_ = false;
    EngineTarget target(allocator);
    session_.Poll(target);
    return !Stopped();
  }

  void OnEnd(const CachingAllocator& allocator) override {
    session_.Publish(MemoryStatsDict(allocator.Stats()));
    if (events_ == nullptr) return;
    // The process's lifetime ends: what it still held is freed, so the
    // daemon's window holds no allocation that lives forever.
    for (std::optional<TraceEvent>& alloc : live_) {
      if (!alloc.has_value()) continue;
      for (TraceOp op : {TraceOp::kFreeRequested, TraceOp::kFreeCompleted}) {
        events_->Record(op, trace_.streams[alloc->stream], id_base_ + alloc->id,
                        alloc->size);
      }
      alloc.reset();
    }
  }

 private:
  // Sleeps until `due` (nullopt: returns at once), answering the daemon
  // between naps as a job idle between steps does; false when the replay
  // was stopped meanwhile.
  bool WaitUntil(std::optional<Clock::time_point> due,
                 CachingAllocator& allocator) {
    constexpr auto kNap = std::chrono::milliseconds(50);
    while (due.has_value() && Clock::now() < *due) {
      if (Stopped()) return false;
      std::this_thread::sleep_until(std::min({*due, Clock::now() + kNap,
                                              stop_at_}));
      if (Clock::now() < *due) {
        EngineTarget target(allocator);
        session_.Poll(target);
      }
    }
    return true;
  }

  LiveSession& session_;
  const Trace& trace_;
  EventRecorder* const events_;
  // By id: this loop's allocations not yet free_completed.
  std::vector<std::optional<TraceEvent>> live_;
  uint64_t id_base_ = 0;
  const Clock::time_point stop_at_;
  Pacer& pacer_;
  bool oom_since_safe_point_ = false;
};

}  // namespace

int RunClientReplay(const ClientReplayCommandOptions& o, std::ostream& out,
                    std::ostream& err) {
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(o.config);
  if (!config.ok()) {
    err << "allocd client-replay: --config: "
        << ConfigRejection(o.config, config.status()) << "\n";
    return 1;
  }
  if (config->backend == AllocatorBackend::kCudaMallocAsync) {
    err << "allocd client-replay: backend:cudaMallocAsync is the CUDA "
           "driver's pool; the daemon serves the native allocator only\n";
    return 1;
  }
  absl::StatusOr<Trace> trace = LoadTrace(o.trace_path, o.device);
  if (!trace.ok()) {
    err << "allocd client-replay: " << trace.status().message() << "\n";
    return 1;
  }
  if (o.speed > 0 && trace->event_times_us.empty()) {
    err << "allocd client-replay: --speed: " << o.trace_path
        << " does not give every event a time_us to pace by; replay it "
           "without --speed (as fast as it can)\n";
    return 1;
  }
  v1::AutotunePreferences preferences;
  for (const std::string& key : o.pinned_keys) preferences.add_pinned_keys(key);
  preferences.set_mode(o.autotune_mode);
  // A replay of one rank of a job of several says so as the job's own
  // process would: torchrun's environment (ClientEnv).
  absl::StatusOr<ClientEnv> env = ClientEnv::FromEnvironment();
  if (!env.ok()) {
    err << "allocd client-replay: " << env.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<DaemonClient>> client = DaemonClient::Connect(
      {.socket = o.socket,
       .job = o.job,
       .gpu_uuid = o.gpu_uuid,
       .initial_config = FormatAllocatorConfig(*config),
       .description = "allocd client-replay",
       .autotune = preferences,
       .rank = RankOf(*env)});
  if (!client.ok()) {
    err << "allocd client-replay: " << client.status().message() << "\n";
    return 1;
  }
  DaemonBackend backend(client->get());
  const auto start = LiveReplay::Clock::now();
  const auto stop_at =
      o.duration_seconds > 0
          ? start + std::chrono::duration_cast<LiveReplay::Clock::duration>(
                        std::chrono::duration<double>(o.duration_seconds))
          : LiveReplay::Clock::time_point::max();
  LiveSession session(**client, *config);
  Pacer pacer(trace->event_times_us, o.speed);
  LiveReplay observer(session, *trace, (*client)->events(), stop_at, pacer);
  const StopOnSignals stop_on_signals;
  const uint64_t first_session = (*client)->session_id();
  auto elapsed = [&] {
    return std::chrono::duration<double>(LiveReplay::Clock::now() - start)
        .count();
  };
  int loops = 0;
  uint64_t events = 0;
  int64_t peak_reserved = 0;
  // Each whole loop: the config versions it started and ended on (a push
  // can land mid-loop) and its peak reserved, so a report shows what a push
  // did to the loops after it.
  nlohmann::json loop_peaks = nlohmann::json::array();
  int64_t device_allocs = 0;
  for (;;) {
    // Each loop is a fresh process lifetime of the traced job: a new
    // allocator on the same session, under the config it runs now.
    const uint64_t started_on = session.config_version();
    absl::StatusOr<ReplayResult> r = Replay(
        *trace, session.config(),
        {.observer = &observer, .device = &backend});
    if (!r.ok()) {
      err << "allocd client-replay: " << r.status().message() << "\n";
      return 1;
    }
    events += r->events;
    peak_reserved = std::max(peak_reserved, r->peak_reserved);
    device_allocs += r->num_device_alloc;
    if (r->events < trace->events.size()) break;  // time is up mid-trace
    loop_peaks.push_back({{"started_config_version", started_on},
                          {"config_version", session.config_version()},
                          {"config", FormatAllocatorConfig(session.config())},
                          {"peak_reserved", r->peak_reserved}});
    ++loops;
    observer.NextLoop();
    const bool more =
        !observer.Stopped() && (o.duration_seconds > 0 || loops < o.loops);
    if (!more) break;
  }
  (void)(*client)->FlushTelemetry();
  const double seconds = elapsed();

  nlohmann::json j = session.Report();
  j.update({
      {"first_session_id", first_session},
      {"loops", loops},  // whole replays of the trace
      {"events", events},
      {"seconds", seconds},
      {"peak_reserved", peak_reserved},
      {"num_device_alloc", device_allocs},
      {"loop_peaks", loop_peaks},
      {"speed", o.speed},
  });
  if (o.json) {
    out << j.dump(2) << "\n";
    return 0;
  }
  out << "session " << (*client)->session_id() << ": " << loops
      << " loop(s), " << events << " events in " << seconds << " s\n"
      << "peak reserved " << FormatSize(peak_reserved) << ", "
      << device_allocs << " chunk acquisitions, " << session.ooms_reported()
      << " OOMs, " << session.reclaims() << " reclaim requests answered\n"
      << "config v" << session.config_version() << " \""
      << FormatAllocatorConfig(session.config()) << "\" ("
      << session.configs_applied() << " pushes applied, "
      << session.configs_rejected() << " rejected), "
      << (*client)->epoch() - 1 << " reconnects\n";
  return 0;
}

}  // namespace allocd
