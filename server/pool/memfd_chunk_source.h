// MemfdChunkSource: the node pool's chunks without a GPU, for sim mode and
// CI. Each chunk is its own memfd_create() file of its size, so
// the whole FD path (SCM_RIGHTS, mmap in the client, reuse across
// processes) runs for real. Pages are allocated when first touched and go
// back to the kernel when the last FD and mapping of the chunk are gone.
#ifndef ALLOCD_SERVER_POOL_MEMFD_CHUNK_SOURCE_H_
#define ALLOCD_SERVER_POOL_MEMFD_CHUNK_SOURCE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "server/pool/chunk_source.h"

namespace allocd {

// Thread-safe (stateless). One FD per live chunk in this process: a pool of
// N GiB holds up to 512 * N FDs (all 2 MiB chunks), so CreateChunk()
// raises the soft RLIMIT_NOFILE to the hard limit (once) when it runs out,
// before giving up.
class MemfdChunkSource final : public ChunkSource {
 public:
  // `granularity`: the smallest chunk, a positive multiple of the page size.
  explicit MemfdChunkSource(size_t granularity = size_t{2} << 20);

  // A zero-filled memfd "allocd-chunk" (close-on-exec) of `bytes`, sealed
  // against resizing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): a client
  // that gets the FD can map and write the chunk but cannot truncate it
  // under the next process that gets it. Offset 0.
  // ResourceExhausted when the kernel refuses memory or FDs.
  absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) override;
  size_t Granularity() const override { return granularity_; }
  std::string Name() const override { return "sim"; }

  // A client proves a chunk with its memfd: AdoptChunk takes an FD that is
  // a memfd "allocd-chunk" of exactly `bytes` (offset 0) with this source's
  // seals; its identity is the file's device and inode. Any process can
  // make such a memfd: this proves the shape of a chunk, not that the
  // daemon made it, so which chunks may be adopted at all is decided
  // before (RestartAdoption: the daemon's own sessions file).
  bool ProvesChunks() const override { return true; }
  absl::StatusOr<ChunkMemory> AdoptChunk(UniqueFd fd, uint64_t offset,
                                         uint64_t bytes) const override;
  std::string Identity(const ChunkMemory& memory) const override;

 private:
  const size_t granularity_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_MEMFD_CHUNK_SOURCE_H_
