#include "server/pool/chunk_source.h"

namespace allocd {

ChunkSource::~ChunkSource() = default;

absl::StatusOr<UniqueFd> ChunkSource::OpenForClient(
    const ChunkMemory& memory) const {
  return DuplicateFd(memory.file->get());
}

}  // namespace allocd
