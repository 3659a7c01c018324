// DeviceBackend: where the engine gets device memory from.
//
// The engine (CachingAllocator) never touches CUDA, files or sockets; it asks
// a backend for segments, as PyTorch asks cudaMalloc, and for page mappings
// inside reserved address ranges, as PyTorch's expandable segments ask the
// CUDA VMM API. Implementations: SimBackend (a capacity, no GPU), the CUDA
// VMM backend and the client's daemon-backed backend.
#ifndef ALLOCD_ALLOCATOR_DEVICE_BACKEND_H_
#define ALLOCD_ALLOCATOR_DEVICE_BACKEND_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace allocd {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // cudaMalloc: `bytes` (a multiple of 2 MiB or exactly 2 MiB) of device
  // memory at a new address. ResourceExhausted when the device has less free
  // memory than that.
  virtual absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) = 0;

  // cudaFree of a segment AllocateSegment returned.
  virtual void FreeSegment(uint64_t address, size_t bytes) = 0;

  // cuMemAddressReserve: `bytes` of address space with no memory behind it.
  virtual absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) = 0;

  // cuMemAddressFree of a range whose pages are all unmapped.
  virtual void ReleaseAddressRange(uint64_t address, size_t bytes) = 0;

  // cuMemCreate + cuMemMap of physical memory under [address, address+bytes)
  // inside a reserved range. ResourceExhausted, with nothing mapped, when
  // the device has less free memory than `bytes`.
  virtual absl::Status MapPages(uint64_t address, size_t bytes) = 0;

  // cuMemUnmap + cuMemRelease of pages MapPages mapped.
  virtual void UnmapPages(uint64_t address, size_t bytes) = 0;

  // The device's total memory (cudaMemGetInfo's total): the base of
  // set_per_process_memory_fraction and the size of expandable reservations.
  virtual size_t TotalMemory() const = 0;

  // Device memory still free for this process (cudaMemGetInfo's free), for
  // out-of-memory messages.
  virtual size_t FreeMemory() const = 0;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_DEVICE_BACKEND_H_
