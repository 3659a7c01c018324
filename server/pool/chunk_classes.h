// ChunkClasses: the few sizes a node pool's chunks come in, and how a
// request is split into them.
//
// A chunk is one physical allocation, and a client maps each chunk whole
// (CUDA's cuMemMap takes an allocation only from its offset 0), so what a
// client pays per segment is an import and a map per chunk: a 2 GiB
// cudaMalloc served by 2 MiB chunks is 1,024 of each (about 90 ms on an
// H100, against 0.3 ms for the native cudaMalloc). So chunks come in a few
// sizes, the pool's classes, by default 2 MiB, 16 MiB, 128 MiB and 1 GiB
// (each 8x the last; DefaultChunkClasses), and a request is split greedily,
// largest class first (Split): 2 GiB is 2 chunks, a 20 MiB segment
// (PyTorch's large-pool unit) is 16 + 2 + 2 MiB, and no request maps more
// than 7 chunks of each class below 1 GiB. The split is exact (every class
// is a multiple of the smallest), so no byte is wasted: a grant is the
// request rounded up to the smallest class (RoundUp).
// Classes rather than chunks of the exact requested size, because cached
// chunks must serve requests of other sizes: a freed 2 GiB segment is
// 2 x 1 GiB that any request of 1 GiB or more reuses whole, where an exact
// 2 GiB chunk would serve only another 2 GiB request. Ratio 8 keeps both
// the chunks per request and the number of classes (4) small.
//
// Immutable, so thread-safe.
#ifndef ALLOCD_SERVER_POOL_CHUNK_CLASSES_H_
#define ALLOCD_SERVER_POOL_CHUNK_CLASSES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace allocd {

// The daemon's chunk sizes for a source of `granularity`: it, 8x, 64x and
// 512x (2 MiB, 16 MiB, 128 MiB, 1 GiB on a GPU).
std::vector<uint64_t> DefaultChunkClasses(uint64_t granularity);

class ChunkClasses {
 public:
  // The sizes of `sizes` that are positive multiples of `granularity` (a
  // source's: every chunk is a multiple of it), others dropped, plus
  // `granularity` itself, the smallest class, when missing.
  ChunkClasses(std::vector<uint64_t> sizes, uint64_t granularity);

  // The smallest class: every grant is a multiple of it.
  uint64_t smallest() const { return sizes_.front(); }
  // Ascending, without duplicates; the first is smallest().
  const std::vector<uint64_t>& sizes() const { return sizes_; }
  bool Contains(uint64_t bytes) const;
  // "2.00 MiB, 16.00 MiB, ...", for messages (FormatSize each).
  std::string Describe() const;

  // `bytes` rounded up to a multiple of the smallest class. `bytes` must be
  // at most UINT64_MAX less the smallest class (a pool rounds only requests
  // within its capacity), or the result overflows.
  uint64_t RoundUp(uint64_t bytes) const {
    return (bytes / smallest() + (bytes % smallest() != 0)) * smallest();
  }
  // `bytes` (a multiple of the smallest class) as chunk sizes, largest
  // first, none above `max_chunk_bytes` (the smallest class at least).
  std::vector<uint64_t> Split(uint64_t bytes,
                              uint64_t max_chunk_bytes = UINT64_MAX) const;

 private:
  std::vector<uint64_t> sizes_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_CHUNK_CLASSES_H_
