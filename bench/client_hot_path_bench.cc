// The client's hot path on the CPU: what allocd adds to an allocation in
// transparent mode, measured against a bare loop, so that a regression
// shows without a GPU.
//
//   build/release/bench/client_hot_path_bench   # about 15 s
//
// Every benchmark counts allocations (an alloc and its free) per second
// (items_per_second) and its `x_bare` counter is its time per allocation in
// bare loops' (BM_BareLoop = 1). The recorder's run twice, with
// absl::Mutex's deadlock detection as a process has it (`deadlock:1`: on in
// an absl built without NDEBUG, as Debian's is, and so in every allocd
// process linked against it; each lock then looks itself up in a
// process-wide lock graph) and off (`deadlock:0`,
// SetMutexDeadlockDetectionMode(kIgnore)):
// - BM_BareLoop: the bookkeeping-free work, the events' fields (op, stream,
//   id, size) of an alloc and its free made and dropped.
// - BM_Record_*: the same events through the EventRecorder (Record of
//   alloc, free_requested and free_completed, as the tracker records
//   PyTorch's history), 64 Ki events of capacity (the client's default):
//   InlineTake takes at the half-full cue on the recording thread (the lock
//   never contended); TelemetryTake takes on another thread woken by the
//   cue or every 100 ms, as TelemetryStream does (`dropped_pct`: events the
//   taker was too late for, on a busy machine); Full never takes, so every
//   event is dropped and counted (the daemon away); Bulk records a reader's
//   12,288 events at once, one Record each (`many:0`) or one RecordMany
//   (`many:1`), as allocd_record_events records the tracker's.
// - BM_Segment: the interposer's cudaMalloc / cudaFree below the CUDA
//   driver: DaemonBackend::AllocateSegment and FreeSegment
//   (one Acquire of daemon chunks, their mapping, their unmapping and
//   release, in the background as the interposer's client does) with the
//   sim mapper (mmap of memfd chunks) over a daemon in this process (sim
//   backend) on a Unix socket, through the real gRPC and SCM_RIGHTS path.
//   Each iteration takes 8 segments of `bytes` then frees them, as PyTorch
//   fills its cache and empties it; `read_ahead:1` keeps grants read ahead
//   for 200 ms (GrantReadAhead, the interposer's default), `read_ahead:0`
//   asks the daemon for each. Deadlock detection as a process has it: it
//   cannot be switched once the daemon's threads run.
// - BM_FreeHeavy: one segment allocated and freed per iteration, from one
//   or four threads under one lock as the interposer's, releasing in the
//   background or waiting for the daemon (`release`).
// - BM_PeakFromNeighbour: a job's peak of 16 x 1 GiB gathered from what a
//   neighbour's reclaimed cache gives back, against the same peak from a
//   pool with room (`x_room`), with and without read-ahead.
//
// What needs the CUDA driver is not here: the interposer itself
// (client/interpose/allocd_interpose.cc, a shared library built only with
// the toolkit, which finds cudaGetDevice and the runtime's own functions
// with dlsym) and CudaDaemonBackend's mapper (cuMemImportFromShareableHandle,
// cuMemMap, cuMemSetAccess; cudaFree's device synchronisation). Above
// DaemonBackend the interposer adds, per segment, a cudaGetDevice, two
// acquisitions of its one absl::Mutex (the session's lookup, then the call,
// held across DaemonBackend's acquire round trips) and a std::map insert and
// erase; below it, on a GPU, the mapper's driver calls take the place of
// mmap. bench/gpu/ measures those (cuda_chunk_bench, malloc_bench.py,
// overhead.sh).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/trace/trace.h"
#include "benchmark/benchmark.h"
#include "client/daemon_backend.h"
#include "client/daemon_client.h"
#include "client/event_recorder.h"
#include "server/daemon.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
// The client's (DaemonClientOptions::event_capacity).
const size_t kEventCapacity = DaemonClientOptions().event_capacity;

// The events of one allocation, as the tracker reads them from PyTorch's
// history: the same for the bare loop and the recorder.
struct Allocation {
  uint64_t stream = 7;
  uint64_t id = 0;
  uint64_t size = 0;
};

Allocation Next(uint64_t i) {
  static constexpr uint64_t kSizes[] = {512, 4096, 1 * kMiB, 20 * kMiB};
  return {.stream = 7, .id = i, .size = kSizes[i & 3]};
}

constexpr TraceOp kOps[] = {TraceOp::kAlloc, TraceOp::kFreeRequested,
                            TraceOp::kFreeCompleted};

// ------------------------------------------------------------ bare loop

void BM_BareLoop(benchmark::State& state) {
  uint64_t i = 0;
  for (auto _ : state) {
    const Allocation a = Next(i++);
    for (TraceOp op : kOps) {
      benchmark::DoNotOptimize(op);
      benchmark::DoNotOptimize(a.stream);
      benchmark::DoNotOptimize(a.id);
      benchmark::DoNotOptimize(a.size);
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BareLoop)->UseRealTime()->MinTime(0.2);

// absl::Mutex's deadlock detection off for a run under `deadlock:0`, then
// back to kAbort, the default (which only an absl without NDEBUG acts on).
// Only while no other thread locks: one that took a lock untracked and
// released it tracked would make absl abort. So the daemon starts after
// (BM_Segment starts it), and the taker thread runs inside.
class ScopedDeadlockDetection {
 public:
  explicit ScopedDeadlockDetection(const benchmark::State& state) {
    if (state.range(0) == 0) {
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    }
  }
  ~ScopedDeadlockDetection() {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  }
};

void DeadlockArgs(benchmark::internal::Benchmark* b) {
  b->ArgName("deadlock")->Arg(1)->Arg(0)->UseRealTime()->MinTime(0.2);
}

// Events dropped, in percent of those recorded.
double DroppedPercent(const EventRecorder& recorder,
                      const benchmark::State& state) {
  return 100.0 * static_cast<double>(recorder.dropped_total()) /
         static_cast<double>(std::size(kOps) * state.iterations());
}

// -------------------------------------------------------- event recorder

void RecordAllocation(EventRecorder& recorder, const Allocation& a) {
  for (TraceOp op : kOps) recorder.Record(op, a.stream, a.id, a.size);
}

void BM_Record_InlineTake(benchmark::State& state) {
  ScopedDeadlockDetection deadlock_detection(state);
  bool half_full = false;
  EventRecorder recorder(kEventCapacity, [&half_full] { half_full = true; });
  uint64_t i = 0;
  for (auto _ : state) {
    RecordAllocation(recorder, Next(i++));
    if (half_full) {
      half_full = false;
      benchmark::DoNotOptimize(recorder.Take());
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["dropped_pct"] = DroppedPercent(recorder, state);
}
BENCHMARK(BM_Record_InlineTake)->Apply(DeadlockArgs);

// A reader that takes the allocator's events in bulk (the Python package's
// tracker: ~10,000 events a step, each advisor round) records them one
// Record at a time (`many:0`, what allocd_record_events did) or with one
// RecordMany (`many:1`); 4,096 allocations (12,288 events) a call, taken
// after each.
void BM_Record_Bulk(benchmark::State& state) {
  ScopedDeadlockDetection deadlock_detection(state);
  constexpr size_t kAllocations = 4096;
  std::vector<TraceOp> ops;
  std::vector<uint64_t> streams, ids, sizes;
  for (uint64_t i = 0; i < kAllocations; ++i) {
    const Allocation a = Next(i);
    for (TraceOp op : kOps) {
      ops.push_back(op);
      streams.push_back(a.stream);
      ids.push_back(a.id);
      sizes.push_back(a.size);
    }
  }
  EventRecorder recorder(kEventCapacity);
  const bool many = state.range(1) != 0;
  for (auto _ : state) {
    if (many) {
      recorder.RecordMany(ops.data(), streams.data(), ids.data(), sizes.data(),
                          ops.size());
    } else {
      for (size_t i = 0; i < ops.size(); ++i) {
        recorder.Record(ops[i], streams[i], ids[i], sizes[i]);
      }
    }
    benchmark::DoNotOptimize(recorder.Take());
  }
  state.SetItemsProcessed(state.iterations() * kAllocations);
  state.counters["dropped_pct"] = 100.0 * static_cast<double>(recorder.dropped_total()) /
                                  static_cast<double>(state.iterations() * ops.size());
}
BENCHMARK(BM_Record_Bulk)
    ->ArgNames({"deadlock", "many"})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({0, 0})
    ->Args({0, 1})
    ->UseRealTime()
    ->MinTime(0.2);

// TelemetryStream's taking: woken by the recorder's half-full cue or after
// its period.
class TelemetryTaker {
 public:
  TelemetryTaker()
      : recorder_(kEventCapacity,
                  [this] {
                    absl::MutexLock lock(&mu_);
                    events_waiting_ = true;
                  }),
        thread_([this] { Run(); }) {}
  ~TelemetryTaker() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  EventRecorder& recorder() { return recorder_; }

 private:
  void Run() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stopping_ || events_waiting_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&wake),
                             DaemonClientOptions().telemetry_period);
        if (stopping_) return;
        events_waiting_ = false;
      }
      benchmark::DoNotOptimize(recorder_.Take());
    }
  }

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool events_waiting_ ABSL_GUARDED_BY(mu_) = false;
  EventRecorder recorder_;
  std::thread thread_;
};

void BM_Record_TelemetryTake(benchmark::State& state) {
  ScopedDeadlockDetection deadlock_detection(state);
  TelemetryTaker taker;
  uint64_t i = 0;
  for (auto _ : state) RecordAllocation(taker.recorder(), Next(i++));
  state.SetItemsProcessed(state.iterations());
  state.counters["dropped_pct"] = DroppedPercent(taker.recorder(), state);
}
BENCHMARK(BM_Record_TelemetryTake)->Apply(DeadlockArgs);

void BM_Record_Full(benchmark::State& state) {
  ScopedDeadlockDetection deadlock_detection(state);
  EventRecorder recorder(kEventCapacity);
  for (uint64_t i = 0; i < kEventCapacity; ++i) {
    recorder.Record(TraceOp::kAlloc, 0, i, 0);
  }
  uint64_t i = 0;
  for (auto _ : state) RecordAllocation(recorder, Next(i++));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Record_Full)->Apply(DeadlockArgs);

// ------------------------------------------------ segments from a daemon

struct Node {
  bool started = false;
  std::string dir;
  std::unique_ptr<Daemon> daemon;
  // By [read-ahead][releases in the background]: sessions of their own.
  std::unique_ptr<DaemonClient> clients[2][2];
  bool failed = false;
};

Node& TheNode() {
  static auto* node = new Node();
  return *node;
}

// The daemon, and a client with each read-ahead; false, with a message
// on stdout, when either does not start.
bool StartNode() {
  Node& node = TheNode();
  std::string pattern =
      (std::filesystem::temp_directory_path() / "allocd_bench_XXXXXX")
          .string();
  if (mkdtemp(pattern.data()) == nullptr) return false;
  node.dir = pattern;
  const std::string socket = node.dir + "/allocd.sock";
  // The daemon's log lines (one per session) to a file, not over the
  // results.
  const int log = open((node.dir + "/daemon.log").c_str(),
                       O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (log >= 0) {
    dup2(log, STDERR_FILENO);
    close(log);
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(
      {.socket = socket, .metrics_address = "", .backend = "sim",
       .capacity = 4 * kGiB});
  if (!daemon.ok()) {
    std::printf("client_hot_path_bench: %s\n",
                std::string(daemon.status().message()).c_str());
    return false;
  }
  node.daemon = *std::move(daemon);
  const absl::Duration read_ahead[] = {absl::ZeroDuration(),
                                       absl::Milliseconds(200)};
  for (int i = 0; i < 2; ++i) {
    for (int background = 0; background < 2; ++background) {
      absl::StatusOr<std::unique_ptr<DaemonClient>> client =
          DaemonClient::Connect({.socket = socket,
                                 .description = "client_hot_path_bench",
                                 .read_ahead_keep = read_ahead[i],
                                 .release_in_background = background != 0});
      if (!client.ok()) {
        std::printf("client_hot_path_bench: %s\n",
                    std::string(client.status().message()).c_str());
        return false;
      }
      node.clients[i][background] = *std::move(client);
    }
  }
  return true;
}

constexpr int kSegmentsPerRound = 8;

void BM_Segment(benchmark::State& state) {
  Node& node = TheNode();
  if (!node.started && (node.failed || !(node.started = StartNode()))) {
    state.SkipWithError("the daemon did not start");
    node.failed = true;
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0));
  // Releasing as the interposer does.
  DaemonClient* client = node.clients[state.range(1)][1].get();
  // As the interposer makes it, less the CUDA mapper (sim mode's mmap).
  DaemonBackend backend(client);
  uint64_t addresses[kSegmentsPerRound];
  auto round = [&]() -> bool {
    for (uint64_t& address : addresses) {
      absl::StatusOr<uint64_t> got = backend.AllocateSegment(bytes);
      if (!got.ok()) {
        state.SkipWithError(std::string(got.status().message()).c_str());
        node.failed = true;
        return false;
      }
      address = *got;
    }
    for (uint64_t address : addresses) backend.FreeSegment(address, bytes);
    return true;
  };
  // Once, so that the pool has the chunks cached: the steady state.
  if (!round()) return;
  const uint64_t own_before = client->own_acquires();
  for (auto _ : state) {
    if (!round()) break;
  }
  state.SetItemsProcessed(state.iterations() * kSegmentsPerRound);
  // Segments whose acquire asked the daemon itself (not read ahead).
  state.counters["asked_per_segment"] =
      static_cast<double>(client->own_acquires() - own_before) /
      static_cast<double>(std::max<int64_t>(state.iterations(), 1) *
                          kSegmentsPerRound);
}
BENCHMARK(BM_Segment)
    ->ArgsProduct({{int64_t{2 * kMiB}, int64_t{64 * kMiB}}, {0, 1}})
    ->ArgNames({"bytes", "read_ahead"})
    ->UseRealTime()
    ->MinTime(0.5);

// ------------------------------------------------------- free-heavy loop

// The interposer's cudaMalloc / cudaFree as a free-heavy job drives them
// (PyTorch's small segments, emptied and taken again): each iteration
// allocates one segment of `bytes` and frees it, each call under one mutex
// held across DaemonBackend's calls, as the interposer's mu_ is, from
// `threads` threads together over one client reading ahead as the
// interposer does; `release:1` returns the chunks in the background (the
// interposer's), `release:0` waits for the daemon in each free. `free_us`:
// how long a free held that mutex, on average; `release_calls`: the
// background releases' ReleaseChunks calls per free.
struct SharedBackend {
  absl::Mutex mu;
  std::unique_ptr<DaemonBackend> backend ABSL_GUARDED_BY(mu);
};

void BM_FreeHeavy(benchmark::State& state) {
  static auto* const shared = new SharedBackend();
  Node& node = TheNode();
  if (state.thread_index() == 0) {
    if (!node.started && !node.failed) node.started = StartNode();
    node.failed = !node.started;
    absl::MutexLock lock(&shared->mu);
    if (node.started) {
      shared->backend = std::make_unique<DaemonBackend>(
          node.clients[1][state.range(1)].get());
    }
  }
  const size_t bytes = static_cast<size_t>(state.range(0));
  const uint64_t calls_before =
      state.thread_index() == 0 && node.started
          ? node.clients[1][state.range(1)]->background_release_calls()
          : 0;
  absl::Duration freeing;
  for (auto _ : state) {
    absl::StatusOr<uint64_t> got = absl::InternalError("the daemon did not start");
    {
      absl::MutexLock lock(&shared->mu);
      if (shared->backend != nullptr) got = shared->backend->AllocateSegment(bytes);
    }
    if (!got.ok()) {
      state.SkipWithError(std::string(got.status().message()).c_str());
      node.failed = true;
      break;
    }
    const absl::Time start = absl::Now();
    {
      absl::MutexLock lock(&shared->mu);
      shared->backend->FreeSegment(*got, bytes);
    }
    freeing += absl::Now() - start;
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && node.started) {
    const uint64_t calls =
        node.clients[1][state.range(1)]->background_release_calls();
    state.counters["release_calls"] = benchmark::Counter(
        static_cast<double>(calls - calls_before) /
        static_cast<double>(std::max<int64_t>(state.iterations(), 1) *
                            state.threads()));
  }
  state.counters["free_us"] = benchmark::Counter(
      absl::ToDoubleMicroseconds(freeing) /
          static_cast<double>(std::max<int64_t>(state.iterations(), 1)),
      benchmark::Counter::kAvgThreads);
  if (state.thread_index() == 0) {
    absl::MutexLock lock(&shared->mu);
    shared->backend.reset();
  }
}
BENCHMARK(BM_FreeHeavy)
    ->ArgsProduct({{int64_t{2 * kMiB}}, {0, 1}})
    ->ArgNames({"bytes", "release"})
    ->Threads(1)
    ->Threads(4)
    ->UseRealTime()
    ->MinTime(0.5);

// ----------------------------------------------- a peak from a neighbour

// A job's peak gathered from a neighbour's cache, as on a packed GPU: a
// pool of its own (capacity for kBurst + 2 segments of kBurstSegment), a
// neighbour whose allocator caches kBurst segments (its telemetry says so)
// and answers a reclaim request as PyTorch's empty_cache does (frees all
// of them), and a job that takes kBurst segments in a row, both through
// DaemonBackend as the interposer makes it (client_creates, releases in the
// background). The first two
// segments fit beside the neighbour's; the rest need the reclaim.
constexpr int kBurst = 16;
constexpr uint64_t kBurstSegment = 1 * kGiB;

class Neighbourhood {
 public:
  // Empty `error()` when the daemon and both clients started.
  explicit Neighbourhood(absl::Duration job_read_ahead) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "allocd_bench_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = pattern;
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(
        {.socket = dir_ + "/allocd.sock", .metrics_address = "",
         .backend = "sim", .capacity = (kBurst + 2) * kBurstSegment});
    if (!daemon.ok()) {
      error_ = std::string(daemon.status().message());
      return;
    }
    daemon_ = *std::move(daemon);
    const absl::Duration read_ahead[] = {DaemonClientOptions().read_ahead_keep,
                                         job_read_ahead};
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<DaemonClient>> client =
          DaemonClient::Connect({.socket = dir_ + "/allocd.sock",
                                 .job = i == 0 ? "neighbour" : "job",
                                 .description = "client_hot_path_bench",
                                 .read_ahead_keep = read_ahead[i],
                                 .release_in_background = true});
      if (!client.ok()) {
        error_ = std::string(client.status().message());
        return;
      }
      clients_[i] = *std::move(client);
      backends_[i] = std::make_unique<DaemonBackend>(clients_[i].get());
      backends_[i]->set_client_creates(true);
    }
    responder_ = std::thread([this] { AnswerReclaims(); });
  }
  ~Neighbourhood() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (responder_.joinable()) responder_.join();
    {
      absl::MutexLock lock(&mu_);
      for (uint64_t address : cached_) {
        backends_[0]->FreeSegment(address, kBurstSegment);
      }
      cached_.clear();
    }
    for (auto& backend : backends_) backend.reset();
    for (auto& client : clients_) client.reset();
    if (daemon_ != nullptr) daemon_->Shutdown();
    daemon_.reset();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  const std::string& error() const { return error_; }
  DaemonBackend& job() { return *backends_[1]; }
  const DaemonClient& job_client() const { return *clients_[1]; }

  // The neighbour takes its kBurst segments again and says it caches them
  // all; waits for the memory the job gave back (or still reads ahead).
  absl::Status Refill(bool neighbour_caches) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (neighbour_caches && cached_.size() < kBurst) {
      absl::StatusOr<uint64_t> got = backends_[0]->AllocateSegment(kBurstSegment);
      if (got.ok()) {
        cached_.push_back(*got);
      } else if (absl::Now() > deadline) {
        return got.status();
      } else {
        mu_.Unlock();
        absl::SleepFor(absl::Milliseconds(1));
        mu_.Lock();
      }
    }
    const int64_t reserved =
        static_cast<int64_t>(cached_.size() * kBurstSegment);
    clients_[0]->PublishStats({{"reserved_bytes.all.current", reserved},
                               {"allocated_bytes.all.current", 0}},
                              0);
    absl::Status flushed = clients_[0]->FlushTelemetry();
    // Sent is not yet read: the daemon reads telemetry on a thread of its own.
    absl::SleepFor(absl::Milliseconds(20));
    return flushed;
  }

 private:
  // The neighbour's allocator: a reclaim request empties its cache.
  void AnswerReclaims() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      if (!clients_[0]->AwaitControl(absl::Milliseconds(20))) continue;
      bool reclaim = false;
      for (const v1::ControlMessage& m : clients_[0]->TakeControl()) {
        reclaim |= m.has_reclaim();
      }
      if (!reclaim) continue;
      absl::MutexLock lock(&mu_);
      for (uint64_t address : cached_) {
        backends_[0]->FreeSegment(address, kBurstSegment);
      }
      cached_.clear();
      clients_[0]->PublishStats({{"reserved_bytes.all.current", 0},
                                 {"allocated_bytes.all.current", 0}},
                                0);
    }
  }

  std::string error_;
  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
  // The neighbour's, then the job's.
  std::unique_ptr<DaemonClient> clients_[2];
  std::unique_ptr<DaemonBackend> backends_[2];
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> cached_ ABSL_GUARDED_BY(mu_);  // the neighbour's
  std::thread responder_;
};

// The time of each burst (manual time), its p50 and p99 in ms, and the
// acquires that asked the daemon themselves per segment (1 without
// read-ahead; the rest were read ahead);
// `reclaim:0`: the neighbour caches nothing (the pool has room), the
// reference of `x_room` (this run's burst time in that one's, with the
// same read-ahead).
void BM_PeakFromNeighbour(benchmark::State& state) {
  const bool reclaim = state.range(0) != 0;
  Neighbourhood node(state.range(1) != 0 ? absl::Milliseconds(200)
                                         : absl::ZeroDuration());
  if (!node.error().empty()) {
    state.SkipWithError(node.error().c_str());
    TheNode().failed = true;
    return;
  }
  std::vector<double> ms;
  std::vector<uint64_t> segments;
  const uint64_t own_before = node.job_client().own_acquires();
  for (auto _ : state) {
    if (absl::Status s = node.Refill(reclaim); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      TheNode().failed = true;
      break;
    }
    const absl::Time start = absl::Now();
    for (int i = 0; i < kBurst; ++i) {
      absl::StatusOr<uint64_t> got = node.job().AllocateSegment(kBurstSegment);
      if (!got.ok()) break;
      segments.push_back(*got);
    }
    const absl::Duration took = absl::Now() - start;
    const bool complete = segments.size() == kBurst;
    for (uint64_t address : segments) {
      node.job().FreeSegment(address, kBurstSegment);
    }
    segments.clear();
    if (!complete) {
      state.SkipWithError("the job's peak was refused");
      TheNode().failed = true;
      break;
    }
    state.SetIterationTime(absl::ToDoubleSeconds(took));
    ms.push_back(absl::ToDoubleMilliseconds(took));
  }
  if (ms.empty()) return;
  std::sort(ms.begin(), ms.end());
  state.counters["p50_ms"] = ms[ms.size() / 2];
  state.counters["p99_ms"] = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  // Round trips the job's acquires made themselves, per segment.
  state.counters["asked_per_segment"] =
      static_cast<double>(node.job_client().own_acquires() - own_before) /
      static_cast<double>(ms.size() * kBurst);
  state.SetItemsProcessed(state.iterations() * kBurst);
}
BENCHMARK(BM_PeakFromNeighbour)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"reclaim", "read_ahead"})
    ->UseManualTime()
    ->Iterations(30);

// The console's report, with each run's time per allocation in bare
// loops' (x_bare), once BM_BareLoop has run: an aggregate's
// (--benchmark_repetitions) in the bare loop's same aggregate.
class BareRatioReporter : public benchmark::ConsoleReporter {
 public:
  BareRatioReporter()
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    std::vector<Run> runs = reports;
    for (Run& run : runs) {
      auto rate = run.counters.find("items_per_second");
      if (run.error_occurred || rate == run.counters.end() ||
          rate->second.value <= 0) {
        continue;
      }
      const std::string kind =
          run.run_type == Run::RT_Iteration ? "" : run.aggregate_name;
      if (run.run_name.function_name == "BM_BareLoop") {
        bare_rates_[kind] = rate->second.value;
      }
      if (auto bare = bare_rates_.find(kind); bare != bare_rates_.end()) {
        run.counters["x_bare"] = bare->second / rate->second.value;
      }
      if (run.run_name.function_name == "BM_PeakFromNeighbour") {
        const size_t at = run.run_name.args.find("reclaim:");
        if (at == std::string::npos) continue;
        std::string room = run.run_name.args;
        room[at + std::strlen("reclaim:")] = '0';
        if (room == run.run_name.args) {
          room_times_[kind + room] = run.GetAdjustedRealTime();
        } else if (auto it = room_times_.find(kind + room);
                   it != room_times_.end() && it->second > 0) {
          run.counters["x_room"] = run.GetAdjustedRealTime() / it->second;
        }
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

 private:
  // By aggregate ("" for a single run).
  std::map<std::string, double> bare_rates_;
  // BM_PeakFromNeighbour's times without a reclaim, by aggregate and args.
  std::map<std::string, double> room_times_;
};

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  allocd::Node& node = allocd::TheNode();
  const int saved_stderr = dup(STDERR_FILENO);
  allocd::BareRatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  for (auto& clients : node.clients) {
    for (auto& client : clients) client.reset();
  }
  if (node.daemon != nullptr) node.daemon->Shutdown();
  node.daemon.reset();
  benchmark::Shutdown();
  dup2(saved_stderr, STDERR_FILENO);
  if (node.failed) {
    if (!node.dir.empty()) {
      std::fprintf(stderr,
                   "client_hot_path_bench: the daemon's log is %s/daemon.log\n",
                   node.dir.c_str());
    }
    return 1;
  }
  std::error_code ignored;
  if (!node.dir.empty()) std::filesystem::remove_all(node.dir, ignored);
  return 0;
}
