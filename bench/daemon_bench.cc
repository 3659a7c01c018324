// The node daemon, measured through the real client library: a `Daemon`
// (sim backend: memfd chunks) runs in this process on a temporary Unix
// socket, and clients talk to it over gRPC and the SCM_RIGHTS side socket
// exactly as a training process does.
//
//   build/release/bench/daemon_bench
//
// - BM_AcquireRelease/BYTES: DaemonClient::Acquire (AcquireChunks RPC + the
//   claim of the FDs over the lease socket) then Release, on the reused
//   path (every chunk comes from the pool's cache). Counters: p50/p99 in
//   microseconds of the Acquire alone and of the whole pair, from
//   per-iteration times. 2 MiB is one chunk, 64 MiB 32 chunks, 1 GiB 512
//   chunks (three SCM_RIGHTS frames of at most 253 FDs).
// - BM_AdminStatus: unary RPCs per second (Admin.Status over a raw stub,
//   one connection per client thread), 1 and 4 client threads.
// - BM_SessionMemory_Core: the daemon core's memory per session: RSS and
//   malloc'ed bytes before and after registering 1000 sessions (fake pids;
//   the core trusts the credentials it is given), bare and with one
//   telemetry report each (PyTorch's full memory_stats() dict).
// - BM_SessionMemory_Daemon: the whole daemon's RSS per session with real
//   client processes (this binary re-executed as a DaemonClient that
//   publishes telemetry, holds its session, and waits): RSS at 20 sessions
//   and at 220, divided by the 200 between.
//
// The daemon's log lines go to daemon.log in the temporary directory, which
// is removed at exit unless a benchmark failed.
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/stats.h"
#include "allocd.grpc.pb.h"
#include "benchmark/benchmark.h"
#include "client/daemon_client.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"
#include "server/daemon.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

extern char** environ;

namespace allocd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// ------------------------------------------------------------- the daemon

struct Bench {
  std::string dir;
  std::string socket;
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<DaemonClient> client;
  bool failed = false;
};

Bench& TheBench() {
  static auto* bench = new Bench();
  return *bench;
}

int64_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

int64_t HeapBytes() { return static_cast<int64_t>(mallinfo2().uordblks); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1,
                            static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// The Admin service of the daemon whose socket is `socket`: on its admin
// socket.
std::unique_ptr<v1::Admin::Stub> AdminStub(const std::string& socket) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket + ".admin");
  if (!fd.ok()) return nullptr;
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  return v1::Admin::NewStub(
      grpc::CreateInsecureChannelFromFd("allocd", fd->release()));
}

uint32_t DaemonSessions(v1::Admin::Stub& admin) {
  grpc::ClientContext context;
  v1::StatusResponse response;
  if (!admin.Status(&context, v1::StatusRequest(), &response).ok()) return 0;
  return response.sessions();
}

// ------------------------------------------------- (a) acquire latency

void BM_AcquireRelease(benchmark::State& state) {
  DaemonClient& client = *TheBench().client;
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  // Once, so that the pool has the chunks cached: the measured path is
  // the reused one, as in a steady-state training job.
  {
    absl::StatusOr<ReceivedChunks> warm = client.Acquire(bytes);
    if (!warm.ok()) {
      state.SkipWithError(std::string(warm.status().message()).c_str());
      return;
    }
    (void)client.Release(warm->epoch, warm->ids);
  }
  std::vector<double> acquire_us, pair_us;
  acquire_us.reserve(1 << 16);
  pair_us.reserve(1 << 16);
  uint64_t chunks = 0, reused = 0;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<ReceivedChunks> got = client.Acquire(bytes);
    const Clock::time_point t1 = Clock::now();
    if (!got.ok()) {
      state.SkipWithError(std::string(got.status().message()).c_str());
      TheBench().failed = true;
      break;
    }
    chunks += got->ids.size();
    reused += got->reused;
    absl::Status released = client.Release(got->epoch, got->ids);
    got->fds.clear();  // closes the FDs, as a client does once mapped
    const Clock::time_point t2 = Clock::now();
    if (!released.ok()) {
      state.SkipWithError(std::string(released.message()).c_str());
      TheBench().failed = true;
      break;
    }
    acquire_us.push_back(Micros(t1 - t0));
    pair_us.push_back(Micros(t2 - t0));
  }
  state.counters["acquire_p50_us"] = Percentile(acquire_us, 0.50);
  state.counters["acquire_p99_us"] = Percentile(acquire_us, 0.99);
  state.counters["pair_p50_us"] = Percentile(pair_us, 0.50);
  state.counters["pair_p99_us"] = Percentile(pair_us, 0.99);
  state.counters["reused_pct"] =
      chunks == 0 ? 0 : 100.0 * static_cast<double>(reused) / chunks;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

BENCHMARK(BM_AcquireRelease)
    ->Arg(2 * kMiB)
    ->Arg(64 * kMiB)
    ->Arg(1 * kGiB)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ------------------------------------------------------ (b) RPC rate

void BM_AdminStatus(benchmark::State& state) {
  // One connection per client thread, like separate processes.
  std::unique_ptr<v1::Admin::Stub> admin = AdminStub(TheBench().socket);
  if (admin == nullptr) {
    state.SkipWithError("cannot connect");
    return;
  }
  v1::StatusRequest request;
  for (auto _ : state) {
    grpc::ClientContext context;
    v1::StatusResponse response;
    grpc::Status s = admin->Status(&context, request, &response);
    if (!s.ok()) {
      state.SkipWithError(s.error_message().c_str());
      TheBench().failed = true;
      break;
    }
    benchmark::DoNotOptimize(response);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_AdminStatus)
    ->Threads(1)
    ->Threads(4)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// -------------------------------------------- (c) memory per session

// The core alone, with fake credentials: what one session's bookkeeping
// (registry, pool entry, metric series, config state) costs.
void BM_SessionMemory_Core(benchmark::State& state) {
  constexpr int kSessions = 1000;
  const bool telemetry = state.range(0) != 0;
  const std::map<std::string, int64_t> stats = MemoryStatsDict(DeviceStats{});
  for (auto _ : state) {
    MemfdChunkSource source;
    NodePool pool(&source, 64 * kGiB);
    Metrics metrics;
    DaemonCore core({.fd_socket = TheBench().dir + "/unused.fds"}, &pool,
                    &metrics);
    v1::RegisterRequest request;
    request.set_protocol_version(1);
    request.set_job("bench-job");
    request.set_client("allocd-python 0.1 torch 2.11");
    v1::TelemetryReport report;
    for (const auto& [k, v] : stats) (*report.mutable_stats())[k] = v;
    // One session first: one-time allocations are not per session.
    PeerCredentials peer{.pid = 1 << 22, .uid = getuid(), .gid = getgid()};
    (void)core.Register(peer, request);
    malloc_trim(0);
    const int64_t rss0 = RssBytes();
    const int64_t heap0 = HeapBytes();
    for (int i = 1; i <= kSessions; ++i) {
      peer.pid = (1 << 22) + i;
      absl::StatusOr<v1::RegisterResponse> r = core.Register(peer, request);
      if (!r.ok()) {
        state.SkipWithError(std::string(r.status().message()).c_str());
        TheBench().failed = true;
        return;
      }
      if (telemetry) {
        report.set_session_id(r->session_id());
        report.set_session_secret(r->session_secret());
        (void)core.Telemetry(peer, report);
      }
    }
    const int64_t rss1 = RssBytes();
    const int64_t heap1 = HeapBytes();
    state.counters["sessions"] = kSessions;
    state.counters["rss_per_session"] =
        static_cast<double>(rss1 - rss0) / kSessions;
    state.counters["heap_per_session"] =
        static_cast<double>(heap1 - heap0) / kSessions;
    state.PauseTiming();
    core.EndAll();
    state.ResumeTiming();
  }
}

BENCHMARK(BM_SessionMemory_Core)
    ->ArgName("telemetry")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Child processes for BM_SessionMemory_Daemon: each one a DaemonClient.
class ClientProcesses {
 public:
  explicit ClientProcesses(const std::string& socket) : socket_(socket) {
    int in[2], ready[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(ready, O_CLOEXEC) != 0) return;
    stdin_read_.reset(in[0]);
    stdin_write_.reset(in[1]);
    ready_read_.reset(ready[0]);
    ready_write_.reset(ready[1]);
  }
  ~ClientProcesses() {
    Stop();
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }

  // Starts `n` more and waits until each holds its session.
  bool Add(int n) {
    for (int i = 0; i < n; ++i) {
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_adddup2(&actions, stdin_read_.get(),
                                       STDIN_FILENO);
      posix_spawn_file_actions_adddup2(&actions, ready_write_.get(),
                                       STDOUT_FILENO);
      std::string self = "/proc/self/exe", flag = "--child-client";
      std::vector<char*> argv = {self.data(), flag.data(), socket_.data(),
                                 nullptr};
      pid_t pid = 0;
      const int rc = posix_spawn(&pid, argv[0], &actions, nullptr,
                                 argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      if (rc != 0) return false;
      pids_.push_back(pid);
    }
    // A child that fails says nothing; give up after a generous wait.
    for (int i = 0; i < n; ++i) {
      pollfd p{ready_read_.get(), POLLIN, 0};
      char c;
      if (poll(&p, 1, 120'000) != 1 || read(ready_read_.get(), &c, 1) != 1 ||
          c != '+') {
        return false;
      }
    }
    return true;
  }
  // EOF on every child's stdin: they end their sessions and exit.
  void Stop() {
    stdin_write_.reset();
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
    pids_.clear();
  }

 private:
  std::string socket_;
  UniqueFd stdin_read_, stdin_write_, ready_read_, ready_write_;
  std::vector<pid_t> pids_;
};

void WaitForSessions(v1::Admin::Stub& admin, uint32_t n) {
  for (int i = 0; i < 3000 && DaemonSessions(admin) != n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void BM_SessionMemory_Daemon(benchmark::State& state) {
  constexpr int kFirst = 20;
  constexpr int kMore = 200;
  Bench& bench = TheBench();
  std::unique_ptr<v1::Admin::Stub> admin = AdminStub(bench.socket);
  const uint32_t base = DaemonSessions(*admin);
  for (auto _ : state) {
    ClientProcesses children(bench.socket);
    if (!children.Add(kFirst)) {
      state.SkipWithError("client processes did not start");
      bench.failed = true;
      return;
    }
    // Their telemetry streams open; let the daemon's threads settle.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t rss0 = RssBytes();
    if (!children.Add(kMore)) {
      state.SkipWithError("client processes did not start");
      bench.failed = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t rss1 = RssBytes();
    const uint32_t live = DaemonSessions(*admin) - base;
    state.PauseTiming();
    children.Stop();
    WaitForSessions(*admin, base);
    state.ResumeTiming();
    state.counters["sessions"] = live;
    state.counters["rss_per_session"] =
        static_cast<double>(rss1 - rss0) / kMore;
    state.counters["rss_after_end"] = static_cast<double>(RssBytes());
    if (live != kFirst + kMore) {
      state.SkipWithError("the daemon does not list every session");
      bench.failed = true;
    }
  }
}

BENCHMARK(BM_SessionMemory_Daemon)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A client process of BM_SessionMemory_Daemon: registers, opens its lease
// and config watch, publishes telemetry once, says '+' on stdout and holds
// the session until stdin closes.
int ChildClient(const std::string& socket) {
  absl::StatusOr<std::unique_ptr<DaemonClient>> client =
      DaemonClient::Connect({.socket = socket, .description = "daemon_bench"});
  if (!client.ok()) {
    std::fprintf(stderr, "daemon_bench child: %s\n",
                 std::string(client.status().message()).c_str());
    return 1;
  }
  (*client)->PublishStats(MemoryStatsDict(DeviceStats{}), 0);
  (void)(*client)->FlushTelemetry();
  if (write(STDOUT_FILENO, "+", 1) != 1) return 1;
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  return 0;
}

bool StartDaemon() {
  Bench& bench = TheBench();
  std::string pattern =
      (std::filesystem::temp_directory_path() / "allocd_bench_XXXXXX")
          .string();
  if (mkdtemp(pattern.data()) == nullptr) return false;
  bench.dir = pattern;
  bench.socket = bench.dir + "/allocd.sock";
  // Log lines (one per session) to a file, not over the results.
  const int log = open((bench.dir + "/daemon.log").c_str(),
                       O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (log >= 0) {
    dup2(log, STDERR_FILENO);
    close(log);
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Start({.socket = bench.socket,
                     .metrics_address = "",
                     .backend = "sim",
                     .capacity = 8 * kGiB});
  if (!daemon.ok()) {
    std::printf("daemon_bench: %s\n",
                std::string(daemon.status().message()).c_str());
    return false;
  }
  bench.daemon = std::move(*daemon);
  absl::StatusOr<std::unique_ptr<DaemonClient>> client =
      DaemonClient::Connect({.socket = bench.socket,
                             .description = "daemon_bench"});
  if (!client.ok()) {
    std::printf("daemon_bench: %s\n",
                std::string(client.status().message()).c_str());
    return false;
  }
  bench.client = std::move(*client);
  return true;
}

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--child-client") {
    return allocd::ChildClient(argv[2]);
  }
  signal(SIGPIPE, SIG_IGN);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  allocd::Bench& bench = allocd::TheBench();
  const int saved_stderr = dup(STDERR_FILENO);
  const bool started = allocd::StartDaemon();
  if (started) benchmark::RunSpecifiedBenchmarks();
  bench.client.reset();
  if (bench.daemon != nullptr) bench.daemon->Shutdown();
  bench.daemon.reset();
  benchmark::Shutdown();
  dup2(saved_stderr, STDERR_FILENO);
  if (!started || bench.failed) {
    std::fprintf(stderr, "daemon_bench: the daemon's log is %s/daemon.log\n",
                 bench.dir.c_str());
    return 1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(bench.dir, ignored);
  return 0;
}
