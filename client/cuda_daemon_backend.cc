#include "client/cuda_daemon_backend.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_driver.h"

namespace allocd {
namespace {

class CudaChunkMapper final : public ChunkMapper {
 public:
  explicit CudaChunkMapper(cuda::PrimaryContext context)
      : context_(std::move(context)),
        prop_(cuda::DeviceMemoryProp(context_.device(), /*exportable=*/true)) {}

  absl::StatusOr<uint64_t> Reserve(size_t bytes) override {
    if (absl::Status s = context_.Bind(); !s.ok()) return s;
    absl::StatusOr<CUdeviceptr> address = cuda::AddressReserve(bytes);
    if (!address.ok()) {
      // The engine's OOM path handles running out of address space.
      if (absl::IsInvalidArgument(address.status()) ||
          absl::IsResourceExhausted(address.status())) {
        return absl::ResourceExhaustedError(address.status().message());
      }
      return address.status();
    }
    return static_cast<uint64_t>(*address);
  }

  void Free(uint64_t address, size_t bytes) override {
    (void)context_.Bind();
    (void)cuda::AddressFree(address, bytes);
  }

  absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes, int fd,
                               uint64_t offset) override {
    if (absl::Status s = context_.Bind(); !s.ok()) return s;
    if (offset != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a daemon chunk at offset ", offset,
          " of its file is not GPU memory: is the daemon serving "
          "--backend sim? CUDA clients need --backend cuda"));
    }
    absl::StatusOr<CUmemGenericAllocationHandle> handle =
        cuda::ImportFromFd(fd);
    if (!handle.ok()) {
      return absl::Status(
          handle.status().code(),
          absl::StrCat(handle.status().message(),
                       " (importing a daemon chunk: the daemon must serve "
                       "--backend cuda on this GPU)"));
    }
    if (absl::Status s = cuda::MemMap(address, chunk_bytes, *handle);
        !s.ok()) {
      (void)cuda::MemRelease(*handle);
      return s;
    }
    return static_cast<uint64_t>(*handle);
  }

  bool CanCreate() const override { return true; }

  // An exportable allocation, as the daemon's CudaChunkSource makes one.
  absl::StatusOr<uint64_t> Create(uint64_t address,
                                  size_t chunk_bytes) override {
    if (absl::Status s = context_.Bind(); !s.ok()) return s;
    absl::StatusOr<CUmemGenericAllocationHandle> handle =
        cuda::MemCreate(chunk_bytes, prop_);
    if (!handle.ok()) return handle.status();
    if (absl::Status s = cuda::MemMap(address, chunk_bytes, *handle);
        !s.ok()) {
      (void)cuda::MemRelease(*handle);
      return s;
    }
    return static_cast<uint64_t>(*handle);
  }

  absl::StatusOr<UniqueFd> Export(const ChunkMapping& chunk) override {
    if (absl::Status s = context_.Bind(); !s.ok()) return s;
    absl::StatusOr<int> fd = cuda::ExportToFd(chunk.handle);
    if (!fd.ok()) return fd.status();
    return UniqueFd(*fd);
  }

  absl::Status EnableAccess(uint64_t address, size_t bytes) override {
    // One call for every chunk of the run, as PyTorch's expandable
    // segments do.
    return cuda::SetReadWriteAccess(address, bytes, context_.device());
  }

  void Unmap(uint64_t, size_t, absl::Span<const ChunkMapping> chunks) override {
    (void)context_.Bind();
    // Like cudaFree: work still queued on the memory finishes first (the
    // chunks may be another process's next).
    (void)cuda::Synchronize();
    for (const ChunkMapping& chunk : chunks) {
      (void)cuda::MemUnmap(chunk.address, chunk.bytes);
      (void)cuda::MemRelease(chunk.handle);
    }
  }

 private:
  const cuda::PrimaryContext context_;
  const CUmemAllocationProp prop_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkMapper>> MakeCudaChunkMapper(
    int ordinal) {
  if (absl::Status s = cuda::Init(); !s.ok()) return s;
  absl::StatusOr<cuda::PrimaryContext> context =
      cuda::PrimaryContext::Open(ordinal);
  if (!context.ok()) return context.status();
  return std::unique_ptr<ChunkMapper>(
      std::make_unique<CudaChunkMapper>(std::move(*context)));
}

absl::StatusOr<std::string> GpuUuid(int ordinal) {
  if (absl::Status s = cuda::Init(); !s.ok()) return s;
  absl::StatusOr<CUdevice> device = cuda::GetDevice(ordinal);
  if (!device.ok()) return device.status();
  return cuda::DeviceUuid(*device);
}

absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> CudaDaemonBackend::Create(
    DaemonClient* client, int ordinal) {
  absl::StatusOr<std::unique_ptr<ChunkMapper>> mapper =
      MakeCudaChunkMapper(ordinal);
  if (!mapper.ok()) return mapper.status();
  // A daemon before per-GPU pools names no device: it has one.
  if (const std::string served = client->gpu_uuid(); !served.empty()) {
    absl::StatusOr<std::string> mine = GpuUuid(ordinal);
    if (!mine.ok()) return mine.status();
    if (!absl::EqualsIgnoreCase(served, *mine)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon serves this session from ", served, ", not from CUDA "
          "device ", ordinal, " (", *mine, "): connect with gpu_uuid ",
          *mine));
    }
  }
  return std::unique_ptr<CudaDaemonBackend>(
      new CudaDaemonBackend(client, std::move(*mapper), ordinal));
}

}  // namespace allocd
