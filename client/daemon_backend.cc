#include "client/daemon_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

absl::StatusOr<uint64_t> ReserveRange(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", FormatSize(bytes), " of address space: ",
        strerror(errno)));
  }
  return reinterpret_cast<uint64_t>(p);
}

}  // namespace

DaemonBackend::DaemonBackend(DaemonClient* client)
    : client_(client),
      total_(client->capacity_bytes()),
      chunk_bytes_(client->chunk_bytes()) {}

DaemonBackend::~DaemonBackend() {
  while (!ranges_.empty()) {
    auto [address, bytes] = *ranges_.begin();
    Unmap(address, bytes, false);
  }
}

size_t DaemonBackend::FreeMemory() const {
  return total_ > held_ ? total_ - held_ : 0;
}

absl::Status DaemonBackend::Map(uint64_t address, size_t bytes) {
  absl::StatusOr<ReceivedChunks> got = client_->Acquire(bytes);
  if (!got.ok()) {
    // The engine's OOM path (free the cache, retry, report) handles both.
    if (absl::IsResourceExhausted(got.status()) ||
        absl::IsUnavailable(got.status())) {
      return absl::ResourceExhaustedError(got.status().message());
    }
    return got.status();
  }
  for (size_t i = 0; i < got->ids.size(); ++i) {
    const uint64_t at = address + i * got->chunk_bytes;
    void* p = mmap(reinterpret_cast<void*>(at), got->chunk_bytes,
                   PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   got->fds[i].get(), static_cast<off_t>(got->offsets[i]));
    if (p == MAP_FAILED) {
      const int error = errno;
      // Give back what this call took: the mapped ones and the rest.
      Unmap(address, i * got->chunk_bytes, true);
      std::vector<uint64_t> rest(got->ids.begin() + i, got->ids.end());
      (void)client_->Release(got->epoch, rest);
      return absl::InternalError(
          absl::StrCat("mmap of a daemon chunk: ", strerror(error)));
    }
    chunks_[at] = {.epoch = got->epoch, .id = got->ids[i]};
    held_ += got->chunk_bytes;
  }
  return absl::OkStatus();
}

void DaemonBackend::Unmap(uint64_t address, size_t bytes,
                          bool keep_reservation) {
  std::map<uint64_t, std::vector<uint64_t>> ids_by_epoch;
  for (auto it = chunks_.lower_bound(address);
       it != chunks_.end() && it->first < address + bytes;) {
    ids_by_epoch[it->second.epoch].push_back(it->second.id);
    held_ -= chunk_bytes_;
    it = chunks_.erase(it);
  }
  if (keep_reservation) {
    mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  } else {
    munmap(reinterpret_cast<void*>(address), bytes);
    ranges_.erase(address);
  }
  for (const auto& [epoch, ids] : ids_by_epoch) {
    (void)client_->Release(epoch, ids);
  }
}

absl::StatusOr<uint64_t> DaemonBackend::AllocateSegment(size_t bytes) {
  absl::StatusOr<uint64_t> address = ReserveRange(bytes);
  if (!address.ok()) return address;
  ranges_[*address] = bytes;
  if (absl::Status s = Map(*address, bytes); !s.ok()) {
    munmap(reinterpret_cast<void*>(*address), bytes);
    ranges_.erase(*address);
    return s;
  }
  return address;
}

void DaemonBackend::FreeSegment(uint64_t address, size_t bytes) {
  Unmap(address, bytes, false);
}

absl::StatusOr<uint64_t> DaemonBackend::ReserveAddressRange(size_t bytes) {
  absl::StatusOr<uint64_t> address = ReserveRange(bytes);
  if (address.ok()) ranges_[*address] = bytes;
  return address;
}

void DaemonBackend::ReleaseAddressRange(uint64_t address, size_t bytes) {
  Unmap(address, bytes, false);
}

absl::Status DaemonBackend::MapPages(uint64_t address, size_t bytes) {
  return Map(address, bytes);
}

void DaemonBackend::UnmapPages(uint64_t address, size_t bytes) {
  Unmap(address, bytes, true);
}

}  // namespace allocd
