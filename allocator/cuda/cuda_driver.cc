#include "allocator/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace allocd::cuda {
namespace {

// Every driver function used, by the name <cuda.h> gives it: some are
// macros for a versioned symbol (cuMemGetInfo is cuMemGetInfo_v2), so the
// symbol looked up is the macro's expansion, as a program linked against
// libcuda would bind it.
#define ALLOCD_CUDA_FUNCTIONS(X)    \
  X(cuGetErrorName)                 \
  X(cuGetErrorString)               \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuDeviceGetCount)               \
  X(cuDeviceGet)                    \
  X(cuDeviceGetName)                \
  X(cuDeviceGetAttribute)           \
  X(cuDeviceGetUuid)                \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxSetCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuMemGetAllocationGranularity)  \
  X(cuMemCreate)                    \
  X(cuMemExportToShareableHandle)   \
  X(cuMemImportFromShareableHandle) \
  X(cuMemRelease)                   \
  X(cuMemAddressReserve)            \
  X(cuMemAddressFree)               \
  X(cuMemMap)                       \
  X(cuMemUnmap)                     \
  X(cuMemSetAccess)                 \
  X(cuMemGetInfo)                   \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemsetD8)                     \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyDtoH)                   \
  X(cuEventCreate)                  \
  X(cuEventRecord)                  \
  X(cuEventQuery)                   \
  X(cuEventDestroy)

#define ALLOCD_STRINGIFY_(x) #x
#define ALLOCD_STRINGIFY(x) ALLOCD_STRINGIFY_(x)

struct Api {
#define ALLOCD_CUDA_POINTER(name) decltype(&::name) name = nullptr;
  ALLOCD_CUDA_FUNCTIONS(ALLOCD_CUDA_POINTER)
#undef ALLOCD_CUDA_POINTER
};

struct Loaded {
  Api api;
  absl::Status load;  // dlopen and dlsym
  absl::Status init;  // cuInit(0)
};

const Loaded& Load() {
  static const Loaded* const loaded = [] {
    auto* l = new Loaded;
    // RTLD_LOCAL: nothing of the driver leaks into the symbol namespace.
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      l->load = absl::FailedPreconditionError(absl::StrCat(
          "no CUDA driver: cannot load libcuda.so.1 (",
          why == nullptr ? "unknown error" : why, ")"));
      return l;
    }
#define ALLOCD_CUDA_RESOLVE(name)                                          \
  if (l->load.ok()) {                                                      \
    l->api.name = reinterpret_cast<decltype(&::name)>(                     \
        dlsym(library, ALLOCD_STRINGIFY(name)));                           \
    if (l->api.name == nullptr) {                                          \
      l->load = absl::FailedPreconditionError(                             \
          absl::StrCat("no CUDA driver: libcuda.so.1 has no ",             \
                       ALLOCD_STRINGIFY(name), " (driver too old?)"));     \
    }                                                                      \
  }
    ALLOCD_CUDA_FUNCTIONS(ALLOCD_CUDA_RESOLVE)
#undef ALLOCD_CUDA_RESOLVE
    // The library stays loaded for the life of the process.
    if (l->load.ok()) {
      if (absl::Status s = Error(l->api.cuInit(0), "cuInit"); !s.ok()) {
        l->init = absl::Status(
            s.code(), absl::StrCat("no CUDA device: ", s.message()));
      }
    }
    return l;
  }();
  return *loaded;
}

// The API after a successful Init(); calls Init() first.
#define ALLOCD_CUDA_API()                               \
  if (absl::Status s = Init(); !s.ok()) return s;       \
  const Api& api = Load().api

// The error names the call as written (cuMemGetInfo, not cuMemGetInfo_v2).
#define ALLOCD_CUDA_CALL(name, ...) Error(api.name(__VA_ARGS__), #name)

}  // namespace

absl::Status Init() {
  const Loaded& l = Load();
  if (!l.load.ok()) return l.load;
  return l.init;
}

absl::Status Error(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const Api& api = Load().api;
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName != nullptr) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString != nullptr) api.cuGetErrorString(result, &text);
  std::string message =
      name != nullptr
          ? absl::StrCat(call, ": ", name)
          : absl::StrCat(call, ": CUDA error ", static_cast<int>(result));
  if (text != nullptr) absl::StrAppend(&message, " (", text, ")");
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(message);
    case CUDA_ERROR_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<int> DriverVersion() {
  ALLOCD_CUDA_API();
  int version = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuDriverGetVersion, &version);
      !s.ok()) {
    return s;
  }
  return version;
}

absl::StatusOr<int> DeviceCount() {
  ALLOCD_CUDA_API();
  int count = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuDeviceGetCount, &count); !s.ok()) {
    return s;
  }
  return count;
}

absl::StatusOr<CUdevice> GetDevice(int ordinal) {
  ALLOCD_CUDA_API();
  CUdevice device = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuDeviceGet, &device, ordinal);
      !s.ok()) {
    return s;
  }
  return device;
}

absl::StatusOr<std::string> DeviceName(CUdevice device) {
  ALLOCD_CUDA_API();
  char name[256] = {};
  if (absl::Status s =
          ALLOCD_CUDA_CALL(cuDeviceGetName, name, sizeof name - 1, device);
      !s.ok()) {
    return s;
  }
  return std::string(name);
}

std::string FormatGpuUuid(const CUuuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    // nvidia-smi's grouping: 8-4-4-4-12 hex digits.
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto byte = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[byte >> 4];
    out += kHex[byte & 0xf];
  }
  return out;
}

absl::StatusOr<std::string> DeviceUuid(CUdevice device) {
  ALLOCD_CUDA_API();
  CUuuid uuid = {};
  if (absl::Status s = ALLOCD_CUDA_CALL(cuDeviceGetUuid, &uuid, device);
      !s.ok()) {
    return s;
  }
  return FormatGpuUuid(uuid);
}

absl::StatusOr<int> DeviceAttribute(CUdevice device,
                                    CUdevice_attribute attribute) {
  ALLOCD_CUDA_API();
  int value = 0;
  if (absl::Status s =
          ALLOCD_CUDA_CALL(cuDeviceGetAttribute, &value, attribute, device);
      !s.ok()) {
    return s;
  }
  return value;
}

absl::StatusOr<CUcontext> RetainPrimaryContext(CUdevice device) {
  ALLOCD_CUDA_API();
  CUcontext context = nullptr;
  if (absl::Status s =
          ALLOCD_CUDA_CALL(cuDevicePrimaryCtxRetain, &context, device);
      !s.ok()) {
    return s;
  }
  return context;
}

absl::Status ReleasePrimaryContext(CUdevice device) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuDevicePrimaryCtxRelease, device);
}

absl::Status SetCurrentContext(CUcontext context) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuCtxSetCurrent, context);
}

absl::Status Synchronize() {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuCtxSynchronize);
}

CUmemAllocationProp DeviceMemoryProp(CUdevice device, bool exportable) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = exportable
                                  ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                  : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

absl::StatusOr<size_t> MinimumGranularity(const CUmemAllocationProp& prop) {
  ALLOCD_CUDA_API();
  size_t granularity = 0;
  if (absl::Status s =
          ALLOCD_CUDA_CALL(cuMemGetAllocationGranularity, &granularity, &prop,
                           CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      !s.ok()) {
    return s;
  }
  return granularity;
}

absl::StatusOr<CUmemGenericAllocationHandle> MemCreate(
    size_t bytes, const CUmemAllocationProp& prop) {
  ALLOCD_CUDA_API();
  CUmemGenericAllocationHandle handle = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuMemCreate, &handle, bytes, &prop, 0);
      !s.ok()) {
    return s;
  }
  return handle;
}

absl::StatusOr<int> ExportToFd(CUmemGenericAllocationHandle handle) {
  ALLOCD_CUDA_API();
  int fd = -1;
  if (absl::Status s = ALLOCD_CUDA_CALL(
          cuMemExportToShareableHandle, &fd, handle,
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      !s.ok()) {
    return s;
  }
  // Children the process spawns must not inherit GPU memory.
  fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
  return fd;
}

absl::StatusOr<CUmemGenericAllocationHandle> ImportFromFd(int fd) {
  ALLOCD_CUDA_API();
  CUmemGenericAllocationHandle handle = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(
          cuMemImportFromShareableHandle, &handle,
          reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      !s.ok()) {
    return s;
  }
  return handle;
}

absl::Status MemRelease(CUmemGenericAllocationHandle handle) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemRelease, handle);
}

absl::StatusOr<CUdeviceptr> AddressReserve(size_t bytes, size_t alignment) {
  ALLOCD_CUDA_API();
  CUdeviceptr address = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuMemAddressReserve, &address, bytes,
                                        alignment, 0, 0);
      !s.ok()) {
    return s;
  }
  return address;
}

absl::Status AddressFree(CUdeviceptr address, size_t bytes) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemAddressFree, address, bytes);
}

absl::Status MemMap(CUdeviceptr address, size_t bytes,
                    CUmemGenericAllocationHandle handle) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemMap, address, bytes, 0, handle, 0);
}

absl::Status MemUnmap(CUdeviceptr address, size_t bytes) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemUnmap, address, bytes);
}

absl::StatusOr<CUdeviceptr> MemAlloc(size_t bytes) {
  ALLOCD_CUDA_API();
  CUdeviceptr address = 0;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuMemAlloc, &address, bytes);
      !s.ok()) {
    return s;
  }
  return address;
}

absl::Status MemFree(CUdeviceptr address) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemFree, address);
}

absl::Status SetReadWriteAccess(CUdeviceptr address, size_t bytes,
                                CUdevice device) {
  ALLOCD_CUDA_API();
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return ALLOCD_CUDA_CALL(cuMemSetAccess, address, bytes, &access, 1);
}

absl::StatusOr<MemInfo> MemGetInfo() {
  ALLOCD_CUDA_API();
  MemInfo info;
  if (absl::Status s = ALLOCD_CUDA_CALL(cuMemGetInfo, &info.free, &info.total);
      !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<CUevent> EventCreate() {
  ALLOCD_CUDA_API();
  CUevent event = nullptr;
  if (absl::Status s =
          ALLOCD_CUDA_CALL(cuEventCreate, &event, CU_EVENT_DISABLE_TIMING);
      !s.ok()) {
    return s;
  }
  return event;
}

absl::Status EventRecord(CUevent event, CUstream stream) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuEventRecord, event, stream);
}

absl::StatusOr<bool> EventDone(CUevent event) {
  ALLOCD_CUDA_API();
  const CUresult result = api.cuEventQuery(event);
  if (result == CUDA_ERROR_NOT_READY) return false;
  if (absl::Status s = Error(result, "cuEventQuery"); !s.ok()) return s;
  return true;
}

absl::Status EventDestroy(CUevent event) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuEventDestroy, event);
}

absl::Status MemsetD8(CUdeviceptr address, uint8_t value, size_t bytes) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemsetD8, address, value, bytes);
}

absl::Status MemcpyHtoD(CUdeviceptr to, const void* from, size_t bytes) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemcpyHtoD, to, from, bytes);
}

absl::Status MemcpyDtoH(void* to, CUdeviceptr from, size_t bytes) {
  ALLOCD_CUDA_API();
  return ALLOCD_CUDA_CALL(cuMemcpyDtoH, to, from, bytes);
}

absl::StatusOr<PrimaryContext> PrimaryContext::Open(int ordinal) {
  absl::StatusOr<CUdevice> device = GetDevice(ordinal);
  if (!device.ok()) return device.status();
  absl::StatusOr<CUcontext> context = RetainPrimaryContext(*device);
  if (!context.ok()) return context.status();
  PrimaryContext primary(ordinal, *device, *context);
  if (absl::Status s = primary.Bind(); !s.ok()) return s;
  return primary;
}

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : ordinal_(other.ordinal_),
      device_(other.device_),
      context_(other.context_) {
  other.context_ = nullptr;
}

PrimaryContext::~PrimaryContext() {
  if (context_ != nullptr) (void)ReleasePrimaryContext(device_);
}

}  // namespace allocd::cuda
