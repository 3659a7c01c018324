// CudaChunkSource: the node pool's chunks as GPU memory. Each chunk is one
// cuMemCreate allocation of the size the pool asks (a multiple of the
// device's minimum VMM granularity, 2 MiB on an H100), exportable as a
// POSIX file descriptor. The pool keeps the
// allocation handle (ChunkMemory.handle); a claim passes the client an FD
// of the chunk with SCM_RIGHTS, which it imports with
// cuMemImportFromShareableHandle (client/cuda_daemon_backend.h).
//
// Exporting a chunk takes the driver about 0.5 ms, and closing the last FD
// of an export as long again (bench/gpu/cuda_chunk_bench, driver_* steps):
// twice a 2 MiB claim's whole budget. So the first claim of a chunk exports
// it and the source keeps that FD for every later claim (a dup, whose close
// costs nothing) — for as many chunks as RLIMIT_NOFILE allows beside the
// daemon's sockets. Chunks beyond that are exported per claim, so any
// limit still serves a whole GPU, only slower.
//
// Dropping the last ChunkMemory of a chunk (NodePool's TrimFree) releases
// the handle, and the memory goes back to the device once no client maps
// it either. A client's imported memory outlives the daemon.
//
// Thread-safe. Built only with the CUDA toolkit (ALLOCD_WITH_CUDA); the
// driver itself is loaded at run time.
#ifndef ALLOCD_SERVER_POOL_CUDA_CHUNK_SOURCE_H_
#define ALLOCD_SERVER_POOL_CUDA_CHUNK_SOURCE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pool/chunk_source.h"

namespace allocd {

class CudaChunkSource final : public ChunkSource {
 public:
  // Device `ordinal` (as CUDA numbers them under CUDA_VISIBLE_DEVICES).
  // FailedPrecondition "no CUDA driver: ..." without libcuda.so.1, and a
  // clear error for no such device or one that cannot export POSIX FDs.
  static absl::StatusOr<std::unique_ptr<CudaChunkSource>> Create(
      int ordinal = 0);
  // One source per device the driver sees, in PCI bus order (nvidia-smi's
  // numbering), whatever CUDA_DEVICE_ORDER says. FailedPrecondition when
  // there is no driver or no device; the first device's error otherwise.
  static absl::StatusOr<std::vector<std::unique_ptr<CudaChunkSource>>>
  CreateAll();
  ~CudaChunkSource() override;

  // cuMemCreate of `bytes`. ResourceExhausted when the device is out of
  // memory, or when the chunk would leave it less free than KeepFree's.
  absl::StatusOr<ChunkMemory> CreateChunk(uint64_t bytes) override;
  // From now on, no chunk is created that would leave the device less than
  // `bytes` free (cuMemGetInfo at each creation; 0, the default: no
  // check). A pool sized at start from the device's free memory still needs
  // this: the processes it serves make their CUDA contexts, load kernels
  // lazily and let libraries (cuBLAS, NCCL) allocate beside it later, and
  // a pool that took the last of the device, keeping what they free
  // cached, made a DDP rank's next cuBLAS kernel fail to launch
  // (CUBLAS_STATUS_EXECUTION_FAILED on an H200) where natively the
  // allocator's retry would have given memory back to the device.
  void KeepFree(uint64_t bytes);
  // An FD of the chunk's allocation: a copy of the FD a client gave
  // (AdoptChunk) or of its kept export, else cuMemExportToShareableHandle
  // (kept when the FD budget allows).
  absl::StatusOr<UniqueFd> OpenForClient(
      const ChunkMemory& memory) const override;
  // A client's exported allocation (the memory of a chunk it made,
  // NodePool::GiveMemory): the FD is kept (it holds the allocation) and
  // claims get copies of it, as OpenForClient's own exports. The driver
  // tells neither the size nor the maker of an allocation, so both are the
  // client's word (a client that lies only fails the maps of whoever opens
  // it); restart declarations are still taken without FDs (ProvesChunks).
  // InvalidArgument when `fd` does not import as an allocation, or
  // `offset` is not 0.
  absl::StatusOr<ChunkMemory> AdoptChunk(UniqueFd fd, uint64_t offset,
                                         uint64_t bytes) const override;
  int FdsPerChunk() const override { return 0; }
  // cuMemGetInfo's total, read at Create.
  std::optional<uint64_t> DeviceMemory() const override;
  size_t Granularity() const override { return granularity_; }
  // The device's UUID, "GPU-..." as nvidia-smi prints it.
  const std::string& uuid() const;
  // e.g. "NVIDIA H100 80GB HBM3".
  const std::string& device_name() const;
  // cuMemGetInfo's free, read at Create: what the daemon can take without
  // squeezing processes already on the GPU.
  uint64_t free_memory_at_start() const;
  // "cuda"; Describe() has the device.
  std::string Name() const override { return "cuda"; }
  // e.g. "device 0 (NVIDIA H100 80GB HBM3), driver 13.0, chunks of 2 MiB
  // and multiples".
  std::string Describe() const;

  // Chunks created and not yet released.
  uint64_t live_chunks() const;
  // Chunks whose export the source keeps.
  size_t cached_exports() const;

  struct Device;

 private:
  CudaChunkSource(std::shared_ptr<Device> device, size_t granularity);

  // Shared with every chunk: the last chunk released releases the context.
  std::shared_ptr<Device> device_;
  const size_t granularity_;
  std::atomic<uint64_t> keep_free_{0};
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CUDA_CHUNK_SOURCE_H_
