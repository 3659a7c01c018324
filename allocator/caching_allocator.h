// CachingAllocator: PyTorch's CUDA caching allocator (DeviceCachingAllocator
// in c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.9-2.11), rule for rule,
// over a DeviceBackend.
//
// Same size rounding, pools, best-fit order (stream, size, address), block
// splitting and merging, max_split_size / max_non_split_rounding, garbage
// collection under a memory fraction, the OOM path (release oversize blocks,
// then flush the cache and retry, then fail), expandable segments, and
// torch.cuda.memory_stats() counters. It keeps no locks: one instance serves
// one device of one process, and callers serialise access.
#ifndef ALLOCD_ALLOCATOR_CACHING_ALLOCATOR_H_
#define ALLOCD_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/device_backend.h"
#include "allocator/stats.h"

namespace allocd {

// A stream as the allocator sees it: blocks freed on one stream are reused
// only by requests on the same stream, and free blocks are ordered by stream
// first, so give streams ids in the order of their CUDA handles.
using StreamId = uint16_t;

// What Malloc hands out. Pass it back unchanged to Free.
struct Allocation {
  uint64_t address = 0;
  // The block's size: the request rounded, or larger when the block was not
  // split.
  uint64_t size = 0;
  uint32_t block = 0;
  uint32_t generation = 0;
};

// One block of a segment, for snapshots.
struct BlockInfo {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size;
  enum class State { kAllocated, kFreePending, kInactive } state;
};

// One segment (for expandable segments: one contiguous mapped range).
struct SegmentInfo {
  uint64_t address;
  uint64_t total_size;
  StreamId stream;
  bool is_small;
  bool is_expandable;
  std::vector<BlockInfo> blocks;
};

// A block of an AdoptedSegment that the program still holds.
struct AdoptedBlock {
  uint64_t address;
  // The block's size (a multiple of 512; more than the rounded request when
  // the block was not split).
  uint64_t size;
  uint64_t requested_size;
  // Freed by the program, waiting on other streams (record_stream): active
  // but no longer allocated, as after FreeDeferred.
  bool free_pending = false;
};

// A segment the process held before the allocator's first call, as a
// partial snapshot's state at its first event describes it. For expandable
// segments: one mapped range (a snapshot's expandable "segment").
struct AdoptedSegment {
  uint64_t address;
  uint64_t size;
  StreamId stream;
  bool is_small;
  // By address; the gaps between them are cached free blocks.
  std::vector<AdoptedBlock> blocks;
  bool is_expandable = false;
};

class CachingAllocator {
 public:
  // `backend` must outlive the allocator.
  CachingAllocator(const AllocatorConfig& config, DeviceBackend* backend);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // torch.cuda caching-allocator malloc of `size` bytes for `stream`.
  // ResourceExhausted with PyTorch's "CUDA out of memory" message when even
  // a flushed cache cannot make room (num_ooms counts it).
  absl::StatusOr<Allocation> Malloc(size_t size, StreamId stream);

  // Frees an allocation whose block may be reused at once. InvalidArgument
  // for an allocation that is not live (a double free).
  absl::Status Free(const Allocation& allocation);

  // Frees an allocation that record_stream() tied to other streams: its bytes
  // stop counting as allocated now, but the block returns to the cache only
  // at CompleteFree, or earlier when the allocator synchronises all streams
  // (on a cache flush). CompleteFree after such a flush does nothing.
  absl::Status FreeDeferred(const Allocation& allocation);
  void CompleteFree(const Allocation& allocation);

  // Takes over `segments` (by address) before any other call, as if this
  // allocator had made them: each becomes a segment of its pool with its
  // blocks at their addresses, the gaps between blocks become cached free
  // blocks (merged, as PyTorch keeps them), and stats count it all as
  // current (num_device_alloc does not: the calls were made before). The
  // mapped ranges of expandable segments of one stream and pool become one
  // expandable segment whose reservation starts at the lowest of them (its
  // usual size, or more to hold them all); the space between them is
  // unmapped. The backend must already hold the segments' memory
  // (SimBackend::AdoptRange). Returns each block's Allocation, segment by
  // segment, for Free/FreeDeferred, or CompleteFree for a free_pending one.
  // InvalidArgument, with nothing adopted, for segments that overlap, a block
  // outside its segment or overlapping another, sizes that are not multiples
  // of 512, a small segment that is not 2 MiB, or a mapped range that is not
  // whole pages from its reservation's start; FailedPrecondition after the
  // first Malloc.
  absl::StatusOr<std::vector<Allocation>> Adopt(
      const std::vector<AdoptedSegment>& segments);

  // torch.cuda.empty_cache(): waits for deferred frees and returns every
  // unsplit cached segment (and every unmappable expandable page).
  void EmptyCache();

  // Gives back at least `bytes` of the cache, no more segments than that
  // takes (a neighbour short of memory asked for them: what this process
  // cached and keeps serves its next peak without mapping again). Picks as
  // PyTorch's release_available_cached_blocks picks oversize blocks on the
  // OOM path, over every free whole segment of both pools and streams: the
  // smallest that covers `bytes` alone, else the largest down until they
  // cover it. The whole pages under a free expandable block count as a
  // segment of their size. Releases everything EmptyCache does when those
  // cannot cover `bytes` (blocks whose free waits on other streams may).
  // Returns the reserved bytes released (0 for `bytes` 0).
  uint64_t ReleaseCached(uint64_t bytes);

  // torch.cuda.set_per_process_memory_fraction(fraction): caps reserved
  // memory at fraction x the backend's total memory; only under a cap does
  // garbage_collection_threshold act. `fraction` in [0, 1].
  void SetMemoryFraction(double fraction);

  // torch.cuda.memory._set_allocator_settings applied live: later decisions
  // follow `config`; blocks already cached stay where they are, as in
  // PyTorch (expandable blocks are skipped once expandable_segments is off).
  void Reconfigure(const AllocatorConfig& config);

  const AllocatorConfig& config() const { return config_; }
  const DeviceStats& Stats() const { return stats_; }
  void ResetPeakStats() { stats_.ResetPeaks(); }
  void ResetAccumulatedStats() { stats_.ResetAccumulated(); }

  // Every segment and its blocks, by address (torch.cuda.memory_snapshot()).
  std::vector<SegmentInfo> Snapshot() const;

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};

  struct Block {
    uint64_t ptr = 0;
    uint64_t size = 0;
    uint64_t requested_size = 0;
    int64_t gc_count_base = 0;
    uint32_t prev = kNone;
    uint32_t next = kNone;
    uint32_t expandable_segment = kNone;
    uint32_t generation = 0;
    StreamId stream = 0;
    bool is_small = false;
    bool allocated = false;
    // Free requested, block not yet back in the cache (stream uses pending).
    bool free_pending = false;
    bool mapped = true;
    bool in_use = false;  // the slot holds a live block

    bool is_split() const { return prev != kNone || next != kNone; }
  };

  // Free blocks by PyTorch's BlockComparatorSize: (stream, size, address).
  struct SizeKey {
    StreamId stream;
    uint64_t size;
    uint64_t ptr;
    uint32_t block;
    bool operator<(const SizeKey& o) const {
      if (stream != o.stream) return stream < o.stream;
      if (size != o.size) return size < o.size;
      return ptr < o.ptr;
    }
  };
  // Unmapped expandable ranges by BlockComparatorAddress: (stream, address).
  struct AddressKey {
    StreamId stream;
    uint64_t ptr;
    uint32_t block;
    bool operator<(const AddressKey& o) const {
      if (stream != o.stream) return stream < o.stream;
      return ptr < o.ptr;
    }
  };

  struct Pool {
    bool is_small;
    absl::btree_set<SizeKey> blocks;
    absl::btree_set<AddressKey> unmapped;
    int64_t get_free_blocks_call_count = 0;
  };

  struct ExpandableSegment {
    uint64_t base = 0;
    uint64_t page_size = 0;
    uint64_t num_pages = 0;  // the reserved range, in pages
    StreamId stream = 0;
    bool is_small = false;
    bool live = false;
  };

  // PyTorch's AllocParams.
  struct Request {
    size_t size;        // rounded
    size_t alloc_size;  // segment size if a new one is needed
    StreamId stream;
    Pool* pool;
    uint32_t block = kNone;
    // A backend failure other than running out of memory.
    absl::Status error;
  };

  uint32_t NewBlock(uint64_t ptr, uint64_t size, StreamId stream,
                    bool is_small);
  enum class Side { kBefore, kAfter };
  // A new block of `of`'s stream, pool and segment, linked into the segment
  // right before or after it.
  uint32_t NewNeighbour(uint32_t of, uint64_t ptr, uint64_t size, Side side);
  void DeleteBlock(uint32_t b);
  Pool& PoolOf(const Block& block) {
    return block.is_small ? small_pool_ : large_pool_;
  }
  SizeKey SizeKeyOf(uint32_t b) const;
  AddressKey AddressKeyOf(uint32_t b) const;
  void InsertIntoBlocks(Pool& pool, uint32_t b);
  void EraseFromBlocks(Pool& pool, uint32_t b);
  bool GcActive() const;

  bool GetFreeBlock(Request& r);
  bool ShouldSplit(const Block& block, size_t size) const;
  Allocation AllocFoundBlock(Request& r, size_t orig_size, bool split);
  bool AllocBlock(Request& r, bool is_retry);
  bool ReleaseAvailableCachedBlocks(const Request& r);
  void ReleaseCachedBlocks();
  void ReleaseBlocks(Pool& pool);
  void ReleaseBlock(uint32_t b);
  // Gives back free block `b` as release_cached_blocks does: its segment
  // (`b` is one whole), or for an expandable block the pages under it (and
  // its segment's range once none of it is mapped).
  void ReleaseFreeBlock(uint32_t b);
  void GarbageCollectCachedBlocks();
  void SynchronizeAndFreeEvents();
  absl::Status RequestFree(const Allocation& allocation);
  void FreeBlock(uint32_t b);
  size_t TryMergeBlocks(uint32_t dst, uint32_t src, Pool& pool);
  bool IsLive(const Allocation& a) const;

  // Expandable segments.
  uint32_t FindExpandableBlock(Request& r);
  // False when the pages cannot be mapped; a failure other than running out
  // of memory is also stored in `error`.
  bool MapBlock(uint32_t b, size_t size, absl::Status& error);
  uint32_t TryAllocateExpandableBlock(Request& r);
  void UnmapBlock(uint32_t b);
  // The whole pages inside expandable block `b`, as [first, end) page
  // indexes of its segment: what UnmapBlock unmaps.
  std::pair<uint64_t, uint64_t> WholePages(uint32_t b) const;
  void ReleaseExpandableSegment(uint32_t b);
  // Adopt's parts: the blocks of one adopted segment (or mapped range)
  // linked after `last`, and the unmapped space of an expandable segment.
  void AdoptBlocks(const AdoptedSegment& segment, uint32_t expandable,
                   uint32_t& last, std::vector<Allocation>& allocations);
  uint32_t AdoptUnmapped(uint64_t ptr, uint64_t size, StreamId stream,
                         bool is_small, uint32_t expandable, uint32_t& last);
  uint64_t ExpandablePages(uint64_t page) const;

  absl::Status OutOfMemory(const Request& r) const;
  void UpdateMaxSplitStat();

  AllocatorConfig config_;
  DeviceBackend* backend_;
  DeviceStats stats_;
  Pool small_pool_{.is_small = true};
  Pool large_pool_{.is_small = false};
  std::vector<Block> blocks_;
  std::vector<uint32_t> free_slots_;
  std::vector<ExpandableSegment> expandable_segments_;
  // Blocks whose free waits on other streams (FreeDeferred, no CompleteFree).
  // (block, generation) pairs; entries already completed are skipped.
  std::vector<std::pair<uint32_t, uint32_t>> pending_frees_;
  // PyTorch's total_allocated_memory: what the fraction limit compares to.
  size_t total_allocated_memory_ = 0;
  bool set_fraction_ = false;
  size_t allowed_memory_maximum_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_CACHING_ALLOCATOR_H_
