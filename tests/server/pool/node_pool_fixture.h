// The node pool tests' fixture: a pool over a memfd source that tests can
// make fail or block, on a clock they move.
#ifndef ALLOCD_TESTS_SERVER_POOL_NODE_POOL_FIXTURE_H_
#define ALLOCD_TESTS_SERVER_POOL_NODE_POOL_FIXTURE_H_

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kChunk = 2 * kMiB;

// A memfd source that can fail after a number of chunks, or block every
// creation until released.
class TestSource : public ChunkSource {
 public:
  absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) override {
    ++calls;
    if (absl::Notification* g = gate.load(); g != nullptr) {
      if (!entered.HasBeenNotified()) entered.Notify();
      g->WaitForNotification();
    }
    if (fail_after >= 0 && created.load() >= fail_after) {
      return absl::ResourceExhaustedError("the device is out of memory");
    }
    ++created;
    return memfd.CreateChunk(bytes);
  }
  size_t Granularity() const override { return kChunk; }
  std::string Name() const override { return "test"; }
  // Proofs as the memfd source checks them, unless `proves` is false (a
  // source like CUDA's that takes declared chunks on the client's word).
  bool ProvesChunks() const override { return proves; }
  absl::StatusOr<ChunkMemory> AdoptChunk(UniqueFd fd, uint64_t offset,
                                         uint64_t bytes) const override {
    return memfd.AdoptChunk(std::move(fd), offset, bytes);
  }
  std::string Identity(const ChunkMemory& memory) const override {
    return memfd.Identity(memory);
  }

  MemfdChunkSource memfd{kChunk};
  bool proves = true;
  std::atomic<int> fail_after{-1};
  std::atomic<int> created{0};
  std::atomic<int> calls{0};
  // While set, every creation waits for it.
  std::atomic<absl::Notification*> gate{nullptr};
  absl::Notification entered;
};

class NodePoolTest : public ::testing::Test {
 protected:
  // A pool of `chunks` smallest chunks' capacity, chunks of `classes`
  // (default: the smallest only).
  std::unique_ptr<NodePool> MakePool(uint64_t chunks,
                                     std::vector<uint64_t> classes = {}) {
    return std::make_unique<NodePool>(
        &source_, NodePool::Options{.capacity = chunks * kChunk,
                                    .now = [this] { return now_; },
                                    .chunk_classes = std::move(classes)});
  }
  TestSource source_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

// Maps a claimed chunk.
inline char* Map(const ChunkFd& chunk) {
  void* p = mmap(nullptr, chunk.bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                 chunk.fd.get(), static_cast<off_t>(chunk.offset));
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char*>(p);
}

}  // namespace allocd

#endif  // ALLOCD_TESTS_SERVER_POOL_NODE_POOL_FIXTURE_H_
