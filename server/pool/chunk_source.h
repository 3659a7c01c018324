// ChunkSource: where the node pool's physical memory comes from, one chunk
// at a time, each an FD that can be passed to a client with SCM_RIGHTS:
// memfd files in sim mode, cuMemCreate + export to a POSIX FD on a GPU.
#ifndef ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_
#define ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ipc/unix_socket.h"

namespace allocd {

// One chunk: `Granularity()` bytes at `offset` of `file`, which several
// chunks may share.
struct ChunkMemory {
  std::shared_ptr<const UniqueFd> file;
  uint64_t offset = 0;
};

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // A new chunk. ResourceExhausted when the device has no more memory.
  virtual absl::StatusOr<ChunkMemory> CreateChunk() = 0;
  // Bytes per chunk (2 MiB, like the CUDA VMM granularity).
  virtual size_t Granularity() const = 0;
  virtual std::string Name() const = 0;
};

// Chunks carved from memfd_create files ("slabs" of `chunks_per_slab`
// chunks): real, shareable memory without a GPU, and one FD per slab rather
// than per chunk, so a large sim pool stays far below the FD limit. Pages
// are allocated only when a client touches them.
class MemfdChunkSource final : public ChunkSource {
 public:
  explicit MemfdChunkSource(size_t granularity = size_t{2} << 20,
                            size_t chunks_per_slab = 512)
      : granularity_(granularity), chunks_per_slab_(chunks_per_slab) {}
  absl::StatusOr<ChunkMemory> CreateChunk() override;
  size_t Granularity() const override { return granularity_; }
  std::string Name() const override { return "sim"; }

 private:
  const size_t granularity_;
  const size_t chunks_per_slab_;
  std::shared_ptr<const UniqueFd> slab_;
  size_t used_in_slab_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_
