// Chunk acquire latency through the daemon on a GPU: what a client pays
// where PyTorch would call cudaMalloc, when the memory comes from
// `allocd serve --backend cuda` in another process.
//
//   cuda_chunk_bench [--allocd BIN | --socket SOCKET] [--iterations N]
//                    [--out FILE.json] [--working-set-gib N --capacity SIZE]
//
// Starts `allocd serve --backend cuda` (BIN, default: the build's or
// $ALLOCD_BINARY) on a temporary socket unless --socket names a running
// one, connects with the real client library and maps chunks with
// CudaDaemonBackend. Prints one JSON object (and writes it to --out), with
// p50/p90/p99/mean/min/max in microseconds of:
// - acquire_map_cold_2MiB: AllocateSegment(2 MiB) when the daemon must
//   create the chunk (cuMemCreate + export in the daemon, AcquireChunks
//   RPC, FD over SCM_RIGHTS, import, reserve, map, set access);
// - acquire_map_2MiB: the same, the chunk coming from the pool's cache (the
//   steady state: memory one process freed, the next one gets);
// - free_2MiB: FreeSegment (synchronize, unmap, release, free the range,
//   ReleaseChunks RPC);
// - acquire_map_64MiB: AllocateSegment of 64 MiB from cached chunks;
// - acquire_map_cold_2GiB, acquire_map_2GiB: AllocateSegment(2 GiB) from a
//   cold pool (two 1 GiB chunks created) and from its cache, what one of
//   PyTorch's 2 GiB cudaMallocs pays in transparent mode; free_2GiB;
//   local_create_map_2GiB: the same without a daemon (one cuMemCreate);
// - ws_*: with --working-set-gib, a working set of 2 GiB segments made
//   each way (driver, local VMM, imported, daemon), 3 rounds (WorkingSet;
//   the daemon started by the benchmark gets --capacity, default 4GiB);
// - step2g_*: the warm 2 GiB path taken apart, and native_mem_alloc_2GiB,
//   the driver's cuMemAlloc of 2 GiB (what cudaMalloc pays natively);
// - step_*: the 2 MiB warm path taken apart (Acquire RPC + FD claim,
//   import, close, reserve, map, set access);
// - local_create_map_2MiB: no daemon: cuMemCreate + reserve + map + set
//   access in this process (what PyTorch's expandable segments pay).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_driver.h"
#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"
#include "ipc/unix_socket.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace allocd {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

nlohmann::json Summary(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) {
    const size_t i = static_cast<size_t>(
        std::max(0.0, std::ceil(p * static_cast<double>(us.size())) - 1));
    return us[std::min(i, us.size() - 1)];
  };
  double sum = 0;
  for (double u : us) sum += u;
  auto round = [](double v) { return std::round(v * 10) / 10; };
  return {{"n", us.size()},
          {"p50_us", round(pct(0.50))},
          {"p90_us", round(pct(0.90))},
          {"p99_us", round(pct(0.99))},
          {"mean_us", round(sum / static_cast<double>(us.size()))},
          {"min_us", round(us.front())},
          {"max_us", round(us.back())}};
}

// Durations of consecutive phases of an iteration, each under its result
// name: Add() takes when each phase began and when the last one ended.
class Phases {
 public:
  explicit Phases(std::vector<std::string> names)
      : names_(std::move(names)), us_(names_.size()) {}
  void Add(const std::vector<Clock::time_point>& marks) {
    for (size_t i = 0; i < names_.size(); ++i) {
      us_[i].push_back(Micros(marks[i], marks[i + 1]));
    }
  }
  void Report(nlohmann::json& results) const {
    for (size_t i = 0; i < names_.size(); ++i) {
      results[names_[i]] = Summary(us_[i]);
    }
  }

 private:
  const std::vector<std::string> names_;
  std::vector<std::vector<double>> us_;
};

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "cuda_chunk_bench: %s: %s\n", what.c_str(),
               std::string(s.message()).c_str());
  return 1;
}

#define CHECK_OK(what, expr)                            \
  if (absl::Status s_ = (expr); !s_.ok()) return Fail(what, s_)

// A warm 2 GiB segment taken apart (the daemon's 1 GiB chunks), beside what
// the driver's own cuMemAlloc of 2 GiB (the runtime's cudaMalloc) costs:
// step2g_* and native_mem_alloc_2GiB / native_mem_free_2GiB.
int TakeApart2GiB(DaemonClient& client, int iterations,
                  nlohmann::json& results) {
  constexpr size_t k2GiB = size_t{2} << 30;
  absl::StatusOr<cuda::PrimaryContext> context = cuda::PrimaryContext::Open(0);
  if (!context.ok()) return Fail("context", context.status());
  Phases phases({"step2g_acquire_rpc_and_fds", "step2g_import",
                 "step2g_reserve", "step2g_map", "step2g_set_access",
                 "step2g_unmap", "step2g_release_free_rpc",
                 "native_mem_alloc_2GiB", "native_mem_free_2GiB"});
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    absl::StatusOr<ReceivedChunks> got = client.Acquire(k2GiB, UINT64_MAX);
    const auto t1 = Clock::now();
    if (!got.ok()) return Fail("Acquire (2 GiB)", got.status());
    std::vector<CUmemGenericAllocationHandle> handles;
    for (const UniqueFd& fd : got->fds) {
      absl::StatusOr<CUmemGenericAllocationHandle> h =
          cuda::ImportFromFd(fd.get());
      if (!h.ok()) return Fail("import", h.status());
      handles.push_back(*h);
    }
    const auto t2 = Clock::now();
    absl::StatusOr<CUdeviceptr> va = cuda::AddressReserve(k2GiB);
    const auto t3 = Clock::now();
    if (!va.ok()) return Fail("reserve", va.status());
    CUdeviceptr at = *va;
    for (size_t c = 0; c < handles.size(); ++c) {
      CHECK_OK("map", cuda::MemMap(at, got->sizes[c], handles[c]));
      at += got->sizes[c];
    }
    const auto t4 = Clock::now();
    CHECK_OK("access", cuda::SetReadWriteAccess(*va, k2GiB, context->device()));
    const auto t5 = Clock::now();
    at = *va;
    for (size_t c = 0; c < handles.size(); ++c) {
      CHECK_OK("unmap", cuda::MemUnmap(at, got->sizes[c]));
      at += got->sizes[c];
    }
    const auto t6 = Clock::now();
    for (CUmemGenericAllocationHandle h : handles) {
      CHECK_OK("release", cuda::MemRelease(h));
    }
    CHECK_OK("free", cuda::AddressFree(*va, k2GiB));
    CHECK_OK("Release", client.Release(got->epoch, got->ids));
    const auto t7 = Clock::now();
    absl::StatusOr<CUdeviceptr> native = cuda::MemAlloc(k2GiB);
    const auto t8 = Clock::now();
    if (!native.ok()) return Fail("cuMemAlloc (2 GiB)", native.status());
    CHECK_OK("cuMemFree", cuda::MemFree(*native));
    const auto t9 = Clock::now();
    if (i == 0) continue;  // warm-up
    phases.Add({t0, t1, t2, t3, t4, t5, t6, t7, t8, t9});
  }
  phases.Report(results);
  return 0;
}

// A working set of `gib` GiB as 2 GiB segments allocated back to back and
// then freed, `rounds` times, each way a segment can come to be:
// - ws_native: cuMemAlloc (what cudaMalloc does natively);
// - ws_local_vmm: two 1 GiB cuMemCreate chunks, not exportable, mapped
//   into one reserved range with one cuMemSetAccess (PyTorch's expandable
//   segments' way);
// - ws_local_vmm_exportable: the same with POSIX FD handles (the daemon's
//   chunks);
// - ws_imported: chunks made once and exported, each segment importing
//   its two FDs (a transparent process's driver work, without the daemon);
//   ws_imported_N_threads: the same work shared by N threads at once;
// - ws_daemon: AllocateSegment through the daemon, the first round cold;
//   ws_daemon_batched_N: N segments' chunks in one grant, each segment
//   imported and mapped as ws_imported does (round trips amortised);
// - ws_daemon_read_ahead: the same, warm, through a client that reads the
//   next grant ahead (GrantReadAhead, as ALLOCD_READ_AHEAD_MS does).
// Each entry's "rounds_ms" is the time to acquire the whole set in each
// round; frees are not timed.
int WorkingSet(DaemonClient& client, CudaDaemonBackend& backend,
               CudaDaemonBackend& reading_ahead, int gib, int rounds,
               nlohmann::json& results) {
  constexpr size_t k1GiB = size_t{1} << 30;
  constexpr size_t k2GiB = size_t{2} << 30;
  const int segments = gib / 2;
  absl::StatusOr<cuda::PrimaryContext> context = cuda::PrimaryContext::Open(0);
  if (!context.ok()) return Fail("context", context.status());
  const CUdevice device = context->device();
  // One way of making segments: `make` one, `drop` it.
  struct Segment {
    CUdeviceptr address = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    // Daemon chunks mapped by hand (ws_daemon_batched_*): what to release.
    uint64_t epoch = 0;
    std::vector<uint64_t> ids;
  };
  // `threads` > 1: the segments are made by that many threads at once, each
  // with the context current (whether the driver's VMM calls scale).
  auto measure = [&](const std::string& name, auto&& make, auto&& drop,
                     int threads = 1) -> int {
    nlohmann::json rounds_ms = nlohmann::json::array();
    // Each segment's time in the first round (one thread): where a round
    // that is slower than the next ones pays.
    nlohmann::json first_round_us = nlohmann::json::array();
    for (int r = 0; r < rounds; ++r) {
      std::vector<Segment> held(segments);
      std::vector<absl::Status> failed(threads);
      const auto t0 = Clock::now();
      auto make_share = [&](int t) {
        if (threads > 1) failed[t] = context->Bind();
        for (int i = t; i < segments && failed[t].ok(); i += threads) {
          const auto m0 = Clock::now();
          absl::StatusOr<Segment> made = make();
          if (r == 0 && threads == 1) {
            first_round_us.push_back(std::round(Micros(m0, Clock::now())));
          }
          if (!made.ok()) {
            failed[t] = made.status();
          } else {
            held[i] = *std::move(made);
          }
        }
      };
      if (threads == 1) {
        make_share(0);
      } else {
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) workers.emplace_back(make_share, t);
        for (std::thread& w : workers) w.join();
      }
      const auto t1 = Clock::now();
      for (const absl::Status& s : failed) {
        if (!s.ok()) return Fail(name, s);
      }
      rounds_ms.push_back(std::round(Micros(t0, t1) / 10) / 100);
      for (Segment& segment : held) {
        if (absl::Status s = drop(segment); !s.ok()) return Fail(name, s);
      }
    }
    results[name] = {{"gib", segments * 2}, {"rounds_ms", rounds_ms}};
    if (threads == 1) results[name]["first_round_us"] = first_round_us;
    return 0;
  };
  // Maps `handles` (1 GiB each) into a new 2 GiB range, read-write.
  auto map_range = [&](std::vector<CUmemGenericAllocationHandle> handles)
      -> absl::StatusOr<Segment> {
    absl::StatusOr<CUdeviceptr> va = cuda::AddressReserve(k2GiB);
    if (!va.ok()) return va.status();
    for (size_t c = 0; c < handles.size(); ++c) {
      if (absl::Status s = cuda::MemMap(*va + c * k1GiB, k1GiB, handles[c]);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = cuda::SetReadWriteAccess(*va, k2GiB, device);
        !s.ok()) {
      return s;
    }
    return Segment{*va, std::move(handles)};
  };
  auto unmap_range = [&](Segment& segment) -> absl::Status {
    for (size_t c = 0; c < segment.handles.size(); ++c) {
      if (absl::Status s = cuda::MemUnmap(segment.address + c * k1GiB, k1GiB);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = cuda::MemRelease(segment.handles[c]); !s.ok()) {
        return s;
      }
    }
    return cuda::AddressFree(segment.address, k2GiB);
  };
  auto local = [&](bool exportable) {
    return [&, exportable]() -> absl::StatusOr<Segment> {
      std::vector<CUmemGenericAllocationHandle> handles;
      for (int c = 0; c < 2; ++c) {
        absl::StatusOr<CUmemGenericAllocationHandle> h =
            cuda::MemCreate(k1GiB, cuda::DeviceMemoryProp(device, exportable));
        if (!h.ok()) return h.status();
        handles.push_back(*h);
      }
      return map_range(std::move(handles));
    };
  };
  if (int r = measure(
          "ws_native",
          [&]() -> absl::StatusOr<Segment> {
            absl::StatusOr<CUdeviceptr> a = cuda::MemAlloc(k2GiB);
            if (!a.ok()) return a.status();
            return Segment{*a, {}};
          },
          [](Segment& s) { return cuda::MemFree(s.address); });
      r != 0) {
    return r;
  }
  if (int r = measure("ws_local_vmm", local(false), unmap_range); r != 0) {
    return r;
  }
  if (int r = measure("ws_local_vmm_exportable", local(true), unmap_range);
      r != 0) {
    return r;
  }
  {
    // The daemon's side done here once: chunks made and exported.
    std::vector<CUmemGenericAllocationHandle> owned;
    std::vector<UniqueFd> exported;
    for (int i = 0; i < 2 * segments; ++i) {
      absl::StatusOr<CUmemGenericAllocationHandle> h =
          cuda::MemCreate(k1GiB, cuda::DeviceMemoryProp(device, true));
      if (!h.ok()) return Fail("cuMemCreate", h.status());
      absl::StatusOr<int> fd = cuda::ExportToFd(*h);
      if (!fd.ok()) return Fail("export", fd.status());
      owned.push_back(*h);
      exported.emplace_back(*fd);
    }
    std::atomic<size_t> next = 0;
    auto import_segment = [&]() -> absl::StatusOr<Segment> {
      std::vector<CUmemGenericAllocationHandle> handles;
      for (int c = 0; c < 2; ++c) {
        absl::StatusOr<CUmemGenericAllocationHandle> h =
            cuda::ImportFromFd(exported[next++ % exported.size()].get());
        if (!h.ok()) return h.status();
        handles.push_back(*h);
      }
      return map_range(std::move(handles));
    };
    int r = measure("ws_imported", import_segment, unmap_range);
    for (int threads : {2, 4}) {
      if (r == 0) {
        r = measure(absl::StrCat("ws_imported_", threads, "_threads"),
                    import_segment, unmap_range, threads);
      }
    }
    for (CUmemGenericAllocationHandle h : owned) (void)cuda::MemRelease(h);
    if (r != 0) return r;
  }
  auto through = [&](CudaDaemonBackend& b) {
    return std::pair{
        [&b]() -> absl::StatusOr<Segment> {
          absl::StatusOr<uint64_t> a = b.AllocateSegment(k2GiB);
          if (!a.ok()) return a.status();
          return Segment{*a, {}};
        },
        [&b](Segment& s) {
          b.FreeSegment(s.address, k2GiB);
          return absl::OkStatus();
        }};
  };
  auto [daemon_make, daemon_drop] = through(backend);
  if (int r = measure("ws_daemon", daemon_make, daemon_drop); r != 0) return r;
  // The grants of `per_grant` segments in one round trip, each segment its
  // two 1 GiB chunks imported and mapped as above: how close fewer round
  // trips come to ws_imported.
  for (int per_grant : {2, 5, 10}) {
    if (segments % per_grant != 0) continue;
    ReceivedChunks stash;
    size_t next_chunk = 0;
    auto make = [&]() -> absl::StatusOr<Segment> {
      if (next_chunk == stash.ids.size()) {
        absl::StatusOr<ReceivedChunks> got =
            client.Acquire(per_grant * k2GiB, k1GiB);
        if (!got.ok()) return got.status();
        if (got->ids.size() != size_t(2 * per_grant)) {
          return absl::InternalError("a grant not of 1 GiB chunks");
        }
        stash = *std::move(got);
        next_chunk = 0;
      }
      std::vector<CUmemGenericAllocationHandle> handles;
      std::vector<uint64_t> ids;
      for (int c = 0; c < 2; ++c, ++next_chunk) {
        absl::StatusOr<CUmemGenericAllocationHandle> h =
            cuda::ImportFromFd(stash.fds[next_chunk].get());
        if (!h.ok()) return h.status();
        handles.push_back(*h);
        ids.push_back(stash.ids[next_chunk]);
      }
      absl::StatusOr<Segment> mapped = map_range(std::move(handles));
      if (!mapped.ok()) return mapped.status();
      mapped->epoch = stash.epoch;
      mapped->ids = std::move(ids);
      return mapped;
    };
    auto drop = [&](Segment& segment) -> absl::Status {
      if (absl::Status s = unmap_range(segment); !s.ok()) return s;
      return client.Release(segment.epoch, segment.ids);
    };
    if (int r = measure(absl::StrCat("ws_daemon_batched_", per_grant), make,
                        drop);
        r != 0) {
      return r;
    }
  }
  auto [ahead_make, ahead_drop] = through(reading_ahead);
  return measure("ws_daemon_read_ahead", ahead_make, ahead_drop);
}

int Run(int argc, char** argv) {
  const char* env_allocd = std::getenv("ALLOCD_BINARY");
  std::string allocd = env_allocd != nullptr ? env_allocd : ALLOCD_BINARY;
  std::string socket;
  std::string out;
  int iterations = 2000;
  int working_set_gib = 0;
  std::string capacity = "4GiB";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      return i + 1 < argc ? argv[++i] : "";
    };
    if (a == "--allocd") {
      allocd = value();
    } else if (a == "--socket") {
      socket = value();
    } else if (a == "--iterations") {
      iterations = std::max(10, std::atoi(value().c_str()));
    } else if (a == "--out") {
      out = value();
    } else if (a == "--working-set-gib") {
      working_set_gib = std::max(0, std::atoi(value().c_str()));
    } else if (a == "--capacity") {
      capacity = value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "cuda_chunk_bench [--allocd BIN | --socket SOCKET] [--iterations "
          "N] [--out FILE.json]\n                 [--working-set-gib N "
          "--capacity SIZE]\nchunk acquire latency through allocd serve "
          "--backend cuda; prints JSON\n");
      return 0;
    } else {
      std::fprintf(stderr, "cuda_chunk_bench: unknown argument %s\n",
                   a.c_str());
      return 64;
    }
  }
  CHECK_OK("CUDA", cuda::Init());

  pid_t daemon = -1;
  std::string dir;
  if (socket.empty()) {
    std::string pattern = "/tmp/allocd_bench_XXXXXX";
    dir = mkdtemp(pattern.data());
    socket = dir + "/allocd.sock";
    std::vector<std::string> args = {allocd,     "serve",          "--backend",
                                     "cuda",     "--socket",       socket,
                                     "--metrics-addr", "",         "--capacity",
                                     capacity};
    std::vector<char*> argv_d;
    for (std::string& s : args) argv_d.push_back(s.data());
    argv_d.push_back(nullptr);
    if (posix_spawn(&daemon, argv_d[0], nullptr, nullptr, argv_d.data(),
                    environ) != 0) {
      std::fprintf(stderr, "cuda_chunk_bench: cannot start %s\n",
                   allocd.c_str());
      return 1;
    }
    for (int i = 0; i < 6000 && !ConnectUnix(socket).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  struct StopDaemon {
    pid_t pid;
    ~StopDaemon() {
      if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
      }
    }
  } stop{daemon};

  absl::StatusOr<std::unique_ptr<DaemonClient>> client =
      DaemonClient::Connect({.socket = socket,
                             .job = "cuda-chunk-bench",
                             .gpu_uuid = GpuUuid(0).value_or("")});
  if (!client.ok()) return Fail("connect", client.status());
  absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> backend =
      CudaDaemonBackend::Create(client->get(), 0);
  if (!backend.ok()) return Fail("CudaDaemonBackend", backend.status());
  const size_t chunk = (*client)->chunk_bytes();
  nlohmann::json results;
  if (working_set_gib > 0) {
    absl::StatusOr<std::unique_ptr<DaemonClient>> ahead_client =
        DaemonClient::Connect({.socket = socket,
                               .job = "cuda-chunk-bench-read-ahead",
                               .gpu_uuid = GpuUuid(0).value_or(""),
                               .read_ahead_keep = absl::Milliseconds(200)});
    if (!ahead_client.ok()) return Fail("connect", ahead_client.status());
    absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> reading_ahead =
        CudaDaemonBackend::Create(ahead_client->get(), 0);
    if (!reading_ahead.ok()) {
      return Fail("CudaDaemonBackend", reading_ahead.status());
    }
    // First, while the daemon's pool is cold.
    if (int r = WorkingSet(**client, **backend, **reading_ahead,
                           working_set_gib, 3, results);
        r != 0) {
      return r;
    }
  }

  // 2 GiB segments first, while the pool is empty: the daemon's largest
  // chunks (a handful of imports and maps, not 1,024).
  {
    constexpr size_t k2GiB = size_t{2} << 30;
    const auto t0 = Clock::now();
    absl::StatusOr<uint64_t> cold = (*backend)->AllocateSegment(k2GiB);
    const auto t1 = Clock::now();
    if (!cold.ok()) return Fail("AllocateSegment (cold 2 GiB)", cold.status());
    (*backend)->FreeSegment(*cold, k2GiB);
    results["acquire_map_cold_2GiB"] = Summary({Micros(t0, t1)});
    std::vector<double> alloc_us, free_us;
    for (int i = 0; i < std::max(10, iterations / 20); ++i) {
      const auto a0 = Clock::now();
      absl::StatusOr<uint64_t> a = (*backend)->AllocateSegment(k2GiB);
      const auto a1 = Clock::now();
      if (!a.ok()) return Fail("AllocateSegment (2 GiB)", a.status());
      (*backend)->FreeSegment(*a, k2GiB);
      alloc_us.push_back(Micros(a0, a1));
      free_us.push_back(Micros(a1, Clock::now()));
    }
    results["acquire_map_2GiB"] = Summary(alloc_us);
    results["free_2GiB"] = Summary(free_us);
    if (int r = TakeApart2GiB(**client, std::max(10, iterations / 20),
                              results);
        r != 0) {
      return r;
    }
  }

  // Cold: every chunk new in the daemon.
  {
    std::vector<double> us;
    std::vector<uint64_t> held;
    const int cold = std::min(iterations, 256);
    for (int i = 0; i < cold; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<uint64_t> a = (*backend)->AllocateSegment(chunk);
      const auto t1 = Clock::now();
      if (!a.ok()) return Fail("AllocateSegment (cold)", a.status());
      us.push_back(Micros(t0, t1));
      held.push_back(*a);
    }
    for (uint64_t a : held) (*backend)->FreeSegment(a, chunk);
    results["acquire_map_cold_2MiB"] = Summary(us);
  }
  // Warm: acquire + map, free, again (the chunk comes back from the cache).
  {
    std::vector<double> alloc_us;
    std::vector<double> free_us;
    for (int i = 0; i < iterations + 50; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<uint64_t> a = (*backend)->AllocateSegment(chunk);
      const auto t1 = Clock::now();
      if (!a.ok()) return Fail("AllocateSegment", a.status());
      (*backend)->FreeSegment(*a, chunk);
      const auto t2 = Clock::now();
      if (i < 50) continue;  // warm-up
      alloc_us.push_back(Micros(t0, t1));
      free_us.push_back(Micros(t1, t2));
    }
    results["acquire_map_2MiB"] = Summary(alloc_us);
    results["free_2MiB"] = Summary(free_us);
  }
  {
    std::vector<double> us;
    for (int i = 0; i < std::max(10, iterations / 10); ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<uint64_t> a = (*backend)->AllocateSegment(32 * chunk);
      const auto t1 = Clock::now();
      if (!a.ok()) return Fail("AllocateSegment (64 MiB)", a.status());
      (*backend)->FreeSegment(*a, 32 * chunk);
      if (i > 0) us.push_back(Micros(t0, t1));
    }
    results["acquire_map_64MiB"] = Summary(us);
  }
  // The warm path taken apart, with the driver called directly.
  {
    absl::StatusOr<cuda::PrimaryContext> context =
        cuda::PrimaryContext::Open(0);
    if (!context.ok()) return Fail("context", context.status());
    Phases phases({"step_acquire_rpc_and_fd", "step_import", "step_close_fd",
                   "step_reserve", "step_map", "step_set_access"});
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<ReceivedChunks> got = (*client)->Acquire(chunk);
      const auto t1 = Clock::now();
      if (!got.ok()) return Fail("Acquire", got.status());
      absl::StatusOr<CUmemGenericAllocationHandle> handle =
          cuda::ImportFromFd(got->fds[0].get());
      const auto t2 = Clock::now();
      if (!handle.ok()) return Fail("import", handle.status());
      got->fds[0].reset();
      const auto t3 = Clock::now();
      absl::StatusOr<CUdeviceptr> va = cuda::AddressReserve(chunk);
      const auto t4 = Clock::now();
      if (!va.ok()) return Fail("reserve", va.status());
      CHECK_OK("map", cuda::MemMap(*va, chunk, *handle));
      const auto t5 = Clock::now();
      CHECK_OK("access",
               cuda::SetReadWriteAccess(*va, chunk, context->device()));
      const auto t6 = Clock::now();
      CHECK_OK("unmap", cuda::MemUnmap(*va, chunk));
      CHECK_OK("release", cuda::MemRelease(*handle));
      CHECK_OK("free", cuda::AddressFree(*va, chunk));
      CHECK_OK("Release", (*client)->Release(got->epoch, got->ids));
      phases.Add({t0, t1, t2, t3, t4, t5, t6});
    }
    phases.Report(results);

    // No daemon at all.
    const CUmemAllocationProp prop =
        cuda::DeviceMemoryProp(context->device(), false);
    std::vector<double> local;
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<CUmemGenericAllocationHandle> h =
          cuda::MemCreate(chunk, prop);
      if (!h.ok()) return Fail("cuMemCreate", h.status());
      absl::StatusOr<CUdeviceptr> va = cuda::AddressReserve(chunk);
      if (!va.ok()) return Fail("reserve", va.status());
      CHECK_OK("map", cuda::MemMap(*va, chunk, *h));
      CHECK_OK("access",
               cuda::SetReadWriteAccess(*va, chunk, context->device()));
      const auto t1 = Clock::now();
      CHECK_OK("unmap", cuda::MemUnmap(*va, chunk));
      CHECK_OK("release", cuda::MemRelease(*h));
      CHECK_OK("free", cuda::AddressFree(*va, chunk));
      local.push_back(Micros(t0, t1));
    }
    results["local_create_map_2MiB"] = Summary(local);
    {
      constexpr size_t k2GiB = size_t{2} << 30;
      const auto t0 = Clock::now();
      absl::StatusOr<CUmemGenericAllocationHandle> h =
          cuda::MemCreate(k2GiB, prop);
      if (!h.ok()) return Fail("cuMemCreate (2 GiB)", h.status());
      absl::StatusOr<CUdeviceptr> va = cuda::AddressReserve(k2GiB);
      if (!va.ok()) return Fail("reserve", va.status());
      CHECK_OK("map", cuda::MemMap(*va, k2GiB, *h));
      CHECK_OK("access",
               cuda::SetReadWriteAccess(*va, k2GiB, context->device()));
      const auto t1 = Clock::now();
      CHECK_OK("unmap", cuda::MemUnmap(*va, k2GiB));
      CHECK_OK("release", cuda::MemRelease(*h));
      CHECK_OK("free", cuda::AddressFree(*va, k2GiB));
      results["local_create_map_2GiB"] = Summary({Micros(t0, t1)});
    }

    // The driver's share of a claim, in one process: what the daemon does
    // (export the chunk to an FD, later close it) and what the client does
    // (import the FD, close it, release the imported handle at unmap).
    absl::StatusOr<CUmemGenericAllocationHandle> owned = cuda::MemCreate(
        chunk, cuda::DeviceMemoryProp(context->device(), true));
    if (!owned.ok()) return Fail("cuMemCreate", owned.status());
    Phases driver({"driver_export", "driver_import",
                   "driver_close_client_copy", "driver_close_last_copy",
                   "driver_release_imported"});
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = Clock::now();
      absl::StatusOr<int> fd = cuda::ExportToFd(*owned);
      const auto t1 = Clock::now();
      if (!fd.ok()) return Fail("export", fd.status());
      const int received = dup(*fd);  // what SCM_RIGHTS gives the client
      absl::StatusOr<CUmemGenericAllocationHandle> imported =
          cuda::ImportFromFd(received);
      const auto t2 = Clock::now();
      if (!imported.ok()) return Fail("import", imported.status());
      close(received);
      const auto t3 = Clock::now();
      close(*fd);
      const auto t4 = Clock::now();
      CHECK_OK("release", cuda::MemRelease(*imported));
      const auto t5 = Clock::now();
      driver.Add({t0, t1, t2, t3, t4, t5});
    }
    CHECK_OK("release", cuda::MemRelease(*owned));
    driver.Report(results);
  }

  absl::StatusOr<CUdevice> device = cuda::GetDevice(0);
  absl::StatusOr<std::string> name =
      device.ok() ? cuda::DeviceName(*device)
                  : absl::StatusOr<std::string>(device.status());
  absl::StatusOr<int> version = cuda::DriverVersion();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const double p50 = results["acquire_map_2MiB"]["p50_us"].get<double>();
  nlohmann::json report = {
      {"benchmark", "cuda_chunk_bench"},
      {"date", date},
      {"device", name.ok() ? *name : "unknown"},
      {"cuda_driver_api", version.ok() ? absl::StrCat(*version / 1000, ".",
                                                      *version % 1000 / 10)
                                       : "unknown"},
      {"chunk_bytes", chunk},
      {"iterations", iterations},
      {"daemon", daemon > 0 ? "allocd serve --backend cuda, started by the "
                              "benchmark (separate process)"
                            : "allocd serve at " + socket},
      {"target", {{"acquire_map_2MiB_p50_us_max", 500},
                  {"met", p50 <= 500}}},
      {"results", results}};
  const std::string text = report.dump(2);
  std::printf("%s\n", text.c_str());
  if (!out.empty()) std::ofstream(out) << text << "\n";
  backend->reset();
  client->reset();
  if (!dir.empty()) {
    // The daemon removes its sockets on SIGTERM; the directory goes after.
    kill(daemon, SIGTERM);
    waitpid(daemon, nullptr, 0);
    stop.pid = -1;
    rmdir(dir.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) { return allocd::Run(argc, argv); }
