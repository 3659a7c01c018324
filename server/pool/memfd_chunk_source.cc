#include "server/pool/memfd_chunk_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace allocd {
namespace {

// Whether CreateChunk() already raised RLIMIT_NOFILE (once per process).
std::atomic<bool> raised_fd_limit{false};

}  // namespace

MemfdChunkSource::MemfdChunkSource(size_t granularity)
    : granularity_(granularity) {}

absl::StatusOr<ChunkMemory> MemfdChunkSource::CreateChunk(uint64_t bytes) {
  UniqueFd fd(memfd_create("allocd-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() && errno == EMFILE && !raised_fd_limit.exchange(true) &&
      RaiseOpenFileLimit().ok()) {
    fd.reset(memfd_create("allocd-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  }
  if (!fd.valid()) {
    const int error = errno;
    std::string message = absl::StrCat("memfd_create: ", strerror(error));
    if (error == EMFILE) {
      absl::StrAppend(&message,
                      " (one FD per chunk: raise the daemon's RLIMIT_NOFILE)");
    }
    return absl::ResourceExhaustedError(message);
  }
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ftruncate of a ", bytes, "-byte memfd chunk: ", strerror(errno)));
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return absl::InternalError(
        absl::StrCat("sealing a memfd chunk: ", strerror(errno)));
  }
  return ChunkMemory{.file = std::make_shared<const UniqueFd>(std::move(fd)),
                     .offset = 0};
}

absl::StatusOr<ChunkMemory> MemfdChunkSource::AdoptChunk(UniqueFd fd,
                                                         uint64_t offset,
                                                         uint64_t bytes) const {
  if (!fd.valid()) return absl::InvalidArgumentError("no FD to prove it");
  char link[64];
  char target[256] = {};
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd.get());
  const ssize_t n = readlink(link, target, sizeof target - 1);
  constexpr absl::string_view kName = "/memfd:allocd-chunk";
  if (n < 0 || absl::string_view(target, static_cast<size_t>(n))
                       .substr(0, kName.size()) != kName) {
    return absl::InvalidArgumentError(
        "its FD is not a memfd the allocd daemon made");
  }
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return absl::InvalidArgumentError(
        "its memfd is not sealed as the daemon seals chunks");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fstat of its FD: ", strerror(errno)));
  }
  if (offset != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "declared ", bytes, " bytes at offset ", offset, "; its memfd is ",
        st.st_size, " bytes"));
  }
  return ChunkMemory{.file = std::make_shared<const UniqueFd>(std::move(fd)),
                     .offset = 0};
}

std::string MemfdChunkSource::Identity(const ChunkMemory& memory) const {
  struct stat st;
  if (memory.file == nullptr || fstat(memory.file->get(), &st) != 0) return "";
  return absl::StrCat("memfd ", st.st_dev, ":", st.st_ino);
}

}  // namespace allocd
