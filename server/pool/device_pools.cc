#include "server/pool/device_pools.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace allocd {

std::string SimDeviceUuid(int index) { return absl::StrCat("SIM-GPU-", index); }

absl::Status DevicePools::CheckNewUuid(absl::string_view uuid) const {
  if (uuid.empty()) {
    return absl::InvalidArgumentError("a device needs a UUID");
  }
  for (const DevicePool& d : devices_) {
    if (absl::EqualsIgnoreCase(d.uuid, uuid)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "device ", uuid, " is already device ", d.index, " of the node"));
    }
  }
  return absl::OkStatus();
}

absl::Status DevicePools::Add(std::string uuid, std::string name,
                              std::unique_ptr<ChunkSource> source,
                              NodePool::Options options) {
  if (absl::Status s = CheckNewUuid(uuid); !s.ok()) return s;
  auto pool = std::make_unique<NodePool>(source.get(), std::move(options));
  devices_.push_back({.index = static_cast<int>(devices_.size()),
                      .uuid = std::move(uuid),
                      .name = std::move(name),
                      .pool = pool.get()});
  sources_.push_back(std::move(source));
  pools_.push_back(std::move(pool));
  return absl::OkStatus();
}

absl::Status DevicePools::AddBorrowed(std::string uuid, std::string name,
                                      NodePool* pool) {
  if (absl::Status s = CheckNewUuid(uuid); !s.ok()) return s;
  devices_.push_back({.index = static_cast<int>(devices_.size()),
                      .uuid = std::move(uuid),
                      .name = std::move(name),
                      .pool = pool});
  return absl::OkStatus();
}

absl::StatusOr<const DevicePool*> DevicePools::ForClient(
    absl::string_view uuid) const {
  if (devices_.empty()) {
    return absl::FailedPreconditionError("the daemon serves no device");
  }
  if (uuid.empty()) return &devices_.front();
  for (const DevicePool& d : devices_) {
    if (absl::EqualsIgnoreCase(d.uuid, uuid)) return &d;
  }
  return absl::NotFoundError(absl::StrCat(
      "this daemon does not serve GPU ", uuid, "; it serves ", Describe(),
      ". Run the daemon where it sees every GPU of the node (no "
      "CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES limiting it), or "
      "connect to the daemon of that GPU's node"));
}

absl::StatusOr<const DevicePool*> DevicePools::ForAdmin(
    absl::string_view device) const {
  int index = -1;
  if (absl::SimpleAtoi(device, &index) && index >= 0 &&
      static_cast<size_t>(index) < devices_.size()) {
    return &devices_[index];
  }
  for (const DevicePool& d : devices_) {
    if (absl::EqualsIgnoreCase(d.uuid, device)) return &d;
  }
  return absl::NotFoundError(absl::StrCat("no device \"", device,
                                          "\": give a UUID or an index of ",
                                          Describe()));
}

uint64_t DevicePools::min_capacity() const {
  uint64_t smallest = 0;
  for (const DevicePool& d : devices_) {
    const uint64_t capacity = d.pool->capacity();
    smallest = smallest == 0 ? capacity : std::min(smallest, capacity);
  }
  return smallest;
}

std::string DevicePools::Describe() const {
  std::string out;
  for (const DevicePool& d : devices_) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", d.uuid, " (device ",
                    d.index, ")");
  }
  return out;
}

}  // namespace allocd
