#include "server/pool/chunk_classes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"
#include "allocator/bytes.h"

namespace allocd {

std::vector<uint64_t> DefaultChunkClasses(uint64_t granularity) {
  return {granularity, 8 * granularity, 64 * granularity, 512 * granularity};
}

ChunkClasses::ChunkClasses(std::vector<uint64_t> sizes, uint64_t granularity)
    : sizes_(std::move(sizes)) {
  std::erase_if(sizes_,
                [&](uint64_t c) { return c == 0 || c % granularity != 0; });
  sizes_.push_back(granularity);
  std::sort(sizes_.begin(), sizes_.end());
  sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
}

bool ChunkClasses::Contains(uint64_t bytes) const {
  return std::binary_search(sizes_.begin(), sizes_.end(), bytes);
}

std::string ChunkClasses::Describe() const {
  return absl::StrJoin(sizes_, ", ", [](std::string* out, uint64_t size) {
    out->append(FormatSize(size));
  });
}

std::vector<uint64_t> ChunkClasses::Split(uint64_t bytes,
                                          uint64_t max_chunk_bytes) const {
  std::vector<uint64_t> split;
  for (auto c = sizes_.rbegin(); c != sizes_.rend(); ++c) {
    if (*c > max_chunk_bytes && *c != smallest()) continue;
    split.insert(split.end(), bytes / *c, *c);
    bytes %= *c;
  }
  return split;
}

}  // namespace allocd
