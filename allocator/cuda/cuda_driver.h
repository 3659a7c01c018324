// The CUDA driver API calls allocd uses, each returning absl::Status.
//
// libcuda.so.1 is loaded with dlopen on first use, not linked: a binary
// built with this file starts on a machine without a GPU or driver (CI),
// and only the calls fail there, with FailedPrecondition "no CUDA driver:
// ...". Errors name the call and the driver's error (cuGetErrorName and
// cuGetErrorString); CUDA_ERROR_OUT_OF_MEMORY is ResourceExhausted.
//
// Only the types come from the toolkit's <cuda.h>. Thread-safe (the driver
// is); the calls that need a context act on the calling thread's current
// one (SetCurrentContext).
#ifndef ALLOCD_ALLOCATOR_CUDA_CUDA_DRIVER_H_
#define ALLOCD_ALLOCATOR_CUDA_CUDA_DRIVER_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace allocd::cuda {

// Loads the driver (once) and runs cuInit(0) (once). FailedPrecondition,
// starting "no CUDA driver", when libcuda.so.1 cannot be loaded or lacks a
// symbol; "no CUDA device: cuInit: ..." when cuInit fails (e.g.
// CUDA_ERROR_NO_DEVICE).
absl::Status Init();

// The error of a failed call as a Status: "CALL: NAME (description)".
absl::Status Error(CUresult result, const char* call);

absl::StatusOr<int> DriverVersion();  // e.g. 13000
absl::StatusOr<int> DeviceCount();
absl::StatusOr<CUdevice> GetDevice(int ordinal);
absl::StatusOr<std::string> DeviceName(CUdevice device);
// The device's UUID as nvidia-smi and NVIDIA_VISIBLE_DEVICES write it,
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lowercase hex): a name for the
// physical GPU that CUDA_VISIBLE_DEVICES renumbering does not change.
absl::StatusOr<std::string> DeviceUuid(CUdevice device);
std::string FormatGpuUuid(const CUuuid& uuid);
absl::StatusOr<int> DeviceAttribute(CUdevice device,
                                    CUdevice_attribute attribute);

// The device's primary context (the one the CUDA runtime and PyTorch use),
// retained: release it with ReleasePrimaryContext.
absl::StatusOr<CUcontext> RetainPrimaryContext(CUdevice device);
absl::Status ReleasePrimaryContext(CUdevice device);
absl::Status SetCurrentContext(CUcontext context);
absl::Status Synchronize();  // cuCtxSynchronize

// Pinned device memory on `device`; with `exportable`, exportable as a
// POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
CUmemAllocationProp DeviceMemoryProp(CUdevice device, bool exportable);
// cuMemGetAllocationGranularity, minimum granularity (2 MiB on an H100).
absl::StatusOr<size_t> MinimumGranularity(const CUmemAllocationProp& prop);

absl::StatusOr<CUmemGenericAllocationHandle> MemCreate(
    size_t bytes, const CUmemAllocationProp& prop);
// A new file descriptor (close-on-exec) for the allocation; the caller owns
// it. The allocation lives while any handle, FD or mapping of it does.
absl::StatusOr<int> ExportToFd(CUmemGenericAllocationHandle handle);
// A handle for the allocation behind `fd` (which stays the caller's).
absl::StatusOr<CUmemGenericAllocationHandle> ImportFromFd(int fd);
absl::Status MemRelease(CUmemGenericAllocationHandle handle);

// Address space; `alignment` 0: the granularity.
absl::StatusOr<CUdeviceptr> AddressReserve(size_t bytes, size_t alignment = 0);
absl::Status AddressFree(CUdeviceptr address, size_t bytes);
absl::Status MemMap(CUdeviceptr address, size_t bytes,
                    CUmemGenericAllocationHandle handle);
absl::Status MemUnmap(CUdeviceptr address, size_t bytes);
// Read-write access for `device` to a mapped range.
absl::Status SetReadWriteAccess(CUdeviceptr address, size_t bytes,
                                CUdevice device);

// Plain device memory, as the runtime's cudaMalloc gets it (benchmarks'
// native baseline).
absl::StatusOr<CUdeviceptr> MemAlloc(size_t bytes);
absl::Status MemFree(CUdeviceptr address);

struct MemInfo {
  size_t free = 0;
  size_t total = 0;
};
absl::StatusOr<MemInfo> MemGetInfo();  // of the current context's device

// Events without timing, for frees of memory other streams still use:
// recorded on those streams, done once their work before it is.
absl::StatusOr<CUevent> EventCreate();
absl::Status EventRecord(CUevent event, CUstream stream);
// False while work before the event is pending (CUDA_ERROR_NOT_READY).
absl::StatusOr<bool> EventDone(CUevent event);
absl::Status EventDestroy(CUevent event);

// Synchronous copies and fills (tests and benchmarks).
absl::Status MemsetD8(CUdeviceptr address, uint8_t value, size_t bytes);
absl::Status MemcpyHtoD(CUdeviceptr to, const void* from, size_t bytes);
absl::Status MemcpyDtoH(void* to, CUdeviceptr from, size_t bytes);

// A retained primary context, current on the thread that Bind()s it.
class PrimaryContext {
 public:
  // Init, GetDevice, RetainPrimaryContext and SetCurrentContext.
  static absl::StatusOr<PrimaryContext> Open(int ordinal);
  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&&) = delete;
  PrimaryContext(const PrimaryContext&) = delete;
  ~PrimaryContext();

  // Makes the context current on the calling thread.
  absl::Status Bind() const { return SetCurrentContext(context_); }
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }
  int ordinal() const { return ordinal_; }

 private:
  PrimaryContext(int ordinal, CUdevice device, CUcontext context)
      : ordinal_(ordinal), device_(device), context_(context) {}
  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

}  // namespace allocd::cuda

#endif  // ALLOCD_ALLOCATOR_CUDA_CUDA_DRIVER_H_
