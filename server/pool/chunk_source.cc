#include "server/pool/chunk_source.h"

#include "absl/strings/str_cat.h"

namespace allocd {

ChunkSource::~ChunkSource() = default;

absl::StatusOr<UniqueFd> ChunkSource::OpenForClient(
    const ChunkMemory& memory) const {
  return DuplicateFd(memory.file->get());
}

absl::StatusOr<ChunkMemory> ChunkSource::AdoptChunk(UniqueFd fd,
                                                    uint64_t offset,
                                                    uint64_t bytes) const {
  (void)fd;
  (void)offset;
  (void)bytes;
  return absl::UnimplementedError(absl::StrCat(
      "the ", Name(), " source cannot take a chunk back from a client"));
}

}  // namespace allocd
