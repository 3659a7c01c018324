#include "client/daemon_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

// Sim mode: chunks are memfd files; a reservation is PROT_NONE anonymous
// memory that chunks are mmap()ed over.
class MmapChunkMapper final : public ChunkMapper {
 public:
  absl::StatusOr<uint64_t> Reserve(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", FormatSize(bytes), " of address space: ",
          strerror(errno)));
    }
    return reinterpret_cast<uint64_t>(p);
  }

  void Free(uint64_t address, size_t bytes) override {
    munmap(reinterpret_cast<void*>(address), bytes);
  }

  absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes, int fd,
                               uint64_t offset) override {
    void* p = mmap(reinterpret_cast<void*>(address), chunk_bytes,
                   PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(offset));
    if (p == MAP_FAILED) {
      return absl::InternalError(
          absl::StrCat("mmap of a daemon chunk: ", strerror(errno)));
    }
    return 0;
  }

  void Unmap(uint64_t address, size_t bytes,
             absl::Span<const ChunkMapping>) override {
    // One call for the whole range, whatever is mapped in it.
    mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  }
};

}  // namespace

std::unique_ptr<ChunkMapper> MakeMmapChunkMapper() {
  return std::make_unique<MmapChunkMapper>();
}

DaemonBackend::DaemonBackend(DaemonClient* client)
    : DaemonBackend(client, MakeMmapChunkMapper()) {}

DaemonBackend::DaemonBackend(DaemonClient* client,
                             std::unique_ptr<ChunkMapper> mapper)
    : client_(client),
      mapper_(std::move(mapper)),
      total_(client->capacity_bytes()) {}

DaemonBackend::~DaemonBackend() {
  while (!ranges_.empty()) {
    auto [address, bytes] = *ranges_.begin();
    Unmap(address, bytes, false);
  }
}

size_t DaemonBackend::FreeMemory() const {
  return total_ > held_ ? total_ - held_ : 0;
}

absl::Status DaemonBackend::Map(uint64_t address, size_t bytes,
                                uint64_t max_chunk_bytes) {
  absl::StatusOr<ReceivedChunks> got = client_->Acquire(bytes, max_chunk_bytes);
  if (!got.ok()) {
    // The engine's OOM path (free the cache, retry, report) handles both.
    if (absl::IsResourceExhausted(got.status()) ||
        absl::IsUnavailable(got.status())) {
      return absl::ResourceExhaustedError(got.status().message());
    }
    return got.status();
  }
  uint64_t at = address;
  for (size_t i = 0; i < got->ids.size(); ++i) {
    const uint64_t size = got->sizes[i];
    absl::StatusOr<uint64_t> handle;
    if (at + size > address + bytes) {
      handle = absl::DataLossError(
          absl::StrCat("the daemon's chunks add up to more than the ",
                       FormatSize(bytes), " asked for"));
    } else {
      handle = mapper_->Map(at, size, got->fds[i].get(), got->offsets[i]);
    }
    if (!handle.ok()) {
      // Give back what this call took: the mapped ones and the rest.
      Unmap(address, at - address, true);
      std::vector<uint64_t> rest(got->ids.begin() + i, got->ids.end());
      (void)client_->Release(got->epoch, rest);
      return handle.status();
    }
    // The mapping holds the memory: the FD is no longer needed.
    got->fds[i].reset();
    chunks_[at] = {.epoch = got->epoch,
                   .id = got->ids[i],
                   .bytes = size,
                   .handle = *handle};
    held_ += size;
    at += size;
  }
  const size_t mapped = at - address;
  if (absl::Status s = mapper_->EnableAccess(address, mapped); !s.ok()) {
    Unmap(address, mapped, true);
    return s;
  }
  return absl::OkStatus();
}

void DaemonBackend::Unmap(uint64_t address, size_t bytes,
                          bool keep_reservation) {
  std::map<uint64_t, std::vector<uint64_t>> ids_by_epoch;
  std::vector<ChunkMapping> mappings;
  for (auto it = chunks_.lower_bound(address);
       it != chunks_.end() && it->first < address + bytes;) {
    ids_by_epoch[it->second.epoch].push_back(it->second.id);
    mappings.push_back({.address = it->first,
                        .bytes = it->second.bytes,
                        .handle = it->second.handle});
    held_ -= it->second.bytes;
    it = chunks_.erase(it);
  }
  if (!mappings.empty()) mapper_->Unmap(address, bytes, mappings);
  if (!keep_reservation) {
    mapper_->Free(address, bytes);
    ranges_.erase(address);
  }
  for (const auto& [epoch, ids] : ids_by_epoch) {
    (void)client_->Release(epoch, ids);
  }
}

absl::StatusOr<uint64_t> DaemonBackend::AllocateSegment(size_t bytes) {
  absl::StatusOr<uint64_t> address = mapper_->Reserve(bytes);
  if (!address.ok()) return address;
  ranges_[*address] = bytes;
  // Freed whole (FreeSegment): the daemon's largest chunks serve it.
  if (absl::Status s = Map(*address, bytes, UINT64_MAX); !s.ok()) {
    mapper_->Free(*address, bytes);
    ranges_.erase(*address);
    return s;
  }
  return address;
}

void DaemonBackend::FreeSegment(uint64_t address, size_t bytes) {
  Unmap(address, bytes, false);
}

absl::StatusOr<uint64_t> DaemonBackend::ReserveAddressRange(size_t bytes) {
  absl::StatusOr<uint64_t> address = mapper_->Reserve(bytes);
  if (address.ok()) ranges_[*address] = bytes;
  return address;
}

void DaemonBackend::ReleaseAddressRange(uint64_t address, size_t bytes) {
  Unmap(address, bytes, false);
}

absl::Status DaemonBackend::MapPages(uint64_t address, size_t bytes) {
  // UnmapPages may take back any page range of it: the smallest chunks.
  return Map(address, bytes, client_->chunk_bytes());
}

void DaemonBackend::UnmapPages(uint64_t address, size_t bytes) {
  Unmap(address, bytes, true);
}

}  // namespace allocd
