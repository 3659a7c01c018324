#include "client/torch/torch_errors.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <typeinfo>

namespace allocd {
namespace {

// c10::SourceLocation: {function, file, line}, passed by value.
struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};

// c10::Error::Error(SourceLocation, std::string), the complete-object
// constructor, called as a function whose first argument is `this`.
using ErrorConstructor = void (*)(void* self, SourceLocation where,
                                  std::string message);

struct C10OutOfMemoryError {
  std::type_info* type;
  // The vtable symbol: offset to top, type_info, then the virtual functions.
  void** vtable;
  ErrorConstructor construct;
};

// Bytes allocated for the exception object: c10::Error is about 200 bytes in
// PyTorch 2.9-2.11 (a message, a context vector, a backtrace, two derived
// strings, a pointer). Its constructor writes only its own members; the
// slack keeps a later, larger c10::Error safe.
constexpr size_t kExceptionBytes = 1024;

// The libraries that define c10::OutOfMemoryError's vtable (libc10_cuda.so
// throws it; dlsym on a handle also searches its dependencies, libc10.so).
constexpr const char* kLibraries[] = {"libc10_cuda.so", "libc10.so",
                                      "libtorch_cuda.so", "libtorch_python.so"};

void* Symbol(const char* name) {
  if (void* found = dlsym(RTLD_DEFAULT, name)) return found;
  for (const char* library : kLibraries) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* found = dlsym(handle, name);
    dlclose(handle);  // drops the reference NOLOAD took; the library stays
    if (found != nullptr) return found;
  }
  return nullptr;
}

// The symbols, once all are found; looked up again while any is missing
// (PyTorch may be imported after liballocd_torch is loaded).
const C10OutOfMemoryError* Resolve() {
  static std::atomic<const C10OutOfMemoryError*> resolved{nullptr};
  if (const C10OutOfMemoryError* r = resolved.load(std::memory_order_acquire)) {
    return r;
  }
  void* type = Symbol("_ZTIN3c1016OutOfMemoryErrorE");
  void* vtable = Symbol("_ZTVN3c1016OutOfMemoryErrorE");
  void* construct = Symbol(
      "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11"
      "char_traitsIcESaIcEEE");
  if (type == nullptr || vtable == nullptr || construct == nullptr) {
    return nullptr;
  }
  static const C10OutOfMemoryError symbols{
      static_cast<std::type_info*>(type), static_cast<void**>(vtable),
      reinterpret_cast<ErrorConstructor>(construct)};
  resolved.store(&symbols, std::memory_order_release);
  return &symbols;
}

// The exception's destructor: the complete-object destructor, slot 0 of
// the virtual functions (std::exception declares the destructor first).
void Destroy(void* exception) {
  void** vptr = *static_cast<void***>(exception);
  reinterpret_cast<void (*)(void*)>(vptr[0])(exception);
}

}  // namespace

bool TorchOutOfMemoryErrorAvailable() { return Resolve() != nullptr; }

void ThrowOutOfMemory(const std::string& message) {
  const C10OutOfMemoryError* c10 = Resolve();
  if (c10 == nullptr) throw std::runtime_error(message);
  void* exception = abi::__cxa_allocate_exception(kExceptionBytes);
  std::memset(exception, 0, kExceptionBytes);
  try {
    c10->construct(exception,
                   SourceLocation{"allocd_torch_malloc", __FILE__,
                                  static_cast<uint32_t>(__LINE__)},
                   message);
  } catch (...) {
    abi::__cxa_free_exception(exception);
    throw;
  }
  // What OutOfMemoryError's inherited constructor does after Error's: point
  // the object at its own vtable (the virtual functions start after the
  // offset to top and the type_info).
  *static_cast<void***>(exception) = c10->vtable + 2;
  abi::__cxa_throw(exception, c10->type, Destroy);
}

}  // namespace allocd
