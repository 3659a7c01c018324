// ObservedBackend: a DeviceBackend that passes every call on to another and
// reports those that succeed to a ReplayObserver, for recorders that need
// the engine's device calls (a replay's snapshot, a live process's memory
// history).
#ifndef ALLOCD_ALLOCATOR_TRACE_OBSERVED_BACKEND_H_
#define ALLOCD_ALLOCATOR_TRACE_OBSERVED_BACKEND_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/device_backend.h"
#include "allocator/trace/replay_observer.h"

namespace allocd {

class ObservedBackend final : public DeviceBackend {
 public:
  // `inner` (and the observer, while attached) must outlive this backend.
  explicit ObservedBackend(DeviceBackend& inner,
                           ReplayObserver* observer = nullptr)
      : inner_(inner), observer_(observer) {}

  // Starts reporting to `observer`; nullptr stops (Detach). Callers
  // serialise this with the engine's calls, as they serialise the engine.
  void Attach(ReplayObserver* observer) { observer_ = observer; }
  void Detach() { observer_ = nullptr; }

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override {
    absl::StatusOr<uint64_t> address = inner_.AllocateSegment(bytes);
    if (address.ok()) Report(DeviceCall::kSegmentAlloc, *address, bytes);
    return address;
  }
  void FreeSegment(uint64_t address, size_t bytes) override {
    inner_.FreeSegment(address, bytes);
    Report(DeviceCall::kSegmentFree, address, bytes);
  }
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override {
    absl::StatusOr<uint64_t> address = inner_.ReserveAddressRange(bytes);
    if (address.ok()) Report(DeviceCall::kReserve, *address, bytes);
    return address;
  }
  void ReleaseAddressRange(uint64_t address, size_t bytes) override {
    inner_.ReleaseAddressRange(address, bytes);
    Report(DeviceCall::kRelease, address, bytes);
  }
  absl::Status MapPages(uint64_t address, size_t bytes) override {
    absl::Status status = inner_.MapPages(address, bytes);
    if (status.ok()) Report(DeviceCall::kMap, address, bytes);
    return status;
  }
  void UnmapPages(uint64_t address, size_t bytes) override {
    inner_.UnmapPages(address, bytes);
    Report(DeviceCall::kUnmap, address, bytes);
  }
  size_t TotalMemory() const override { return inner_.TotalMemory(); }
  size_t FreeMemory() const override { return inner_.FreeMemory(); }

 private:
  void Report(DeviceCall call, uint64_t address, size_t bytes) {
    if (observer_ != nullptr) observer_->OnDeviceCall(call, address, bytes);
  }

  DeviceBackend& inner_;
  ReplayObserver* observer_;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_OBSERVED_BACKEND_H_
