#include "server/pool/memfd_chunk_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
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

}  // namespace allocd
