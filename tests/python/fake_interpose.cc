// A stand-in for liballocd_interpose.so where there is no GPU (test_run.py):
// the exports the Python package uses, over liballocd_client's C functions
// (linked in, as the real interposer links them). PyTorch's first cudaMalloc
// connects the process's session for device 0, as the real one connects on
// first use; the memory itself is the process's own.
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "absl/synchronization/notification.h"
#include "client/capi/allocd_client.h"

namespace {

std::mutex mu;
allocd_client* session = nullptr;  // guarded by mu
absl::Notification connected;

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

allocd_client* Session() {
  std::lock_guard<std::mutex> lock(mu);
  if (session == nullptr) {
    session = allocd_connect_gpu(Env("ALLOCD_SOCKET"), Env("ALLOCD_JOB"),
                                 Env("PYTORCH_CUDA_ALLOC_CONF"),
                                 "fake liballocd_interpose (tests)",
                                 Env("ALLOCD_AUTOTUNE"), "");
    if (session != nullptr && !connected.HasBeenNotified()) connected.Notify();
  }
  return session;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) allocd_client* allocd_interpose_session(
    int /*device*/) {
  return Session();
}

__attribute__((visibility("default"))) int allocd_interpose_wait_session() {
  connected.WaitForNotification();
  return 0;
}

// No grant is ever parked here: the daemon could not give it at once.
__attribute__((visibility("default"))) int allocd_interpose_prewarm(
    int /*device*/, uint64_t /*bytes*/) {
  return 1;
}

// What the fake torch's allocator calls (cudaError_t: 0 is cudaSuccess).
__attribute__((visibility("default"))) int cudaMalloc(void** ptr, size_t bytes) {
  Session();
  *ptr = std::malloc(bytes);
  return *ptr != nullptr ? 0 : 2;
}

}  // extern "C"
