#include "server/pool/chunk_source.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace allocd {

absl::StatusOr<ChunkMemory> MemfdChunkSource::CreateChunk() {
  if (slab_ == nullptr || used_in_slab_ == chunks_per_slab_) {
    UniqueFd fd(memfd_create("allocd-chunks", MFD_CLOEXEC));
    if (!fd.valid()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("memfd_create: ", strerror(errno)));
    }
    if (ftruncate(fd.get(),
                  static_cast<off_t>(granularity_ * chunks_per_slab_)) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("ftruncate of a chunk slab: ", strerror(errno)));
    }
    slab_ = std::make_shared<const UniqueFd>(std::move(fd));
    used_in_slab_ = 0;
  }
  return ChunkMemory{.file = slab_, .offset = granularity_ * used_in_slab_++};
}

}  // namespace allocd
