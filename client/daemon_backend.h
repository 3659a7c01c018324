// DaemonBackend: the engine's DeviceBackend in a client process, with
// memory from the node daemon. A segment is a run of daemon chunks mapped
// at consecutive addresses of one reserved range, the way the CUDA VMM
// backend maps cuMemCreate chunks: one Acquire (one request, one claim) for
// the segment, chunks of the daemon's larger sizes (a 2 GiB segment is two
// 1 GiB chunks), one EnableAccess over the whole range. Expandable segments
// map and unmap chunks inside their reservation, with chunks of the
// smallest size only, since the engine unmaps any page range of what it
// mapped. How chunks get into the address space is a
// ChunkMapper's business: by default the chunks are memfd files mapped with
// mmap (sim mode), so the memory is real and shared with the daemon; the
// CUDA VMM mapper is in client/cuda_daemon_backend.h.
//
// Not thread-safe: the engine calls it under its own lock.
#ifndef ALLOCD_CLIENT_DAEMON_BACKEND_H_
#define ALLOCD_CLIENT_DAEMON_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "allocator/device_backend.h"
#include "client/daemon_client.h"

namespace allocd {

// One chunk as a ChunkMapper mapped it: where, its size, and the mapper's
// handle.
struct ChunkMapping {
  uint64_t address;
  uint64_t bytes;
  uint64_t handle;
};

// Puts daemon chunks into the process's address space.
class ChunkMapper {
 public:
  virtual ~ChunkMapper() = default;
  // `bytes` of address space with nothing behind it.
  virtual absl::StatusOr<uint64_t> Reserve(size_t bytes) = 0;
  // Frees a reservation whose chunks are all unmapped.
  virtual void Free(uint64_t address, size_t bytes) = 0;
  // Maps one chunk whole, `chunk_bytes` at `offset` of `fd` (which stays
  // the caller's), at `address` inside a reservation. Returns a handle that
  // Unmap gets back.
  virtual absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes,
                                       int fd, uint64_t offset) = 0;
  // After Map of every chunk of [address, address + bytes): makes the range
  // usable.
  virtual absl::Status EnableAccess(uint64_t address, size_t bytes) {
    (void)address;
    (void)bytes;
    return absl::OkStatus();
  }
  // Unmaps `chunks`, which are every chunk mapped in [address, address +
  // bytes); the range stays reserved.
  virtual void Unmap(uint64_t address, size_t bytes,
                     absl::Span<const ChunkMapping> chunks) = 0;
};

// Sim mode's mapper: mmap of the chunks' memfd files.
std::unique_ptr<ChunkMapper> MakeMmapChunkMapper();

class DaemonBackend : public DeviceBackend {
 public:
  // `client` outlives the backend. The device's total memory is the
  // daemon's capacity. Chunks are mapped with mmap.
  explicit DaemonBackend(DaemonClient* client);
  // Chunks are mapped by `mapper`.
  DaemonBackend(DaemonClient* client, std::unique_ptr<ChunkMapper> mapper);
  // Unmaps everything and returns its chunks.
  ~DaemonBackend() override;

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override;
  void FreeSegment(uint64_t address, size_t bytes) override;
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override;
  void ReleaseAddressRange(uint64_t address, size_t bytes) override;
  absl::Status MapPages(uint64_t address, size_t bytes) override;
  void UnmapPages(uint64_t address, size_t bytes) override;
  size_t TotalMemory() const override { return total_; }
  size_t FreeMemory() const override;

  // Chunks mapped now.
  uint64_t held_bytes() const { return held_; }

 private:
  // The chunk mapped at an address, which daemon session gave it, its size
  // and the mapper's handle.
  struct MappedChunk {
    uint64_t epoch;
    uint64_t id;
    uint64_t bytes;
    uint64_t handle;
  };
  // Maps chunks of at most `max_chunk_bytes` each over [address, address +
  // bytes).
  absl::Status Map(uint64_t address, size_t bytes, uint64_t max_chunk_bytes);
  void Unmap(uint64_t address, size_t bytes, bool keep_reservation);

  DaemonClient* const client_;
  const std::unique_ptr<ChunkMapper> mapper_;
  const uint64_t total_;
  std::map<uint64_t, MappedChunk> chunks_;  // by address
  std::map<uint64_t, size_t> ranges_;       // reservations, by address
  uint64_t held_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_BACKEND_H_
