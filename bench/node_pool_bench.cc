// The node pool's chunk hand-out path, in process (no gRPC): what a segment
// acquire costs the daemon. Target (DESIGN.md): acquire <= 500 us p50.
//
//  BM_AcquireClaimRelease/N       Acquire + Claim + Release of N 2 MiB chunks
//                                 taken from the cache (the reused path).
//  BM_AcquireClaimSendMap/N       the same, and the FDs go over a socketpair
//                                 (SendMessage), are received and each chunk
//                                 is mmap()ed, touched and munmap()ed: what
//                                 the client does in sim mode.
//  BM_ClaimRoundTrip/N            the side-socket exchange across two threads:
//                                 the client sends the token, the "daemon"
//                                 thread claims and sends the FDs back, the
//                                 client maps them; Acquire/Release as above.
//
// Counters: p50_us and p99_us per iteration.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "ipc/unix_socket.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

constexpr uint64_t kChunk = uint64_t{2} << 20;
using Clock = std::chrono::steady_clock;

// Per-iteration latencies -> p50/p99 counters.
class Latencies {
 public:
  void Add(Clock::duration d) {
    us_.push_back(std::chrono::duration<double, std::micro>(d).count());
  }
  void Report(benchmark::State& state) {
    if (us_.empty()) return;
    std::sort(us_.begin(), us_.end());
    state.counters["p50_us"] = us_[us_.size() / 2];
    state.counters["p99_us"] = us_[std::min(us_.size() - 1, us_.size() * 99 / 100)];
  }

 private:
  std::vector<double> us_;
};

// A pool with one session whose cache already holds `chunks` chunks.
struct WarmPool {
  explicit WarmPool(uint64_t chunks)
      : pool(&source, NodePool::Options{.capacity = 4 * chunks * kChunk}) {
    (void)pool.AddSession(1, getuid(), getpid(), "node");
    absl::StatusOr<Grant> g = pool.Acquire(1, chunks * kChunk);
    (void)pool.Release(1, g->chunk_ids);
  }
  MemfdChunkSource source;
  NodePool pool;
};

// Maps, touches and unmaps each received chunk, as a sim client does.
void MapTouchUnmap(const ReceivedMessage& m) {
  for (const UniqueFd& fd : m.fds) {
    void* p = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd.get(), 0);
    if (p == MAP_FAILED) std::abort();
    static_cast<volatile char*>(p)[0] = 1;
    munmap(p, kChunk);
  }
}

void BM_AcquireClaimRelease(benchmark::State& state) {
  const uint64_t chunks = state.range(0);
  WarmPool warm(chunks);
  Latencies latencies;
  const pid_t pid = getpid();
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<Grant> g = warm.pool.Acquire(1, chunks * kChunk);
    absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(warm.pool, g->token, pid);
    if (!fds.ok() || g->reused_chunks != chunks) {
      state.SkipWithError("not the reused path");
      break;
    }
    fds->clear();  // the daemon closes its dup()s after sending
    (void)warm.pool.Release(1, g->chunk_ids);
    latencies.Add(Clock::now() - start);
  }
  latencies.Report(state);
}
BENCHMARK(BM_AcquireClaimRelease)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);

void BM_AcquireClaimSendMap(benchmark::State& state) {
  const uint64_t chunks = state.range(0);
  WarmPool warm(chunks);
  absl::StatusOr<std::pair<UniqueFd, UniqueFd>> pair = UnixSocketPair();
  const int daemon_end = pair->first.get(), client_end = pair->second.get();
  Latencies latencies;
  const pid_t pid = getpid();
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<Grant> g = warm.pool.Acquire(1, chunks * kChunk);
    absl::StatusOr<std::vector<ChunkFd>> fds = ClaimAll(warm.pool, g->token, pid);
    std::vector<int> raw;
    for (const ChunkFd& c : *fds) raw.push_back(c.fd.get());
    if (!SendMessage(daemon_end, "chunks", raw).ok()) std::abort();
    fds->clear();
    absl::StatusOr<ReceivedMessage> m = ReceiveMessage(client_end, 1 << 16);
    if (!m.ok() || m->fds.size() != chunks) std::abort();
    MapTouchUnmap(*m);
    m->fds.clear();
    (void)warm.pool.Release(1, g->chunk_ids);
    latencies.Add(Clock::now() - start);
  }
  latencies.Report(state);
}
BENCHMARK(BM_AcquireClaimSendMap)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);

void BM_ClaimRoundTrip(benchmark::State& state) {
  const uint64_t chunks = state.range(0);
  WarmPool warm(chunks);
  absl::StatusOr<std::pair<UniqueFd, UniqueFd>> pair = UnixSocketPair();
  const int daemon_end = pair->first.get(), client_end = pair->second.get();
  std::thread daemon([&] {
    for (;;) {
      absl::StatusOr<ReceivedMessage> token = ReceiveMessage(daemon_end, 64);
      if (!token.ok()) return;  // the client closed
      absl::StatusOr<std::vector<ChunkFd>> fds =
          ClaimAll(warm.pool, token->payload, getpid());
      std::vector<int> raw;
      for (const ChunkFd& c : *fds) raw.push_back(c.fd.get());
      if (!SendMessage(daemon_end, "chunks", raw).ok()) std::abort();
    }
  });
  Latencies latencies;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<Grant> g = warm.pool.Acquire(1, chunks * kChunk);
    if (!SendMessage(client_end, g->token).ok()) std::abort();
    absl::StatusOr<ReceivedMessage> m = ReceiveMessage(client_end, 1 << 16);
    if (!m.ok() || m->fds.size() != chunks) std::abort();
    MapTouchUnmap(*m);
    m->fds.clear();
    (void)warm.pool.Release(1, g->chunk_ids);
    latencies.Add(Clock::now() - start);
  }
  pair->second.reset();  // EOF: the daemon thread returns
  daemon.join();
  latencies.Report(state);
}
BENCHMARK(BM_ClaimRoundTrip)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace allocd

BENCHMARK_MAIN();
