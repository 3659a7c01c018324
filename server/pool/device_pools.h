// DevicePools: the node's pools, one per device. A daemon serves every GPU
// it sees, each from its own NodePool over its own ChunkSource, so a chunk
// of one GPU can never be handed to a session of another. Devices are
// named by UUID ("GPU-..." as nvidia-smi prints it, "SIM-GPU-N" in sim
// mode): a client sends its device's UUID when it registers, which no
// CUDA_VISIBLE_DEVICES renumbering can change, and gets that pool.
//
// Filled once at start (Add), then read-only: the NodePools themselves are
// thread-safe, so concurrent callers need no lock here.
#ifndef ALLOCD_SERVER_POOL_DEVICE_POOLS_H_
#define ALLOCD_SERVER_POOL_DEVICE_POOLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/pool/chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {

// The UUID of sim device `index` (`allocd serve --sim-devices N`).
std::string SimDeviceUuid(int index);

// One device's pool.
struct DevicePool {
  // Its index on the node: position in DevicePools, the `device` label of
  // its metrics.
  int index = 0;
  std::string uuid;
  // What the device is, for admins: "NVIDIA H100 80GB HBM3", "memfd".
  std::string name;
  NodePool* pool = nullptr;
};

class DevicePools {
 public:
  DevicePools() = default;
  DevicePools(const DevicePools&) = delete;
  DevicePools& operator=(const DevicePools&) = delete;

  // Adds the next device (index size()), whose pool of `options.capacity`
  // bytes takes chunks from `source`; both live as long as this.
  // InvalidArgument for an empty UUID, AlreadyExists for a UUID added
  // before.
  absl::Status Add(std::string uuid, std::string name,
                   std::unique_ptr<ChunkSource> source,
                   NodePool::Options options);
  // Adds a pool the caller owns and keeps alive longer than this (tests,
  // benchmarks). Same errors as Add.
  absl::Status AddBorrowed(std::string uuid, std::string name,
                           NodePool* pool);

  size_t size() const { return devices_.size(); }
  const std::vector<DevicePool>& devices() const { return devices_; }
  // Device `index`; index < size().
  const DevicePool& at(size_t index) const { return devices_.at(index); }

  // The pool of the device a client registers on: the one with `uuid`
  // (case-insensitive), or the first device for an empty UUID (clients
  // that send none). NotFound naming the devices this daemon serves
  // otherwise.
  absl::StatusOr<const DevicePool*> ForClient(absl::string_view uuid) const;
  // The device an admin names: its UUID or its index. NotFound naming the
  // devices otherwise.
  absl::StatusOr<const DevicePool*> ForAdmin(absl::string_view device) const;

  // The smallest device's capacity (what a uid quota's percentage and the
  // autotuner's fit check take, since either may apply on any device); 0
  // without devices.
  uint64_t min_capacity() const;
  // "GPU-... (device 0), GPU-... (device 1)", for messages.
  std::string Describe() const;

 private:
  absl::Status CheckNewUuid(absl::string_view uuid) const;

  std::vector<DevicePool> devices_;
  std::vector<std::unique_ptr<ChunkSource>> sources_;
  std::vector<std::unique_ptr<NodePool>> pools_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_DEVICE_POOLS_H_
