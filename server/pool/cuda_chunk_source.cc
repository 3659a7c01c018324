#include "server/pool/cuda_chunk_source.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/bytes.h"
#include "allocator/cuda/cuda_driver.h"

namespace allocd {

struct CudaChunkSource::Device {
  explicit Device(cuda::PrimaryContext c) : context(std::move(c)) {}
  cuda::PrimaryContext context;
  CUmemAllocationProp prop = {};
  std::string name;
  std::string uuid;
  int driver_version = 0;
  uint64_t total_memory = 0;
  uint64_t free_memory = 0;
  // PCI domain, bus, device: the order nvidia-smi numbers GPUs in.
  std::array<int, 3> pci = {};
  std::atomic<uint64_t> live{0};
  // Exported FDs kept for reuse, by allocation; at most `export_budget`.
  absl::Mutex exports_mu;
  absl::flat_hash_map<CUmemGenericAllocationHandle, UniqueFd> exports
      ABSL_GUARDED_BY(exports_mu);
  size_t export_budget = 0;
};

namespace {

// Descriptors left free besides chunk exports: the daemon's headroom, and
// as much again for a claim's batch in flight (kMaxFdsPerMessage) with room
// to spare.
constexpr uint64_t kFdsKeptFree = 2 * kDaemonFdHeadroom;
static_assert(kFdsKeptFree >= kDaemonFdHeadroom + kMaxFdsPerMessage);

// One chunk as the pool holds it: the allocation, and the invalid FD that
// ChunkMemory.file points at (OpenForClient exports).
struct CudaChunk {
  UniqueFd no_fd;
  CUmemGenericAllocationHandle handle = 0;
  std::shared_ptr<CudaChunkSource::Device> device;

  ~CudaChunk() {
    UniqueFd exported;
    {
      absl::MutexLock lock(&device->exports_mu);
      if (auto it = device->exports.find(handle);
          it != device->exports.end()) {
        exported = std::move(it->second);
        device->exports.erase(it);
      }
    }
    exported.reset();  // the export's teardown, outside the lock
    // cuMemRelease needs the device's context on this thread, which may be
    // any of the daemon's.
    (void)device->context.Bind();
    (void)cuda::MemRelease(handle);
    device->live.fetch_sub(1);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaChunkSource>> CudaChunkSource::Create(
    int ordinal) {
  if (absl::Status s = cuda::Init(); !s.ok()) return s;
  absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) return count.status();
  if (ordinal < 0 || ordinal >= *count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device ", ordinal, ": the driver sees ", *count,
        " device(s) (CUDA_VISIBLE_DEVICES picks them)"));
  }
  absl::StatusOr<cuda::PrimaryContext> context =
      cuda::PrimaryContext::Open(ordinal);
  if (!context.ok()) return context.status();
  auto device = std::make_shared<Device>(std::move(*context));
  const CUdevice dev = device->context.device();
  absl::StatusOr<std::string> name = cuda::DeviceName(dev);
  device->name = name.ok() ? *name : "unknown";
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(dev);
  if (!uuid.ok()) return uuid.status();
  device->uuid = *std::move(uuid);
  for (auto [attribute, out] :
       {std::pair{CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, &device->pci[0]},
        std::pair{CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, &device->pci[1]},
        std::pair{CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, &device->pci[2]}}) {
    absl::StatusOr<int> value = cuda::DeviceAttribute(dev, attribute);
    *out = value.ok() ? *value : 0;
  }
  absl::StatusOr<int> version = cuda::DriverVersion();
  device->driver_version = version.ok() ? *version : 0;
  // Open made the context current on this thread.
  absl::StatusOr<cuda::MemInfo> memory = cuda::MemGetInfo();
  if (!memory.ok()) return memory.status();
  device->total_memory = memory->total;
  device->free_memory = memory->free;
  for (auto [attribute, what] :
       {std::pair{CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                  "the virtual memory management API (cuMemCreate)"},
        std::pair{CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                  "exporting memory as POSIX file descriptors"}}) {
    absl::StatusOr<int> supported = cuda::DeviceAttribute(dev, attribute);
    if (!supported.ok()) return supported.status();
    if (*supported == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA device ", ordinal, " (", device->name, ") does not support ",
          what));
    }
  }
  device->prop = cuda::DeviceMemoryProp(dev, /*exportable=*/true);
  absl::StatusOr<uint64_t> fd_limit = RaiseOpenFileLimit();
  device->export_budget =
      fd_limit.ok() && *fd_limit > kFdsKeptFree ? *fd_limit - kFdsKeptFree : 0;
  absl::StatusOr<size_t> granularity = cuda::MinimumGranularity(device->prop);
  if (!granularity.ok()) return granularity.status();
  // The engine's segments are multiples of 2 MiB; so are chunks.
  constexpr size_t k2MiB = size_t{2} << 20;
  const size_t chunk = (*granularity + k2MiB - 1) / k2MiB * k2MiB;
  return std::unique_ptr<CudaChunkSource>(
      new CudaChunkSource(std::move(device), chunk));
}

absl::StatusOr<std::vector<std::unique_ptr<CudaChunkSource>>>
CudaChunkSource::CreateAll() {
  if (absl::Status s = cuda::Init(); !s.ok()) return s;
  absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device: the driver sees none (CUDA_VISIBLE_DEVICES, the "
        "container's device plugin)");
  }
  std::vector<std::unique_ptr<CudaChunkSource>> sources;
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    absl::StatusOr<std::unique_ptr<CudaChunkSource>> source = Create(ordinal);
    if (!source.ok()) return source.status();
    sources.push_back(*std::move(source));
  }
  std::stable_sort(sources.begin(), sources.end(),
                   [](const auto& a, const auto& b) {
                     return a->device_->pci < b->device_->pci;
                   });
  return sources;
}

CudaChunkSource::CudaChunkSource(std::shared_ptr<Device> device,
                                 size_t granularity)
    : device_(std::move(device)), granularity_(granularity) {}

CudaChunkSource::~CudaChunkSource() = default;

std::optional<uint64_t> CudaChunkSource::DeviceMemory() const {
  return device_->total_memory;
}

uint64_t CudaChunkSource::free_memory_at_start() const {
  return device_->free_memory;
}

const std::string& CudaChunkSource::uuid() const { return device_->uuid; }

const std::string& CudaChunkSource::device_name() const {
  return device_->name;
}

uint64_t CudaChunkSource::live_chunks() const { return device_->live.load(); }

std::string CudaChunkSource::Describe() const {
  return absl::StrCat("CUDA device ", device_->context.ordinal(), " (",
                      device_->name, "), driver ",
                      device_->driver_version / 1000, ".",
                      device_->driver_version % 1000 / 10, ", chunks of ",
                      FormatSize(granularity_), " and multiples");
}

absl::StatusOr<ChunkMemory> CudaChunkSource::CreateChunk(uint64_t bytes) {
  if (bytes == 0 || bytes % granularity_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of ", bytes, " bytes is not a multiple of ",
                     FormatSize(granularity_)));
  }
  if (absl::Status s = device_->context.Bind(); !s.ok()) return s;
  if (const uint64_t keep = keep_free_.load(); keep > 0) {
    absl::StatusOr<cuda::MemInfo> memory = cuda::MemGetInfo();
    if (!memory.ok()) return memory.status();
    if (memory->free < bytes + keep) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device ", device_->uuid, " has ", FormatSize(memory->free),
          " free: a chunk of ", FormatSize(bytes), " would leave less than the ",
          FormatSize(keep), " kept free for its processes' own CUDA needs (--headroom)"));
    }
  }
  absl::StatusOr<CUmemGenericAllocationHandle> handle =
      cuda::MemCreate(bytes, device_->prop);
  if (!handle.ok()) return handle.status();
  auto chunk = std::make_shared<CudaChunk>();
  chunk->handle = *handle;
  chunk->device = device_;
  device_->live.fetch_add(1);
  // Owning the whole chunk.
  std::shared_ptr<const UniqueFd> file(chunk, &chunk->no_fd);
  return ChunkMemory{.file = std::move(file), .handle = *handle, .offset = 0};
}

void CudaChunkSource::KeepFree(uint64_t bytes) { keep_free_.store(bytes); }

absl::StatusOr<ChunkMemory> CudaChunkSource::AdoptChunk(UniqueFd fd,
                                                        uint64_t offset,
                                                        uint64_t bytes) const {
  if (!fd.valid()) return absl::InvalidArgumentError("no FD of its memory");
  if (offset != 0 || bytes == 0 || bytes % granularity_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk is a whole allocation of a multiple of ",
        FormatSize(granularity_), "; got ", bytes, " bytes at offset ", offset));
  }
  if (absl::Status s = device_->context.Bind(); !s.ok()) return s;
  // Imported only to check it is an allocation: the driver refuses to
  // export an imported handle again (CUDA_ERROR_INVALID_VALUE), so the FD,
  // which keeps the allocation alive by itself, is what the pool holds and
  // what its claims copy.
  absl::StatusOr<CUmemGenericAllocationHandle> handle =
      cuda::ImportFromFd(fd.get());
  if (!handle.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "its FD is not a CUDA allocation's: ", handle.status().message()));
  }
  (void)cuda::MemRelease(*handle);
  return ChunkMemory{.file = std::make_shared<const UniqueFd>(std::move(fd)),
                     .offset = 0};
}

absl::StatusOr<UniqueFd> CudaChunkSource::OpenForClient(
    const ChunkMemory& memory) const {
  if (memory.file->valid()) return DuplicateFd(memory.file->get());  // given
  {
    absl::MutexLock lock(&device_->exports_mu);
    if (auto it = device_->exports.find(memory.handle);
        it != device_->exports.end()) {
      return DuplicateFd(it->second.get());
    }
  }
  if (absl::Status s = device_->context.Bind(); !s.ok()) return s;
  absl::StatusOr<int> exported = cuda::ExportToFd(memory.handle);
  if (!exported.ok()) return exported.status();
  UniqueFd fd(*exported);
  absl::MutexLock lock(&device_->exports_mu);
  if (device_->exports.size() >= device_->export_budget) {
    return fd;  // no FD to spare: this claim's own export
  }
  // A concurrent claim of the same chunk may have kept its export first.
  auto kept = device_->exports.emplace(memory.handle, std::move(fd)).first;
  return DuplicateFd(kept->second.get());
}

size_t CudaChunkSource::cached_exports() const {
  absl::MutexLock lock(&device_->exports_mu);
  return device_->exports.size();
}

}  // namespace allocd
