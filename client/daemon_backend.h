// DaemonBackend: the engine's DeviceBackend in a client process, with
// memory from the node daemon. A segment is a run of daemon chunks mapped
// at consecutive addresses of one reserved range, the way the CUDA VMM
// backend maps cuMemCreate chunks; expandable segments map and unmap chunks
// inside their reservation. In sim mode the chunks are memfd files mapped
// with mmap, so the memory is real and shared with the daemon.
//
// Not thread-safe: the engine calls it under its own lock.
#ifndef ALLOCD_CLIENT_DAEMON_BACKEND_H_
#define ALLOCD_CLIENT_DAEMON_BACKEND_H_

#include <cstdint>
#include <map>
#include <vector>

#include "allocator/device_backend.h"
#include "client/daemon_client.h"

namespace allocd {

class DaemonBackend : public DeviceBackend {
 public:
  // `client` outlives the backend. The device's total memory is the
  // daemon's capacity.
  explicit DaemonBackend(DaemonClient* client);
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
  // The chunk mapped at an address, and which daemon session gave it.
  struct MappedChunk {
    uint64_t epoch;
    uint64_t id;
  };
  absl::Status Map(uint64_t address, size_t bytes);
  void Unmap(uint64_t address, size_t bytes, bool keep_reservation);

  DaemonClient* const client_;
  const uint64_t total_;
  const uint64_t chunk_bytes_;
  std::map<uint64_t, MappedChunk> chunks_;  // by address
  std::map<uint64_t, size_t> ranges_;       // reservations, by address
  uint64_t held_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_BACKEND_H_
