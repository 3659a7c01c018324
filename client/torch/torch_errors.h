// PyTorch's own exception types, thrown from liballocd_torch without
// linking PyTorch.
//
// CUDAPluggableAllocator calls our malloc through a function pointer and
// hands back whatever it returns: a nullptr becomes a tensor without memory,
// so a failed allocation must throw. The exception crosses PyTorch's C++
// into its Python bindings, which translate by C++ type: c10::OutOfMemoryError
// becomes torch.OutOfMemoryError, every other std::exception a plain
// RuntimeError. Only the C++ type reaches `except torch.OutOfMemoryError`:
// no Python-side wrapper can see every operator that allocates.
//
// So ThrowOutOfMemory throws a real c10::OutOfMemoryError, built from the
// symbols of the c10 library PyTorch has loaded in this process (found by
// soname, as PyTorch loads it RTLD_LOCAL): its type_info and vtable, and
// c10::Error's exported constructor Error(SourceLocation, std::string), all
// names the Itanium C++ ABI fixes. Nothing of c10's object layout is assumed
// beyond what that constructor writes. Without PyTorch in the process (or a
// c10 whose symbols differ), it throws std::runtime_error with the same
// message, as before.
#ifndef ALLOCD_CLIENT_TORCH_TORCH_ERRORS_H_
#define ALLOCD_CLIENT_TORCH_TORCH_ERRORS_H_

#include <string>

namespace allocd {

// Throws `message` as c10::OutOfMemoryError when PyTorch's c10 is loaded,
// else as std::runtime_error.
[[noreturn]] void ThrowOutOfMemory(const std::string& message);

// Whether ThrowOutOfMemory would throw c10::OutOfMemoryError now.
bool TorchOutOfMemoryErrorAvailable();

}  // namespace allocd

#endif  // ALLOCD_CLIENT_TORCH_TORCH_ERRORS_H_
