// ChunkSource: where the node pool's physical memory comes from, one chunk
// at a time, and the file descriptors that carry a chunk to a client with
// SCM_RIGHTS: memfd files in sim mode (memfd_chunk_source.h), cuMemCreate
// allocations exported as POSIX FDs on a GPU (cuda_chunk_source.h). Chunks
// come in sizes that are multiples of Granularity(), the node pool picks
// which (its size classes, node_pool.h).
#ifndef ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_
#define ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ipc/unix_socket.h"

namespace allocd {

// Descriptors the daemon needs besides those its chunk source keeps:
// sockets of clients, leases, FDs in flight to clients, files. A source that
// keeps FDs leaves this many of RLIMIT_NOFILE free.
inline constexpr uint64_t kDaemonFdHeadroom = 512;

// One chunk of physical memory: the bytes CreateChunk() was asked for, at
// `offset` of what OpenForClient() gives. The chunk lives as long as the last
// copy of `file` (the shared_ptr may own more than the FD, e.g. a CUDA
// allocation handle, through the aliasing constructor); its memory goes back to
// the device once that copy is gone and no client maps it any more.
//
// `file` is the FD the source keeps for the chunk, or an invalid one for a
// source that exports FDs on demand (CUDA: an FD per chunk held by the
// daemon would cap a GPU's pool at RLIMIT_NOFILE chunks); `handle` is then
// the source's own name for the chunk.
//
// Whoever is given an FD of a chunk can map all of its file: a source must
// not put two chunks that may go to different clients into one file.
struct ChunkMemory {
  std::shared_ptr<const UniqueFd> file;
  uint64_t handle = 0;
  uint64_t offset = 0;
};

// Thread-safe: the node pool calls CreateChunk() from several threads at
// once, without holding its own lock.
class ChunkSource {
 public:
  virtual ~ChunkSource();

  // New, never handed out memory of `bytes` bytes, a positive multiple of
  // Granularity(): one physical allocation, mapped whole by a client (CUDA
  // maps an allocation only from its offset 0). ResourceExhausted when the
  // device (or this process's FD table) has no more.
  virtual absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) = 0;
  // A new FD (close-on-exec, the caller's) that maps `memory`, to pass to
  // the client it is granted to. ResourceExhausted when this process is out
  // of FDs. The default dup()s `memory.file`.
  virtual absl::StatusOr<UniqueFd> OpenForClient(
      const ChunkMemory& memory) const;
  // FDs the source keeps open per live chunk (the daemon checks at start
  // that a full pool fits in RLIMIT_NOFILE).
  virtual int FdsPerChunk() const { return 1; }
  // The smallest chunk, of which every chunk's size is a multiple: a
  // multiple of 2 MiB (the CUDA VMM granularity of current GPUs).
  virtual size_t Granularity() const = 0;
  // The device's total memory, what `allocd serve --capacity N%` is a
  // percentage of; nullopt for a source without a device (sim).
  virtual std::optional<uint64_t> DeviceMemory() const { return std::nullopt; }
  // A short name for logs and metrics, as `allocd serve --backend` spells
  // it: "sim", "cuda".
  virtual std::string Name() const = 0;

  // After a daemon restart (NodePool::Adopt): whether a reconnecting client
  // proves each chunk it re-declares by passing an FD of it back (sim: the
  // memfd it was given). False: a declared chunk is taken on the client's
  // word, and the pool counts it without having its memory (CUDA, where
  // exporting every held chunk again would take the client about 1 ms per
  // 2 MiB chunk: 40 s for a full H100).
  virtual bool ProvesChunks() const { return false; }
  // Checks a client's proof that it maps `bytes` at `offset` of `fd` made
  // by this source, and returns that memory, kept from now on like a
  // created chunk's. Also how the pool takes the memory of a chunk its
  // client made (NodePool::GiveMemory), which the client makes as this
  // source would. InvalidArgument saying why when `fd` is not such a
  // chunk; the default (a source that takes no memory from clients):
  // Unimplemented.
  virtual absl::StatusOr<ChunkMemory> AdoptChunk(UniqueFd fd, uint64_t offset,
                                                 uint64_t bytes) const;
  // Names the physical memory behind `memory`, the same for every FD of
  // one chunk (sim: the memfd's device and inode), so that one chunk
  // declared under two ids is caught; "" when the source cannot tell.
  virtual std::string Identity(const ChunkMemory& memory) const {
    (void)memory;
    return "";
  }
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CHUNK_SOURCE_H_

