// liballocd_interpose.so: transparent managed mode. Loaded before PyTorch
// (LD_PRELOAD, or `allocd run -- python train.py`), it serves the few calls
// through which PyTorch's own caching allocator gets device memory from the
// node daemon's chunks, so the allocator itself (stats, snapshots, OOM
// errors, CUDA graph pools) stays PyTorch's:
//
// - cudaMalloc / cudaFree: a segment of N bytes is daemon chunks (of the
//   daemon's sizes, 2 MiB to 1 GiB: a 2 GiB segment is two chunks) mapped
//   into one contiguous range (CudaDaemonBackend); the chunks the daemon
//   has cached are imported, the others the daemon counts and this process
//   makes itself with cuMemCreate (cheaper than the daemon's creation,
//   export and this process's import); cudaFree synchronises the device as
//   cudaFree does, unmaps, and hands the chunks to the client's background
//   releaser (ChunkReleaser), so that no free waits for the daemon, nor
//   holds this library's lock across a round trip to it.
// - expandable segments: PyTorch resolves the driver's VMM calls with
//   cudaGetDriverEntryPoint(ByVersion) (c10/cuda/driver_api.cpp); for
//   cuMemCreate, cuMemRelease, cuMemMap and cuMemUnmap this library hands
//   out its own functions: a cuMemCreate of N bytes takes daemon chunks
//   adding up to N and returns a handle of this library's, which cuMemMap
//   maps chunk by chunk. Every other driver call is the driver's.
// - cudaMemGetInfo: what the daemon can still give this process.
// - CUDA IPC (torch.multiprocessing): PyTorch sends a CUDA tensor as
//   cudaIpcGetMemHandle of its segment's base, and the receiver maps it with
//   cudaIpcOpenMemHandle (c10/cuda/CUDACachingAllocator.cpp shareIpcHandle,
//   getIpcDevPtr). The driver refuses VMM memory there, so for a segment
//   this library mapped the handle is its own (IpcHandle: a magic, the
//   daemon's share token of the segment's chunks, the size): the receiving
//   process, with this library loaded too, opens the token with the daemon
//   and maps the same chunks, which the daemon keeps until the owner freed
//   them and every receiver closed them (cudaIpcCloseMemHandle). Any other
//   handle or pointer is the runtime's. Either way the process now shares
//   CUDA memory, which its sessions report (JobFeatures.cuda_ipc): the
//   daemon then never pushes it a config its consumers could not open.
//
// When the daemon cannot give memory the call fails as CUDA would
// (cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY), so PyTorch runs
// its own retry and raises torch.OutOfMemoryError. Without a daemon the
// process runs natively, with one warning.
//
// Configuration: the environment (client/client_env.h), read when PyTorch
// first asks a device for memory.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "allocator/cuda/cuda_driver.h"
#include "client/capi/allocd_client.h"
#include "client/capi/client_json.h"
#include "client/client_env.h"
#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"

#define ALLOCD_EXPORT extern "C" __attribute__((visibility("default")))

namespace allocd {
namespace {

bool Verbose() {
  static const bool verbose = [] {
    const char* v = std::getenv(env::kInterposeVerbose);
    return v != nullptr && v[0] == '1';
  }();
  return verbose;
}

// The CUDA runtime PyTorch loaded (libcudart.so.N), found among the loaded
// objects: when this library was loaded with dlopen(RTLD_GLOBAL) by
// `import allocd` rather than LD_PRELOAD, the runtime came later as a
// dependency of PyTorch's libraries and RTLD_NEXT does not see it.
void* LoadedCudaRuntime() {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (std::strstr(info->dlpi_name, "/libcudart.so") == nullptr) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &path);
  return path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY);
}

// The runtime's own `name`: the next definition after this library's.
template <typename Fn>
Fn Next(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == nullptr) {
    static void* const runtime = LoadedCudaRuntime();
    if (runtime != nullptr) symbol = dlsym(runtime, name);
  }
  if (symbol == nullptr) {
    std::fprintf(stderr,
                 "allocd interpose: the CUDA runtime's %s was not found: "
                 "is libcudart loaded?\n",
                 name);
  }
  return reinterpret_cast<Fn>(symbol);
}

using CudaMallocFn = cudaError_t (*)(void**, size_t);
using CudaFreeFn = cudaError_t (*)(void*);
using CudaMemGetInfoFn = cudaError_t (*)(size_t*, size_t*);
using CudaGetDeviceFn = cudaError_t (*)(int*);
using CudaIpcGetMemHandleFn = cudaError_t (*)(cudaIpcMemHandle_t*, void*);
using CudaIpcOpenMemHandleFn = cudaError_t (*)(void**, cudaIpcMemHandle_t,
                                               unsigned int);
using CudaIpcCloseMemHandleFn = cudaError_t (*)(void*);
using EntryPointFn = cudaError_t (*)(const char*, void**, unsigned long long,
                                     cudaDriverEntryPointQueryResult*);
using EntryPointByVersionFn = cudaError_t (*)(const char*, void**,
                                              unsigned int, unsigned long long,
                                              cudaDriverEntryPointQueryResult*);
using CuMemCreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                   const CUmemAllocationProp*,
                                   unsigned long long);
using CuMemReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
using CuMemMapFn = CUresult (*)(CUdeviceptr, size_t, size_t,
                                CUmemGenericAllocationHandle,
                                unsigned long long);
using CuMemUnmapFn = CUresult (*)(CUdeviceptr, size_t);

// The driver's own VMM functions, as cudaGetDriverEntryPoint gave them.
struct DriverVmm {
  CuMemCreateFn create = nullptr;
  CuMemReleaseFn release = nullptr;
  CuMemMapFn map = nullptr;
  CuMemUnmapFn unmap = nullptr;
};

// Handles this library makes up for cuMemCreate: the top bit is never set in
// the driver's (they are addresses of its objects).
constexpr CUmemGenericAllocationHandle kOurHandleBit = uint64_t{1} << 63;

// One cuMemCreate served from daemon chunks: chunks[i] (imported) is
// sizes[i] bytes; they are mapped in order.
struct VmmAllocation {
  uint64_t epoch = 0;
  std::vector<uint64_t> ids;
  std::vector<CUmemGenericAllocationHandle> chunks;
  std::vector<uint64_t> sizes;
  uint64_t bytes = 0;
};

// What cudaIpcGetMemHandle gives for a segment this library mapped, in the
// 64 bytes of a cudaIpcMemHandle_t (the rest zero).
struct IpcHandle {
  char magic[8];
  // NodePool's share token: 32 hex digits.
  char token[32];
  uint64_t bytes;
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));
constexpr char kIpcMagic[8] = {'a', 'l', 'l', 'o', 'c', 'd', 'I', '1'};

// A device's connection to the daemon.
struct DeviceSession {
  std::unique_ptr<DaemonClient> client;
  std::unique_ptr<CudaDaemonBackend> backend;
  std::map<uint64_t, size_t> segments;  // cudaMalloc'd here: address, bytes
  // Share tokens of segments cudaIpcGetMemHandle was asked for, by address.
  std::map<uint64_t, std::string> shares;
  uint64_t vmm_bytes = 0;               // held through cuMemCreate
  // The session as liballocd_client's C functions see it (Python's control
  // thread); made on first request.
  allocd_client* c_handle = nullptr;
};

class Interposer {
 public:
  static Interposer& Get() {
    static Interposer* const instance = new Interposer();  // never destroyed:
    return *instance;  // CUDA frees memory at exit after static destructors
  }

  cudaError_t Malloc(void** ptr, size_t bytes) {
    DeviceSession* session = SessionForCurrentDevice();
    if (session == nullptr) return real_malloc_(ptr, bytes);
    if (bytes == 0) {
      *ptr = nullptr;
      return cudaSuccess;
    }
    absl::MutexLock lock(&mu_);
    const size_t rounded = RoundUp(bytes, session->client->chunk_bytes());
    // A pre-warm mapping a segment of this size off the lock maps it for
    // this request: waiting for it (mu_ released) costs less than mapping
    // another beside it, and asks the daemon for nothing.
    const CudaDaemonBackend& backend = *session->backend;
    const auto prewarm_landed = [&backend, rounded] {
      return !backend.MappingPrewarmed(rounded);
    };
    mu_.Await(absl::Condition(&prewarm_landed));
    absl::StatusOr<uint64_t> address =
        session->backend->AllocateSegment(rounded);
    if (!address.ok()) {
      Log("cudaMalloc(%zu) refused: %s", bytes,
          std::string(address.status().message()).c_str());
      return cudaErrorMemoryAllocation;
    }
    session->segments[*address] = rounded;
    *ptr = reinterpret_cast<void*>(*address);
    Log("cudaMalloc(%zu) = %p from the daemon", bytes, *ptr);
    return cudaSuccess;
  }

  cudaError_t Free(void* ptr) {
    const uint64_t address = reinterpret_cast<uint64_t>(ptr);
    {
      absl::MutexLock lock(&mu_);
      for (auto& [device, session] : sessions_) {
        if (session == nullptr) continue;  // a device that runs natively
        auto it = session->segments.find(address);
        if (it == session->segments.end()) continue;
        // FreeSegment synchronises the device first, as cudaFree does.
        session->backend->FreeSegment(address, it->second);
        session->segments.erase(it);
        session->shares.erase(address);
        Log("cudaFree(%p) back to the daemon", ptr);
        return cudaSuccess;
      }
    }
    return real_free_(ptr);
  }

  cudaError_t MemGetInfo(size_t* free, size_t* total) {
    cudaError_t result = real_mem_get_info_(free, total);
    DeviceSession* session = SessionForCurrentDevice();
    if (result != cudaSuccess || session == nullptr) return result;
    absl::MutexLock lock(&mu_);
    const uint64_t capacity = session->backend->TotalMemory();
    const uint64_t held = session->backend->held_bytes() + session->vmm_bytes;
    *total = capacity;
    *free = std::min<size_t>(*free, capacity > held ? capacity - held : 0);
    return cudaSuccess;
  }

  // cuMemCreate from daemon chunks when a session serves the device.
  CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                     const CUmemAllocationProp* prop,
                     unsigned long long flags) {
    DeviceSession* session =
        prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
            ? SessionFor(prop->location.id)
            : nullptr;
    if (session == nullptr) return driver_.create(handle, bytes, prop, flags);
    absl::MutexLock lock(&mu_);
    MapPathCounters& counters = session->client->map_path();
    absl::StatusOr<ReceivedChunks> chunks;
    {
      NanosInto timed(counters.acquire_ns);
      chunks = session->client->Acquire(bytes);
    }
    if (!chunks.ok()) {
      Log("cuMemCreate(%zu) refused: %s", bytes,
          std::string(chunks.status().message()).c_str());
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    VmmAllocation allocation{.epoch = chunks->epoch,
                             .ids = chunks->ids,
                             .sizes = chunks->sizes,
                             .bytes = chunks->bytes()};
    NanosInto timed(counters.map_ns);
    for (const UniqueFd& fd : chunks->fds) {
      absl::StatusOr<CUmemGenericAllocationHandle> imported =
          cuda::ImportFromFd(fd.get());
      if (!imported.ok()) {
        Log("cuMemCreate: import failed: %s",
            std::string(imported.status().message()).c_str());
        for (CUmemGenericAllocationHandle h : allocation.chunks) {
          (void)cuda::MemRelease(h);
        }
        session->client->ReleaseSoon(allocation.epoch, allocation.ids);
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
      allocation.chunks.push_back(*imported);
      counters.chunks_mapped.fetch_add(1, std::memory_order_relaxed);
    }
    session->vmm_bytes += allocation.bytes;
    const CUmemGenericAllocationHandle ours = kOurHandleBit | next_handle_++;
    vmm_[ours] = {session, std::move(allocation)};
    *handle = ours;
    Log("cuMemCreate(%zu) = %llx from the daemon", bytes,
        static_cast<unsigned long long>(ours));
    return CUDA_SUCCESS;
  }

  CUresult MemRelease(CUmemGenericAllocationHandle handle) {
    if ((handle & kOurHandleBit) == 0) return driver_.release(handle);
    absl::MutexLock lock(&mu_);
    auto it = vmm_.find(handle);
    if (it == vmm_.end()) return CUDA_ERROR_INVALID_VALUE;
    auto& [session, allocation] = it->second;
    for (CUmemGenericAllocationHandle h : allocation.chunks) {
      (void)cuda::MemRelease(h);
    }
    session->client->ReleaseSoon(allocation.epoch, allocation.ids);
    session->vmm_bytes -= allocation.bytes;
    vmm_.erase(it);
    return CUDA_SUCCESS;
  }

  CUresult MemMap(CUdeviceptr address, size_t bytes, size_t offset,
                  CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    if ((handle & kOurHandleBit) == 0) {
      return driver_.map(address, bytes, offset, handle, flags);
    }
    absl::MutexLock lock(&mu_);
    auto it = vmm_.find(handle);
    if (it == vmm_.end()) return CUDA_ERROR_INVALID_VALUE;
    const VmmAllocation& allocation = it->second.second;
    if (offset != 0 || bytes != allocation.bytes) {
      return CUDA_ERROR_NOT_SUPPORTED;  // PyTorch maps whole handles
    }
    MapPathCounters& counters = it->second.first->client->map_path();
    NanosInto timed(counters.map_ns);
    CUdeviceptr at = address;
    for (size_t i = 0; i < allocation.chunks.size(); ++i) {
      const CUresult r =
          driver_.map(at, allocation.sizes[i], 0, allocation.chunks[i], 0);
      if (r != CUDA_SUCCESS) {
        UnmapChunks(address, allocation, i);
        return r;
      }
      at += allocation.sizes[i];
    }
    mapped_[address] = handle;
    counters.segments_mapped.fetch_add(1, std::memory_order_relaxed);
    return CUDA_SUCCESS;
  }

  CUresult MemUnmap(CUdeviceptr address, size_t bytes) {
    absl::MutexLock lock(&mu_);
    // PyTorch unmaps a run of handles at once: unmap chunk by chunk what is
    // ours, the rest as the driver would.
    CUresult result = CUDA_SUCCESS;
    CUdeviceptr at = address;
    const CUdeviceptr end = address + bytes;
    while (at < end) {
      auto it = mapped_.find(at);
      if (it == mapped_.end()) {
        // Not ours: the driver's mapping up to the next one of ours.
        auto next = mapped_.lower_bound(at);
        const CUdeviceptr stop =
            next == mapped_.end() ? end : std::min<CUdeviceptr>(end, next->first);
        const CUresult r = driver_.unmap(at, stop - at);
        if (r != CUDA_SUCCESS) result = r;
        at = stop;
        continue;
      }
      const VmmAllocation& allocation = vmm_.at(it->second).second;
      const CUresult r = UnmapChunks(at, allocation, allocation.chunks.size());
      if (r != CUDA_SUCCESS) result = r;
      at += allocation.bytes;
      mapped_.erase(it);
    }
    return result;
  }

  cudaError_t IpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
    const uint64_t address = reinterpret_cast<uint64_t>(ptr);
    {
      absl::MutexLock lock(&mu_);
      // The job shares CUDA memory with another process: its daemon must
      // know before it pushes a config its consumers could not open.
      v1::JobFeatures shares;
      shares.set_cuda_ipc(true);
      for (auto& [device, session] : sessions_) {
        if (session != nullptr) session->client->PublishFeatures(shares);
      }
      for (auto& [device, session] : sessions_) {
        if (session == nullptr || !session->segments.contains(address)) {
          continue;
        }
        auto token = session->shares.find(address);
        if (token == session->shares.end()) {
          absl::StatusOr<std::string> shared =
              session->backend->ShareSegment(address);
          if (!shared.ok() || shared->size() != sizeof(IpcHandle::token)) {
            Log("cudaIpcGetMemHandle(%p) refused: %s", ptr,
                shared.ok() ? "malformed share token"
                            : std::string(shared.status().message()).c_str());
            return cudaErrorMemoryAllocation;
          }
          token = session->shares.emplace(address, *std::move(shared)).first;
        }
        IpcHandle ours{.bytes = session->segments.at(address)};
        std::memcpy(ours.magic, kIpcMagic, sizeof ours.magic);
        std::memcpy(ours.token, token->second.data(), sizeof ours.token);
        std::memset(handle, 0, sizeof *handle);
        std::memcpy(handle, &ours, sizeof ours);
        Log("cudaIpcGetMemHandle(%p): shared by the daemon", ptr);
        return cudaSuccess;
      }
    }
    return real_ipc_get_(handle, ptr);
  }

  cudaError_t IpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle,
                               unsigned int flags) {
    IpcHandle theirs;
    std::memcpy(&theirs, &handle, sizeof theirs);
    if (std::memcmp(theirs.magic, kIpcMagic, sizeof kIpcMagic) != 0) {
      return real_ipc_open_(ptr, handle, flags);
    }
    DeviceSession* session = SessionForCurrentDevice();
    if (session == nullptr) {
      std::fprintf(
          stderr,
          "allocd: a CUDA IPC handle of memory from the allocd "
          "daemon cannot be opened without a connection to it: run "
          "this process under `allocd run` (or allocd.enable()) too\n");
      return cudaErrorInvalidResourceHandle;
    }
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::pair<uint64_t, size_t>> opened =
        session->backend->OpenShared(
            std::string(theirs.token, sizeof theirs.token));
    if (!opened.ok()) {
      Log("cudaIpcOpenMemHandle refused: %s",
          std::string(opened.status().message()).c_str());
      return absl::IsNotFound(opened.status()) ? cudaErrorInvalidResourceHandle
                                               : cudaErrorMemoryAllocation;
    }
    *ptr = reinterpret_cast<void*>(opened->first);
    Log("cudaIpcOpenMemHandle = %p (%zu bytes) from the daemon", *ptr,
        opened->second);
    return cudaSuccess;
  }

  cudaError_t IpcCloseMemHandle(void* ptr) {
    {
      absl::MutexLock lock(&mu_);
      for (auto& [device, session] : sessions_) {
        if (session != nullptr &&
            session->backend->CloseShared(reinterpret_cast<uint64_t>(ptr))) {
          Log("cudaIpcCloseMemHandle(%p) back to the daemon", ptr);
          return cudaSuccess;
        }
      }
    }
    return real_ipc_close_(ptr);
  }

  // The C handle on `device`'s session, connecting it if needed; nullptr
  // when the device runs natively.
  // Blocks until the process's first daemon session is connected (PyTorch
  // first asked for memory on a device the daemon serves); its device.
  int WaitForFirstSession() {
    first_session_.WaitForNotification();
    return first_device_;
  }

  // allocd_interpose_prewarm. Not under mu_: the ask may wait for other
  // sessions to give memory back, and the job's cudaMalloc and cudaFree
  // must not wait for it.
  int Prewarm(int device, uint64_t bytes) {
    DeviceSession* session = SessionFor(device);
    if (session == nullptr) return -1;
    const absl::Status parked = session->backend->Prewarm(
        RoundUp(bytes, session->client->chunk_bytes()));
    if (!parked.ok()) {
      Log("pre-warm of %llu bytes refused: %s",
          static_cast<unsigned long long>(bytes),
          std::string(parked.message()).c_str());
      return 1;
    }
    return 0;
  }

  // The exports below that map, unmap or keep segments (the pre-warm's and
  // the spares'): `call(session)` for `device`'s daemon session under mu_,
  // as a cudaMalloc's or cudaFree's; -1 when no session serves `device`.
  template <typename Call>
  int64_t UnderLockFor(int device, Call call) {
    DeviceSession* session = SessionFor(device);
    if (session == nullptr) return -1;
    absl::MutexLock lock(&mu_);
    return call(*session);
  }

  // allocd_interpose_prewarm_map. The mapping itself runs with mu_
  // released (DaemonBackend::MapPrewarmed).
  int64_t MapPrewarmed(int device, uint64_t bytes) {
    return UnderLockFor(device, [&](DeviceSession& session) -> int64_t {
      mu_.AssertHeld();
      absl::StatusOr<bool> mapped = session.backend->MapPrewarmed(
          RoundUp(bytes, session.client->chunk_bytes()), mu_);
      if (!mapped.ok()) {
        Log("pre-warm of %llu bytes: mapping it failed: %s",
            static_cast<unsigned long long>(bytes),
            std::string(mapped.status().message()).c_str());
        return 3;
      }
      return *mapped ? 0 : 2;
    });
  }

  // allocd_interpose_prewarm_unused: how many segments went back.
  int64_t FreeUnusedPrewarmed(int device) {
    return TakeAndUnmap(device, [](CudaDaemonBackend& backend) {
             return backend.TakeUnusedPrewarmed();
           }).segments;
  }

  // allocd_interpose_keep_freed.
  int64_t KeepFreed(int device, bool on) {
    return UnderLockFor(device, [on](DeviceSession& session) -> int64_t {
      session.backend->KeepFreedSegments(on);
      return 0;
    });
  }

  // allocd_interpose_release_spares: the bytes given back.
  int64_t ReleaseSpares(int device, uint64_t bytes) {
    return TakeAndUnmap(device, [bytes](CudaDaemonBackend& backend) {
             return backend.TakeSpares(bytes);
           }).bytes;
  }

  // allocd_interpose_release_old_spares: the bytes given back.
  int64_t ReleaseOldSpares(int device, uint32_t keep_ms) {
    return TakeAndUnmap(device, [keep_ms](CudaDaemonBackend& backend) {
             return backend.TakeSparesOlderThan(absl::Milliseconds(keep_ms));
           }).bytes;
  }

  // What TakeAndUnmap gave back: segments and bytes; -1 when no daemon
  // session serves the device.
  struct GivenBack {
    int64_t segments = -1;
    int64_t bytes = -1;
  };

  // Takes spares with `take` under the lock, and unmaps them after it: a
  // reclaim's give-back runs on the advisor's thread, and the job's
  // cudaMalloc on its own thread (the first after the reclaim's
  // empty_cache() always comes here) waited for the unmaps of tens of GiB
  // under the lock. The session outlives the process's calls.
  template <typename Take>
  GivenBack TakeAndUnmap(int device, Take take) {
    DeviceSession* session = SessionFor(device);
    if (session == nullptr) return {};
    CudaDaemonBackend::TakenSpares taken;
    {
      absl::MutexLock lock(&mu_);
      taken = take(*session->backend);
    }
    const auto segments = static_cast<int64_t>(taken.size());
    return {.segments = segments,
            .bytes = static_cast<int64_t>(session->backend->UnmapTaken(std::move(taken)))};
  }

  allocd_client* ControlHandle(int device) {
    DeviceSession* session = SessionFor(device);
    if (session == nullptr) return nullptr;
    absl::MutexLock lock(&mu_);
    if (session->c_handle == nullptr) {
      session->c_handle = BorrowClient(session->client.get());
    }
    return session->c_handle;
  }

  // What cudaGetDriverEntryPoint* hands out for `symbol`: ours for the VMM
  // calls we serve (remembering the driver's), else the driver's.
  void SubstituteEntryPoint(const char* symbol, void** fn);

  CudaGetDeviceFn real_get_device_ = Next<CudaGetDeviceFn>("cudaGetDevice");
  EntryPointFn real_entry_point_ =
      Next<EntryPointFn>("cudaGetDriverEntryPoint");
  EntryPointByVersionFn real_entry_point_by_version_ =
      Next<EntryPointByVersionFn>("cudaGetDriverEntryPointByVersion");

 private:
  Interposer() = default;

  // Unmaps the first `count` chunks of `allocation`, mapped at `address`;
  // the last error, if any.
  CUresult UnmapChunks(CUdeviceptr address, const VmmAllocation& allocation,
                       size_t count) {
    CUresult result = CUDA_SUCCESS;
    for (size_t i = 0; i < count; ++i) {
      const CUresult r = driver_.unmap(address, allocation.sizes[i]);
      if (r != CUDA_SUCCESS) result = r;
      address += allocation.sizes[i];
    }
    return result;
  }

  static size_t RoundUp(size_t bytes, size_t unit) {
    return (bytes + unit - 1) / unit * unit;
  }

  template <typename... Args>
  static void Log(const char* format, Args... args) {
    if (!Verbose()) return;
    std::fprintf(stderr, "allocd interpose: ");
    std::fprintf(stderr, format, args...);
    std::fputc('\n', stderr);
  }

  DeviceSession* SessionForCurrentDevice() {
    int device = 0;
    if (real_get_device_ == nullptr || real_get_device_(&device) != cudaSuccess) {
      return nullptr;
    }
    return SessionFor(device);
  }

  // The device's session, connecting on first use; nullptr when the process
  // runs natively on it (no daemon: warned once).
  DeviceSession* SessionFor(int device) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(device);
    if (it != sessions_.end()) return it->second.get();
    auto session = std::make_unique<DeviceSession>();
    absl::Status status = Connect(device, *session);
    if (!status.ok()) {
      std::fprintf(stderr,
                   "allocd: not connected, device %d runs on PyTorch's own "
                   "memory: %s\n",
                   device, std::string(status.message()).c_str());
      session.reset();
    } else if (!first_session_.HasBeenNotified()) {
      first_device_ = device;
      first_session_.Notify();
    }
    return (sessions_[device] = std::move(session)).get();
  }

  static absl::Status Connect(int device, DeviceSession& session) {
    absl::StatusOr<ClientEnv> env = ClientEnv::FromEnvironment();
    if (!env.ok()) return env.status();
    absl::StatusOr<v1::AutotunePreferences> autotune =
        ParseAutotunePreferences(env->autotune);
    if (!autotune.ok()) return autotune.status();
    if (env->autostart) autotune->set_marks_steps(true);
    // The daemon matches the GPU by UUID: `device` is only this process's
    // number for it.
    absl::StatusOr<std::string> uuid = GpuUuid(device);
    if (!uuid.ok()) return uuid.status();
    absl::StatusOr<std::unique_ptr<DaemonClient>> client =
        DaemonClient::Connect(
            {.socket = env->socket,
             .job = env->job,
             .device = device,
             .gpu_uuid = *std::move(uuid),
             .initial_config = env->initial_config,
             .started_on_learned = env->started_on_learned,
             .description = "liballocd_interpose (PyTorch's allocator)",
             .autotune = *std::move(autotune),
             .features = StartFeatures(),
             .rank = RankOf(*env),
             .read_ahead_keep = env->read_ahead,
             .release_in_background = true});
    if (!client.ok()) return client.status();
    absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> backend =
        CudaDaemonBackend::Create(client->get(), device);
    if (!backend.ok()) return backend.status();
    (*backend)->set_client_creates(env->client_creates);
    (*backend)->HandOver(env->handover);
    session.client = *std::move(client);
    session.backend = *std::move(backend);
    return absl::OkStatus();
  }

  CudaMallocFn real_malloc_ = Next<CudaMallocFn>("cudaMalloc");
  CudaFreeFn real_free_ = Next<CudaFreeFn>("cudaFree");
  CudaMemGetInfoFn real_mem_get_info_ =
      Next<CudaMemGetInfoFn>("cudaMemGetInfo");
  CudaIpcGetMemHandleFn real_ipc_get_ =
      Next<CudaIpcGetMemHandleFn>("cudaIpcGetMemHandle");
  CudaIpcOpenMemHandleFn real_ipc_open_ =
      Next<CudaIpcOpenMemHandleFn>("cudaIpcOpenMemHandle");
  CudaIpcCloseMemHandleFn real_ipc_close_ =
      Next<CudaIpcCloseMemHandleFn>("cudaIpcCloseMemHandle");

 public:
  DriverVmm driver_;

 private:
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<DeviceSession>> sessions_ ABSL_GUARDED_BY(mu_);
  // Set once, before first_session_ is notified: read after waiting for it.
  int first_device_ = -1;
  absl::Notification first_session_;
  std::map<CUmemGenericAllocationHandle,
           std::pair<DeviceSession*, VmmAllocation>>
      vmm_ ABSL_GUARDED_BY(mu_);
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> mapped_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

CUresult OurMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                      const CUmemAllocationProp* prop,
                      unsigned long long flags) {
  return Interposer::Get().MemCreate(handle, bytes, prop, flags);
}
CUresult OurMemRelease(CUmemGenericAllocationHandle handle) {
  return Interposer::Get().MemRelease(handle);
}
CUresult OurMemMap(CUdeviceptr address, size_t bytes, size_t offset,
                   CUmemGenericAllocationHandle handle,
                   unsigned long long flags) {
  return Interposer::Get().MemMap(address, bytes, offset, handle, flags);
}
CUresult OurMemUnmap(CUdeviceptr address, size_t bytes) {
  return Interposer::Get().MemUnmap(address, bytes);
}

void Interposer::SubstituteEntryPoint(const char* symbol, void** fn) {
  struct Substitute {
    const char* name;
    void** driver;
    void* ours;
  };
  const Substitute substitutes[] = {
      {"cuMemCreate", reinterpret_cast<void**>(&driver_.create),
       reinterpret_cast<void*>(&OurMemCreate)},
      {"cuMemRelease", reinterpret_cast<void**>(&driver_.release),
       reinterpret_cast<void*>(&OurMemRelease)},
      {"cuMemMap", reinterpret_cast<void**>(&driver_.map),
       reinterpret_cast<void*>(&OurMemMap)},
      {"cuMemUnmap", reinterpret_cast<void**>(&driver_.unmap),
       reinterpret_cast<void*>(&OurMemUnmap)},
  };
  for (const Substitute& s : substitutes) {
    if (std::strcmp(symbol, s.name) != 0 || *fn == nullptr) continue;
    *s.driver = *fn;
    *fn = s.ours;
    Log("%s: served by allocd", symbol);
  }
}

}  // namespace
}  // namespace allocd

using allocd::Interposer;

// For the Python package: the daemon session serving `device` (connected
// now if it was not yet), to drive with liballocd_client's C functions
// (configs, reclaims, telemetry). NULL when the device runs natively;
// allocd_disconnect() frees the handle only.
ALLOCD_EXPORT allocd_client* allocd_interpose_session(int device) {
  return Interposer::Get().ControlHandle(device);
}

// For the Python package in a job started by `allocd run` (allocd/
// _autostart.py): blocks until the first daemon session of this process is
// connected, which is when PyTorch first asks for memory on a device the
// daemon serves, and returns that device (as this process numbers it): the
// one whose allocator the package then tunes. A script that picks its GPU
// (torch.cuda.set_device) after CUDA starts is tuned on the GPU it uses.
ALLOCD_EXPORT int allocd_interpose_wait_session() {
  return Interposer::Get().WaitForFirstSession();
}

// For the Python package (allocd/_prewarm.py): asks the daemon now for the
// chunks of a cudaMalloc of `bytes` on `device` that the caller foresees (a
// recurring peak), waiting while the daemon asks other sessions to give
// back what they cache, and parks them for that cudaMalloc, which then
// asks the daemon nothing (come meanwhile, it waits for them); unused,
// they go back after the read-ahead's keep ($ALLOCD_READ_AHEAD_MS) or when
// the daemon asks for memory back. Makes no CUDA call. 0: parked; 1: the
// daemon could not give them (nothing parked, the reason in the verbose
// log), or reading ahead is off; -1: no daemon session serves `device`.
ALLOCD_EXPORT int allocd_interpose_prewarm(int device, uint64_t bytes) {
  return Interposer::Get().Prewarm(device, bytes);
}

// Maps what allocd_interpose_prewarm parked, on the caller's thread, for
// the next cudaMalloc of that size, which then takes it at the cost of a
// lookup: under PyTorch's allocator lock, which every allocation of the
// job waits for, nothing is mapped, and the job's cudaMalloc and cudaFree
// of other sizes do not wait for the mapping (one of that size waits for
// it rather than ask the daemon again). CUDA calls: not while a CUDA graph is
// captured in global mode, which they would invalidate. 0: mapped
// (allocd_interpose_prewarm_unused gives it back if no cudaMalloc took
// it); 2: the cudaMalloc it foresaw took the grant meanwhile; 3: mapping
// failed (the grant went back); -1: no daemon session serves `device`.
ALLOCD_EXPORT int allocd_interpose_prewarm_map(int device, uint64_t bytes) {
  return static_cast<int>(Interposer::Get().MapPrewarmed(device, bytes));
}

// Gives back what allocd_interpose_prewarm_map mapped on `device` that no
// cudaMalloc took; how many segments (-1: no daemon session serves it).
ALLOCD_EXPORT int allocd_interpose_prewarm_unused(int device) {
  return static_cast<int>(Interposer::Get().FreeUnusedPrewarmed(device));
}

// A reclaim's partial give-back (client/spare_segments.h). While `on` is
// nonzero, a cudaFree on `device` keeps its segment mapped as a spare for
// the next cudaMalloc of its size, instead of giving it back; the caller
// brackets torch.cuda.empty_cache() with it, then gives back what the
// reclaim asked for with allocd_interpose_release_spares. 0, or -1 when no
// daemon session serves `device`.
ALLOCD_EXPORT int allocd_interpose_keep_freed(int device, int on) {
  return static_cast<int>(Interposer::Get().KeepFreed(device, on != 0));
}

// Gives back spare segments of `device` (kept, or pre-warmed and not
// taken), largest first, until `bytes` are given (every one when 0): the
// bytes given, or -1 when no daemon session serves `device`. CUDA calls:
// not while a CUDA graph is captured in global mode.
ALLOCD_EXPORT int64_t allocd_interpose_release_spares(int device,
                                                      uint64_t bytes) {
  return Interposer::Get().ReleaseSpares(device, bytes);
}

// Gives back the spare segments of `device` that no cudaMalloc took within
// `keep_ms` of becoming spare: the bytes given, or -1 as above.
ALLOCD_EXPORT int64_t allocd_interpose_release_old_spares(int device,
                                                          uint32_t keep_ms) {
  return Interposer::Get().ReleaseOldSpares(device, keep_ms);
}

ALLOCD_EXPORT cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  return Interposer::Get().Malloc(ptr, bytes);
}

ALLOCD_EXPORT cudaError_t cudaFree(void* ptr) {
  return Interposer::Get().Free(ptr);
}

ALLOCD_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return Interposer::Get().MemGetInfo(free, total);
}

ALLOCD_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle,
                                              void* ptr) {
  return Interposer::Get().IpcGetMemHandle(handle, ptr);
}

ALLOCD_EXPORT cudaError_t cudaIpcOpenMemHandle(void** ptr,
                                               cudaIpcMemHandle_t handle,
                                               unsigned int flags) {
  return Interposer::Get().IpcOpenMemHandle(ptr, handle, flags);
}

ALLOCD_EXPORT cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  return Interposer::Get().IpcCloseMemHandle(ptr);
}

ALLOCD_EXPORT cudaError_t cudaGetDriverEntryPoint(
    const char* symbol, void** fn, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status) {
  Interposer& interposer = Interposer::Get();
  const cudaError_t result =
      interposer.real_entry_point_(symbol, fn, flags, status);
  if (result == cudaSuccess) interposer.SubstituteEntryPoint(symbol, fn);
  return result;
}

ALLOCD_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** fn, unsigned int version,
    unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  Interposer& interposer = Interposer::Get();
  const cudaError_t result = interposer.real_entry_point_by_version_(
      symbol, fn, version, flags, status);
  if (result == cudaSuccess) interposer.SubstituteEntryPoint(symbol, fn);
  return result;
}
