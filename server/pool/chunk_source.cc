#include "server/pool/chunk_source.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace allocd {

ChunkSource::~ChunkSource() = default;

absl::StatusOr<UniqueFd> ChunkSource::OpenForClient(
    const ChunkMemory& memory) const {
  UniqueFd copy(fcntl(memory.file->get(), F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) {
    const int error = errno;
    std::string message = absl::StrCat("dup of a chunk's FD: ", strerror(error));
    return error == EMFILE || error == ENFILE
               ? absl::ResourceExhaustedError(message)
               : absl::InternalError(message);
  }
  return copy;
}

}  // namespace allocd
