// CudaDaemonBackend: the engine's DeviceBackend in a client process, with
// GPU memory from the node daemon (`allocd serve --backend cuda`). Each
// chunk arrives as a POSIX file descriptor of a cuMemCreate allocation; the
// backend imports it (cuMemImportFromShareableHandle, then closes the FD),
// maps the chunks of a segment contiguously into one reserved virtual range
// (cuMemAddressReserve, cuMemMap) and makes it read-write for the device
// (cuMemSetAccess). Expandable segments map and unmap chunks inside their
// reservation and grow in place. Freeing synchronizes the device (as
// cudaFree does), unmaps, releases the imported handles and returns the
// chunks to the daemon, which hands them to the next process that asks.
//
// The chunk bookkeeping (by address, by daemon epoch) is DaemonBackend's;
// this class only supplies the CUDA VMM ChunkMapper and the context.
// Memory already mapped stays usable if the daemon dies.
//
// Not thread-safe, like DaemonBackend. Built only with the CUDA toolkit
// (ALLOCD_WITH_CUDA); the driver is loaded at run time.
#ifndef ALLOCD_CLIENT_CUDA_DAEMON_BACKEND_H_
#define ALLOCD_CLIENT_CUDA_DAEMON_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/daemon_backend.h"
#include "client/daemon_client.h"

namespace allocd {

// The CUDA VMM mapper on device `ordinal`'s primary context (retained for
// the mapper's life, made current on the calling thread by every call).
// FailedPrecondition "no CUDA driver: ..." without a driver.
absl::StatusOr<std::unique_ptr<ChunkMapper>> MakeCudaChunkMapper(int ordinal);

// The UUID of device `ordinal` as this process numbers it (under its
// CUDA_VISIBLE_DEVICES), "GPU-..." as nvidia-smi prints it: what
// DaemonClientOptions::gpu_uuid takes, so that the daemon serves the
// session from that GPU's pool.
absl::StatusOr<std::string> GpuUuid(int ordinal);

class CudaDaemonBackend final : public DaemonBackend {
 public:
  // `client` (connected to a daemon serving --backend cuda) outlives the
  // backend. Leaves the device's primary context current on this thread.
  // FailedPrecondition when the daemon serves the client's session from
  // another GPU than `ordinal` (its chunks would be another GPU's memory).
  static absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> Create(
      DaemonClient* client, int ordinal = 0);

  int device() const { return ordinal_; }

 private:
  CudaDaemonBackend(DaemonClient* client, std::unique_ptr<ChunkMapper> mapper,
                    int ordinal)
      : DaemonBackend(client, std::move(mapper)), ordinal_(ordinal) {}
  const int ordinal_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CUDA_DAEMON_BACKEND_H_
