#include "server/pool/chunk_source.h"

namespace allocd {

ChunkSource::~ChunkSource() = default;

}  // namespace allocd
