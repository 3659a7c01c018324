// FullDeviceSource: a test ChunkSource whose device runs out of memory
// before the pool's capacity does, as a GPU whose processes' contexts and
// native allocations took some: CreateChunk fails (ResourceExhausted) once
// `limit` bytes of chunks live; a chunk's bytes come back when its last
// ChunkMemory goes.
#ifndef ALLOCD_TESTS_SERVER_POOL_FULL_DEVICE_SOURCE_H_
#define ALLOCD_TESTS_SERVER_POOL_FULL_DEVICE_SOURCE_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "server/pool/chunk_source.h"
#include "server/pool/memfd_chunk_source.h"

namespace allocd {

class FullDeviceSource final : public ChunkSource {
 public:
  explicit FullDeviceSource(uint64_t limit) : limit_(limit) {}
  absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) override {
    if (live_->load() + bytes > limit_) {
      return absl::ResourceExhaustedError("out of memory (the device)");
    }
    absl::StatusOr<ChunkMemory> memory = memfd_.CreateChunk(bytes);
    if (!memory.ok()) return memory;
    live_->fetch_add(bytes);
    // The chunk's memory goes back to the device when its file closes.
    auto live = live_;
    memory->file = std::shared_ptr<const UniqueFd>(
        new UniqueFd(dup(memory->file->get())),
        [live, bytes](const UniqueFd* fd) {
          live->fetch_sub(bytes);
          delete fd;
        });
    return memory;
  }
  size_t Granularity() const override { return memfd_.Granularity(); }
  std::string Name() const override { return "full-device"; }

 private:
  MemfdChunkSource memfd_;
  const uint64_t limit_;
  std::shared_ptr<std::atomic<uint64_t>> live_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace allocd

#endif  // ALLOCD_TESTS_SERVER_POOL_FULL_DEVICE_SOURCE_H_
