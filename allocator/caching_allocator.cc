#include "allocator/caching_allocator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/size_rounding.h"

namespace allocd {

CachingAllocator::CachingAllocator(const AllocatorConfig& config,
                                   DeviceBackend* backend)
    : config_(config), backend_(backend) {
  UpdateMaxSplitStat();
  // per_process_memory_fraction acts when the allocator is created, as
  // set_per_process_memory_fraction would right after.
  if (config.per_process_memory_fraction < 1.0) {
    SetMemoryFraction(config.per_process_memory_fraction);
  }
}

CachingAllocator::~CachingAllocator() {
  // Hand every byte back, as a process exit would: whole segments, mapped
  // expandable ranges, then the reservations behind them.
  for (const SegmentInfo& segment : Snapshot()) {
    if (segment.is_expandable) {
      backend_->UnmapPages(segment.address, segment.total_size);
    } else {
      backend_->FreeSegment(segment.address, segment.total_size);
    }
  }
  for (const ExpandableSegment& es : expandable_segments_) {
    if (es.live) backend_->ReleaseAddressRange(es.base, es.num_pages * es.page_size);
  }
}

void CachingAllocator::UpdateMaxSplitStat() {
  // PyTorch stores SIZE_MAX in an int64_t: "unset" reads as -1.
  stats_.max_split_size = static_cast<int64_t>(config_.max_split_size);
}

void CachingAllocator::Reconfigure(const AllocatorConfig& config) {
  // PyTorch sets stats.max_split_size only when DeviceCachingAllocator is
  // constructed; _set_allocator_settings does not update it.
  config_ = config;
}

void CachingAllocator::SetMemoryFraction(double fraction) {
  allowed_memory_maximum_ = static_cast<size_t>(
      fraction * static_cast<double>(backend_->TotalMemory()));
  // PyTorch 2.11 treats a fraction of 1 as no cap: garbage collection stays
  // off.
  set_fraction_ = fraction < 1.0;
}

// ---------------------------------------------------------------------------
// Block bookkeeping.

uint32_t CachingAllocator::NewBlock(uint64_t ptr, uint64_t size,
                                    StreamId stream, bool is_small) {
  uint32_t b;
  if (!free_slots_.empty()) {
    b = free_slots_.back();
    free_slots_.pop_back();
  } else {
    b = static_cast<uint32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  Block& block = blocks_[b];
  const uint32_t generation = block.generation;
  block = Block{};
  block.generation = generation;
  block.ptr = ptr;
  block.size = size;
  block.stream = stream;
  block.is_small = is_small;
  block.in_use = true;
  return b;
}

uint32_t CachingAllocator::NewNeighbour(uint32_t of, uint64_t ptr,
                                        uint64_t size, Side side) {
  const uint32_t n = NewBlock(ptr, size, blocks_[of].stream, blocks_[of].is_small);
  Block& node = blocks_[n];
  Block& ref = blocks_[of];
  node.expandable_segment = ref.expandable_segment;
  if (side == Side::kBefore) {
    node.prev = ref.prev;
    node.next = of;
    if (ref.prev != kNone) blocks_[ref.prev].next = n;
    ref.prev = n;
  } else {
    node.next = ref.next;
    node.prev = of;
    if (ref.next != kNone) blocks_[ref.next].prev = n;
    ref.next = n;
  }
  return n;
}

void CachingAllocator::DeleteBlock(uint32_t b) {
  blocks_[b].in_use = false;
  ++blocks_[b].generation;
  free_slots_.push_back(b);
}

CachingAllocator::SizeKey CachingAllocator::SizeKeyOf(uint32_t b) const {
  const Block& block = blocks_[b];
  return SizeKey{block.stream, block.size, block.ptr, b};
}

CachingAllocator::AddressKey CachingAllocator::AddressKeyOf(uint32_t b) const {
  const Block& block = blocks_[b];
  return AddressKey{block.stream, block.ptr, b};
}

void CachingAllocator::InsertIntoBlocks(Pool& pool, uint32_t b) {
  blocks_[b].gc_count_base = pool.get_free_blocks_call_count;
  pool.blocks.insert(SizeKeyOf(b));
}

void CachingAllocator::EraseFromBlocks(Pool& pool, uint32_t b) {
  pool.blocks.erase(SizeKeyOf(b));
}

bool CachingAllocator::GcActive() const {
  return set_fraction_ && config_.garbage_collection_threshold > 0.0;
}

bool CachingAllocator::IsLive(const Allocation& a) const {
  return a.block < blocks_.size() && blocks_[a.block].in_use &&
         blocks_[a.block].generation == a.generation;
}

// ---------------------------------------------------------------------------
// malloc

absl::StatusOr<Allocation> CachingAllocator::Malloc(size_t orig_size,
                                                    StreamId stream) {
  const size_t size = RoundSize(orig_size, config_);
  Pool& pool = IsSmallSize(size) ? small_pool_ : large_pool_;
  Request r{size, SegmentSizeFor(size, config_.large_segment_size), stream, &pool};

  bool found = GetFreeBlock(r);
  if (!found) {
    if (GcActive()) GarbageCollectCachedBlocks();
    found = AllocBlock(r, /*is_retry=*/false) ||
            (r.error.ok() && ReleaseAvailableCachedBlocks(r) &&
             AllocBlock(r, false));
    if (!found && r.error.ok()) {
      ReleaseCachedBlocks();
      found = AllocBlock(r, /*is_retry=*/true);
    }
  }
  if (!found) {
    if (!r.error.ok()) return r.error;
    ++stats_.num_ooms;
    return OutOfMemory(r);
  }
  return AllocFoundBlock(r, orig_size, ShouldSplit(blocks_[r.block], size));
}

bool CachingAllocator::GetFreeBlock(Request& r) {
  Pool& pool = *r.pool;
  if (GcActive()) ++pool.get_free_blocks_call_count;
  auto it = pool.blocks.lower_bound(SizeKey{r.stream, r.size, 0, 0});
  if (it == pool.blocks.end() || it->stream != r.stream) return false;

  if (blocks_[it->block].expandable_segment != kNone) {
    if (config_.expandable_segments) {
      // An expandable block's best-fit size is what it can grow to: its own
      // size plus the unmapped range right after it.
      auto expandable_size = [this](uint32_t b) {
        const Block& block = blocks_[b];
        const bool grows =
            block.next != kNone && !blocks_[block.next].mapped;
        return block.size + (grows ? blocks_[block.next].size : 0);
      };
      auto next = std::next(it);
      while (blocks_[it->block].expandable_segment != kNone &&
             next != pool.blocks.end() && next->stream == r.stream &&
             expandable_size(next->block) < expandable_size(it->block)) {
        it = next++;
      }
    } else {
      // Expandable segments were switched off: skip their blocks.
      do {
        ++it;
      } while (it != pool.blocks.end() &&
               blocks_[it->block].expandable_segment != kNone &&
               it->stream == r.stream);
      if (it == pool.blocks.end() || it->stream != r.stream) return false;
    }
  }

  const size_t max_split = config_.max_split_size;
  // Oversize blocks are kept for oversize requests...
  if (r.size < max_split && it->size >= max_split) return false;
  // ...and those may waste at most max_non_split_rounding.
  if (r.size >= max_split &&
      it->size >= r.size + config_.max_non_split_rounding) {
    return false;
  }
  r.block = it->block;
  pool.blocks.erase(it);
  return true;
}

bool CachingAllocator::ShouldSplit(const Block& block, size_t size) const {
  const size_t remaining = block.size - size;
  if (block.is_small || config_.expandable_segments) {
    return remaining >= kMinBlockSize;
  }
  return size < config_.max_split_size && remaining > kSmallSize;
}

Allocation CachingAllocator::AllocFoundBlock(Request& r, size_t orig_size,
                                             bool split) {
  const bool small = r.pool->is_small;
  uint32_t b = r.block;
  const bool already_split = blocks_[b].is_split();
  if (split) {
    const uint32_t remaining = b;
    // The allocation takes the low addresses; the rest stays free.
    b = NewNeighbour(remaining, blocks_[remaining].ptr, r.size, Side::kBefore);
    Block& block = blocks_[b];
    Block& rest = blocks_[remaining];
    rest.ptr += r.size;
    rest.size -= r.size;
    InsertIntoBlocks(*r.pool, remaining);
    if (block.expandable_segment == kNone) {
      if (already_split) {
        // An inactive split block shrinks by the bytes handed out.
        stats_.inactive_split_bytes.Decrease(small, block.size);
      } else {
        stats_.inactive_split_bytes.Increase(small, rest.size);
        stats_.inactive_split.Increase(small, 1);
      }
    }
  } else if (already_split && blocks_[b].expandable_segment == kNone) {
    stats_.inactive_split_bytes.Decrease(small, blocks_[b].size);
    stats_.inactive_split.Decrease(small, 1);
  }

  Block& block = blocks_[b];
  block.allocated = true;
  block.requested_size = orig_size;
  const auto size = static_cast<int64_t>(block.size);
  stats_.allocation.Increase(small, 1);
  stats_.allocated_bytes.Increase(small, size);
  stats_.active.Increase(small, 1);
  stats_.active_bytes.Increase(small, size);
  stats_.requested_bytes.Increase(small, static_cast<int64_t>(orig_size));
  if (block.size >= config_.max_split_size) {
    stats_.oversize_allocations.Increase(1);
  }
  return Allocation{block.ptr, block.size, b, block.generation};
}

bool CachingAllocator::AllocBlock(Request& r, bool is_retry) {
  const size_t size = r.alloc_size;
  if (is_retry) ++stats_.num_alloc_retries;
  if (set_fraction_ &&
      total_allocated_memory_ + size > allowed_memory_maximum_) {
    return false;
  }
  if (config_.expandable_segments) {
    r.block = TryAllocateExpandableBlock(r);
    return r.block != kNone;
  }
  absl::StatusOr<uint64_t> ptr = backend_->AllocateSegment(size);
  if (!ptr.ok()) {
    if (!absl::IsResourceExhausted(ptr.status())) r.error = ptr.status();
    return false;
  }
  total_allocated_memory_ += size;
  r.block = NewBlock(*ptr, size, r.stream, r.pool->is_small);
  stats_.segment.Increase(r.pool->is_small, 1);
  stats_.reserved_bytes.Increase(r.pool->is_small, static_cast<int64_t>(size));
  if (size >= config_.max_split_size) stats_.oversize_segments.Increase(1);
  ++stats_.num_device_alloc;
  return true;
}

absl::Status CachingAllocator::OutOfMemory(const Request& r) const {
  const int64_t allocated = stats_.allocated_bytes.all().current;
  const int64_t reserved = stats_.reserved_bytes.all().current;
  return absl::ResourceExhaustedError(absl::StrCat(
      "CUDA out of memory. Tried to allocate ", FormatSize(r.alloc_size),
      ". GPU 0 has a total capacity of ", FormatSize(backend_->TotalMemory()),
      " of which ", FormatSize(backend_->FreeMemory()), " is free. ",
      set_fraction_
          ? absl::StrCat(FormatSize(allowed_memory_maximum_), " allowed; ")
          : "",
      "Of the allocated memory ", FormatSize(allocated),
      " is allocated by PyTorch, and ", FormatSize(reserved - allocated),
      " is reserved by PyTorch but unallocated."));
}

// ---------------------------------------------------------------------------
// free

absl::Status CachingAllocator::Free(const Allocation& allocation) {
  if (absl::Status s = RequestFree(allocation); !s.ok()) return s;
  FreeBlock(allocation.block);
  return absl::OkStatus();
}

absl::Status CachingAllocator::FreeDeferred(const Allocation& allocation) {
  if (absl::Status s = RequestFree(allocation); !s.ok()) return s;
  blocks_[allocation.block].free_pending = true;
  pending_frees_.push_back({allocation.block, allocation.generation});
  return absl::OkStatus();
}

void CachingAllocator::CompleteFree(const Allocation& allocation) {
  if (IsLive(allocation) && blocks_[allocation.block].free_pending) {
    FreeBlock(allocation.block);
  }
}

absl::Status CachingAllocator::RequestFree(const Allocation& allocation) {
  if (!IsLive(allocation) || !blocks_[allocation.block].allocated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid device pointer: 0x", absl::Hex(allocation.address),
        " is not an allocation of this allocator (double free?)"));
  }
  Block& block = blocks_[allocation.block];
  block.allocated = false;
  const auto size = static_cast<int64_t>(block.size);
  stats_.allocation.Decrease(block.is_small, 1);
  stats_.allocated_bytes.Decrease(block.is_small, size);
  if (block.size >= config_.max_split_size) {
    stats_.oversize_allocations.Decrease(1);
  }
  return absl::OkStatus();
}

void CachingAllocator::FreeBlock(uint32_t b) {
  Block& block = blocks_[b];
  block.free_pending = false;
  const bool small = block.is_small;
  const auto original_size = static_cast<int64_t>(block.size);
  const auto requested_size = static_cast<int64_t>(block.requested_size);
  Pool& pool = PoolOf(block);

  int64_t net_inactive_blocks = 0;
  int64_t net_inactive_bytes = 0;
  for (const uint32_t candidate : {block.prev, block.next}) {
    const size_t subsumed = TryMergeBlocks(b, candidate, pool);
    if (subsumed > 0) {
      net_inactive_blocks -= 1;
      net_inactive_bytes -= static_cast<int64_t>(subsumed);
    }
  }
  InsertIntoBlocks(pool, b);
  const Block& merged = blocks_[b];
  if (merged.is_split()) {
    net_inactive_blocks += 1;
    net_inactive_bytes += static_cast<int64_t>(merged.size);
  }
  // PyTorch leaves expandable segments out of inactive_split: their free
  // pages can always be unmapped.
  if (merged.expandable_segment == kNone) {
    if (net_inactive_blocks > 0) {
      stats_.inactive_split.Increase(small, net_inactive_blocks);
    } else if (net_inactive_blocks < 0) {
      stats_.inactive_split.Decrease(small, -net_inactive_blocks);
    }
    if (net_inactive_bytes > 0) {
      stats_.inactive_split_bytes.Increase(small, net_inactive_bytes);
    } else if (net_inactive_bytes < 0) {
      stats_.inactive_split_bytes.Decrease(small, -net_inactive_bytes);
    }
  }
  stats_.active.Decrease(small, 1);
  stats_.active_bytes.Decrease(small, original_size);
  stats_.requested_bytes.Decrease(small, requested_size);
}

size_t CachingAllocator::TryMergeBlocks(uint32_t dst, uint32_t src,
                                        Pool& pool) {
  if (src == kNone) return 0;
  Block& s = blocks_[src];
  Block& d = blocks_[dst];
  if (s.allocated || s.free_pending || d.mapped != s.mapped) return 0;
  if (d.prev == src) {  // [src dst]
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (d.prev != kNone) blocks_[d.prev].next = dst;
  } else {  // [dst src]
    d.next = s.next;
    if (d.next != kNone) blocks_[d.next].prev = dst;
  }
  const size_t subsumed = s.size;
  if (s.mapped) {
    pool.blocks.erase(SizeKey{s.stream, s.size, s.ptr, src});
  } else {
    pool.unmapped.erase(AddressKey{s.stream, s.ptr, src});
  }
  d.size += subsumed;
  DeleteBlock(src);
  return subsumed;
}

// ---------------------------------------------------------------------------
// Giving memory back.

bool CachingAllocator::ReleaseAvailableCachedBlocks(const Request& r) {
  const size_t max_split = config_.max_split_size;
  if (max_split == std::numeric_limits<size_t>::max()) return false;
  Pool& pool = *r.pool;
  const size_t key_size = std::max(r.size, max_split);
  auto it = pool.blocks.lower_bound(SizeKey{r.stream, key_size, 0, 0});
  if (it != pool.blocks.end() && it->stream == r.stream &&
      blocks_[it->block].expandable_segment == kNone) {
    ReleaseBlock(it->block);
    return true;
  }
  // No single oversize block is large enough: free oversize blocks from the
  // largest down until enough bytes are free.
  if (it == pool.blocks.begin()) return false;
  std::vector<uint32_t> victims;
  size_t released = 0;
  do {
    --it;
    if (released >= key_size || it->size < max_split ||
        it->stream != r.stream) {
      break;
    }
    if (blocks_[it->block].expandable_segment == kNone) {
      released += it->size;
      victims.push_back(it->block);
    }
  } while (it != pool.blocks.begin());
  for (const uint32_t b : victims) ReleaseBlock(b);
  return released >= key_size;
}

void CachingAllocator::ReleaseCachedBlocks() {
  SynchronizeAndFreeEvents();
  ReleaseBlocks(large_pool_);
  ReleaseBlocks(small_pool_);
}

void CachingAllocator::EmptyCache() { ReleaseCachedBlocks(); }

uint64_t CachingAllocator::ReleaseCached(uint64_t bytes) {
  if (bytes == 0) return 0;
  const int64_t reserved = stats_.reserved_bytes.all().current;
  // What each free block would give back, smallest first.
  std::vector<std::pair<uint64_t, uint32_t>> candidates;
  uint64_t cached = 0;
  for (const Pool* pool : {&large_pool_, &small_pool_}) {
    for (const SizeKey& key : pool->blocks) {
      const Block& block = blocks_[key.block];
      uint64_t size = 0;
      if (block.expandable_segment != kNone) {
        const auto [first, end] = WholePages(key.block);
        if (first < end) {
          size = (end - first) *
                 expandable_segments_[block.expandable_segment].page_size;
        }
      } else if (!block.is_split()) {
        size = block.size;
      }
      if (size == 0) continue;
      candidates.emplace_back(size, key.block);
      cached += size;
    }
  }
  if (cached < bytes) {
    ReleaseCachedBlocks();
  } else {
    std::sort(candidates.begin(), candidates.end());
    auto it = std::lower_bound(candidates.begin(), candidates.end(),
                               std::pair<uint64_t, uint32_t>{bytes, 0});
    if (it != candidates.end()) {
      ReleaseFreeBlock(it->second);
    } else {
      uint64_t released = 0;
      while (released < bytes) {
        --it;
        released += it->first;
        ReleaseFreeBlock(it->second);
      }
    }
  }
  return static_cast<uint64_t>(reserved - stats_.reserved_bytes.all().current);
}

void CachingAllocator::SynchronizeAndFreeEvents() {
  ++stats_.num_sync_all_streams;
  std::vector<std::pair<uint32_t, uint32_t>> pending;
  pending.swap(pending_frees_);
  for (const auto& [b, generation] : pending) {
    if (blocks_[b].in_use && blocks_[b].generation == generation &&
        blocks_[b].free_pending) {
      FreeBlock(b);
    }
  }
}

void CachingAllocator::ReleaseBlocks(Pool& pool) {
  std::vector<uint32_t> to_release;
  std::vector<uint32_t> to_unmap;
  for (const SizeKey& key : pool.blocks) {
    const Block& block = blocks_[key.block];
    if (block.expandable_segment != kNone) {
      to_unmap.push_back(key.block);
    } else if (!block.is_split()) {
      to_release.push_back(key.block);
    }
  }
  for (const uint32_t b : to_release) ReleaseBlock(b);
  for (const uint32_t b : to_unmap) ReleaseFreeBlock(b);
}

void CachingAllocator::ReleaseFreeBlock(uint32_t b) {
  if (blocks_[b].expandable_segment == kNone) {
    ReleaseBlock(b);
    return;
  }
  UnmapBlock(b);
  if (!blocks_[b].is_split()) ReleaseExpandableSegment(b);
}

void CachingAllocator::ReleaseBlock(uint32_t b) {
  const Block& block = blocks_[b];
  ++stats_.num_device_free;
  backend_->FreeSegment(block.ptr, block.size);
  total_allocated_memory_ -= block.size;
  const auto size = static_cast<int64_t>(block.size);
  stats_.segment.Decrease(block.is_small, 1);
  stats_.reserved_bytes.Decrease(block.is_small, size);
  if (block.size >= config_.max_split_size) stats_.oversize_segments.Decrease(1);
  EraseFromBlocks(PoolOf(block), b);
  DeleteBlock(b);
}

void CachingAllocator::GarbageCollectCachedBlocks() {
  const auto gc_threshold = static_cast<size_t>(
      config_.garbage_collection_threshold *
      static_cast<double>(allowed_memory_maximum_));
  if (total_allocated_memory_ <= gc_threshold) return;
  const size_t target_size = total_allocated_memory_ - gc_threshold;
  size_t reclaimed = 0;

  Pool& pool = large_pool_;
  auto age = [&](uint32_t b) {
    return static_cast<int64_t>(static_cast<int>(
        pool.get_free_blocks_call_count - blocks_[b].gc_count_base));
  };
  int64_t total_age = 0;
  int freeable = 0;
  for (const SizeKey& key : pool.blocks) {
    if (!blocks_[key.block].is_split()) {
      total_age += age(key.block);
      ++freeable;
    }
  }
  if (freeable == 0) return;

  // Free blocks at least as old as the average, repeating until the target
  // is met or nothing more goes; each pass frees every such block even past
  // the target, so that GC does not run again soon.
  bool freed_any = true;
  std::vector<uint32_t> victims;
  while (reclaimed < target_size && freed_any && freeable > 0) {
    const double age_threshold =
        static_cast<double>(total_age) / static_cast<double>(freeable);
    victims.clear();
    for (const SizeKey& key : pool.blocks) {
      const Block& block = blocks_[key.block];
      if (!block.is_split() && block.expandable_segment == kNone &&
          static_cast<double>(age(key.block)) >= age_threshold) {
        victims.push_back(key.block);
      }
    }
    freed_any = !victims.empty();
    for (const uint32_t b : victims) {
      reclaimed += blocks_[b].size;
      total_age -= age(b);
      --freeable;
      ReleaseBlock(b);
    }
  }
}

// ---------------------------------------------------------------------------
// Expandable segments.

uint64_t CachingAllocator::ExpandablePages(uint64_t page) const {
  // PyTorch reserves numSegments(total + total / 8); that sum overflows for a
  // device near 2^64 bytes, so count in pages.
  const uint64_t total = backend_->TotalMemory();
  return total / page + (total / 8) / page +
         (total % page + (total / 8) % page + page - 1) / page;
}

uint32_t CachingAllocator::FindExpandableBlock(Request& r) {
  Pool& pool = *r.pool;
  auto allocatable = [this](uint32_t b) {
    return b != kNone && !blocks_[b].allocated && !blocks_[b].free_pending;
  };
  auto has_room = [&](uint32_t b) {
    size_t bytes = 0;
    while (bytes < r.size && allocatable(b)) {
      bytes += blocks_[b].size;
      b = blocks_[b].next;
    }
    return bytes >= r.size;
  };
  // The lowest address where free and unmapped space together fit the
  // request, so that a segment's blocks keep merging into one.
  for (auto it = pool.unmapped.lower_bound(AddressKey{r.stream, 0, 0});
       it != pool.unmapped.end() && it->stream == r.stream; ++it) {
    uint32_t candidate = it->block;
    if (allocatable(blocks_[candidate].prev)) {
      candidate = blocks_[candidate].prev;
    }
    if (has_room(candidate)) return candidate;
  }

  // A new segment: address space for 9/8 of the device's memory, mapped on
  // demand in 2 MiB (small pool) or 20 MiB (large pool) pages.
  const uint64_t page = pool.is_small ? kSmallBuffer : config_.large_segment_size;
  const uint64_t num_pages = ExpandablePages(page);
  if (num_pages > std::numeric_limits<uint64_t>::max() / page) {
    r.error = absl::InvalidArgumentError(absl::StrCat(
        "expandable segments: a device of ", backend_->TotalMemory(),
        " bytes cannot be reserved (9/8 of it passes 2^64)"));
    return kNone;
  }
  absl::StatusOr<uint64_t> base =
      backend_->ReserveAddressRange(num_pages * page);
  if (!base.ok()) {
    r.error = base.status();
    return kNone;
  }
  const auto segment = static_cast<uint32_t>(expandable_segments_.size());
  expandable_segments_.push_back(
      ExpandableSegment{*base, page, num_pages, r.stream, pool.is_small, true});
  const uint32_t b = NewBlock(*base, num_pages * page, r.stream, pool.is_small);
  blocks_[b].mapped = false;
  blocks_[b].expandable_segment = segment;
  pool.unmapped.insert(AddressKeyOf(b));
  return b;
}

bool CachingAllocator::MapBlock(uint32_t b, size_t size, absl::Status& error) {
  const ExpandableSegment& es =
      expandable_segments_[blocks_[b].expandable_segment];
  const uint64_t offset = blocks_[b].ptr - es.base;
  const uint64_t first_page = offset / es.page_size;
  const uint64_t end_page = (offset + size + es.page_size - 1) / es.page_size;
  if (first_page == end_page) return false;
  const uint64_t mapped_ptr = es.base + first_page * es.page_size;
  const uint64_t mapped_size = (end_page - first_page) * es.page_size;
  if (absl::Status s = backend_->MapPages(mapped_ptr, mapped_size); !s.ok()) {
    if (!absl::IsResourceExhausted(s)) error = s;
    return false;
  }

  Pool& pool = PoolOf(blocks_[b]);
  pool.unmapped.erase(AddressKeyOf(b));
  blocks_[b].mapped = true;
  if (mapped_size < blocks_[b].size) {
    // [to_map: mapped][rest: still unmapped][next]
    const uint32_t rest = NewNeighbour(b, blocks_[b].ptr + mapped_size,
                                       blocks_[b].size - mapped_size, Side::kAfter);
    blocks_[rest].mapped = false;
    blocks_[b].size = mapped_size;
    pool.unmapped.insert(AddressKeyOf(rest));
  }
  TryMergeBlocks(b, blocks_[b].prev, pool);
  TryMergeBlocks(b, blocks_[b].next, pool);
  InsertIntoBlocks(pool, b);

  total_allocated_memory_ += mapped_size;
  stats_.reserved_bytes.Increase(pool.is_small,
                                 static_cast<int64_t>(mapped_size));
  ++stats_.num_device_alloc;
  return true;
}

uint32_t CachingAllocator::TryAllocateExpandableBlock(Request& r) {
  uint32_t candidate = FindExpandableBlock(r);
  if (candidate == kNone) return kNone;
  // candidate: unmapped -> ..., or free -> unmapped -> ...
  if (!blocks_[candidate].mapped &&
      !MapBlock(candidate, std::min<size_t>(blocks_[candidate].size, r.size),
                r.error)) {
    return kNone;
  }
  while (blocks_[candidate].size < r.size) {
    // Map part of the unmapped block after it; MapBlock merges the two.
    const size_t missing = r.size - blocks_[candidate].size;
    const uint32_t next = blocks_[candidate].next;
    if (!MapBlock(next, std::min<size_t>(missing, blocks_[next].size),
                  r.error)) {
      return kNone;
    }
    candidate = next;
  }
  EraseFromBlocks(*r.pool, candidate);
  return candidate;
}

std::pair<uint64_t, uint64_t> CachingAllocator::WholePages(uint32_t b) const {
  const ExpandableSegment& es =
      expandable_segments_[blocks_[b].expandable_segment];
  const uint64_t offset = blocks_[b].ptr - es.base;
  return {(offset + es.page_size - 1) / es.page_size,
          (offset + blocks_[b].size) / es.page_size};
}

void CachingAllocator::UnmapBlock(uint32_t b) {
  const ExpandableSegment& es =
      expandable_segments_[blocks_[b].expandable_segment];
  // Only whole pages inside the block can go.
  const auto [first_page, end_page] = WholePages(b);
  if (first_page >= end_page) return;
  const uint64_t unmapped_ptr = es.base + first_page * es.page_size;
  const uint64_t unmapped_size = (end_page - first_page) * es.page_size;
  backend_->UnmapPages(unmapped_ptr, unmapped_size);

  Pool& pool = PoolOf(blocks_[b]);
  EraseFromBlocks(pool, b);
  const uint64_t before_size = unmapped_ptr - blocks_[b].ptr;
  if (before_size > 0) {
    const uint32_t before = NewNeighbour(b, blocks_[b].ptr, before_size, Side::kBefore);
    InsertIntoBlocks(pool, before);
  }
  const uint64_t after_size =
      blocks_[b].size - (before_size + unmapped_size);
  if (after_size > 0) {
    const uint32_t after = NewNeighbour(b, unmapped_ptr + unmapped_size, after_size,
                                        Side::kAfter);
    InsertIntoBlocks(pool, after);
  }
  blocks_[b].ptr = unmapped_ptr;
  blocks_[b].size = unmapped_size;
  blocks_[b].mapped = false;
  TryMergeBlocks(b, blocks_[b].prev, pool);
  TryMergeBlocks(b, blocks_[b].next, pool);
  pool.unmapped.insert(AddressKeyOf(b));

  total_allocated_memory_ -= unmapped_size;
  stats_.reserved_bytes.Decrease(pool.is_small,
                                 static_cast<int64_t>(unmapped_size));
  ++stats_.num_device_free;
}

void CachingAllocator::ReleaseExpandableSegment(uint32_t b) {
  ExpandableSegment& es = expandable_segments_[blocks_[b].expandable_segment];
  PoolOf(blocks_[b]).unmapped.erase(AddressKeyOf(b));
  backend_->ReleaseAddressRange(es.base, es.num_pages * es.page_size);
  es.live = false;
  DeleteBlock(b);
}

// ---------------------------------------------------------------------------
// Adopting a partial snapshot's state.

namespace {

absl::Status CheckAdoptedSegment(const AdoptedSegment& segment) {
  auto bad = [&segment](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adopted segment at 0x", absl::Hex(segment.address), " (",
        segment.size, " bytes): ", what));
  };
  if (segment.size == 0 || segment.size % kMinBlockSize != 0) {
    return bad("its size is not a positive multiple of 512");
  }
  if (segment.is_small && !segment.is_expandable &&
      segment.size != kSmallBuffer) {
    return bad("a small-pool segment is 2 MiB");
  }
  uint64_t end = segment.address;
  for (const AdoptedBlock& block : segment.blocks) {
    if (block.size == 0 || block.size % kMinBlockSize != 0) {
      return bad(absl::StrCat("block at 0x", absl::Hex(block.address),
                              ": its size is not a positive multiple of 512"));
    }
    if (block.address < end ||
        block.address + block.size > segment.address + segment.size) {
      return bad(absl::StrCat("block at 0x", absl::Hex(block.address), " (",
                              block.size,
                              " bytes) overlaps another or leaves the segment"));
    }
    end = block.address + block.size;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Allocation>> CachingAllocator::Adopt(
    const std::vector<AdoptedSegment>& segments) {
  if (!blocks_.empty() || !expandable_segments_.empty()) {
    return absl::FailedPreconditionError(
        "Adopt must come before the allocator's first allocation");
  }
  // The reservation each stream and pool's expandable ranges share: from
  // the lowest of them, in pages of the pool's size.
  struct Reservation {
    uint64_t base = 0;
    uint64_t end = 0;
    uint64_t page = 0;
    uint32_t index = kNone;
    uint64_t cursor = 0;  // where adopted space ends so far
    uint32_t last = kNone;
  };
  std::map<std::pair<StreamId, bool>, Reservation> reservations;
  uint64_t end = 0;
  for (const AdoptedSegment& segment : segments) {
    if (absl::Status s = CheckAdoptedSegment(segment); !s.ok()) return s;
    if (segment.address < end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adopted segment at 0x", absl::Hex(segment.address),
          " overlaps the one before it (segments must be by address)"));
    }
    end = segment.address + segment.size;
    if (!segment.is_expandable) continue;
    auto [it, fresh] = reservations.try_emplace({segment.stream, segment.is_small});
    Reservation& r = it->second;
    if (fresh) {
      r.base = r.cursor = segment.address;
      r.page = segment.is_small ? kSmallBuffer : config_.large_segment_size;
    }
    r.end = end;
    if ((segment.address - r.base) % r.page != 0 || segment.size % r.page != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adopted expandable range at 0x", absl::Hex(segment.address), " (",
          segment.size, " bytes) is not whole ", r.page,
          "-byte pages from its reservation at 0x", absl::Hex(r.base)));
    }
  }

  std::vector<Allocation> allocations;
  for (const AdoptedSegment& segment : segments) {
    const bool small = segment.is_small;
    total_allocated_memory_ += segment.size;
    stats_.reserved_bytes.Increase(small, static_cast<int64_t>(segment.size));
    if (!segment.is_expandable) {
      stats_.segment.Increase(small, 1);
      if (segment.size >= config_.max_split_size) {
        stats_.oversize_segments.Increase(1);
      }
      uint32_t last = kNone;
      AdoptBlocks(segment, kNone, last, allocations);
      continue;
    }
    Reservation& r = reservations.at({segment.stream, small});
    if (r.index == kNone) {
      const uint64_t pages = std::max(ExpandablePages(r.page),
                                      (r.end - r.base + r.page - 1) / r.page);
      r.index = static_cast<uint32_t>(expandable_segments_.size());
      expandable_segments_.push_back(ExpandableSegment{
          r.base, r.page, pages, segment.stream, small, true});
    }
    if (segment.address > r.cursor) {
      AdoptUnmapped(r.cursor, segment.address - r.cursor, segment.stream, small,
                    r.index, r.last);
    }
    AdoptBlocks(segment, r.index, r.last, allocations);
    r.cursor = segment.address + segment.size;
  }
  for (auto& [key, r] : reservations) {
    const ExpandableSegment& es = expandable_segments_[r.index];
    const uint64_t reservation_end = es.base + es.num_pages * es.page_size;
    if (r.cursor < reservation_end) {
      AdoptUnmapped(r.cursor, reservation_end - r.cursor, key.first, key.second,
                    r.index, r.last);
    }
  }
  return allocations;
}

void CachingAllocator::AdoptBlocks(const AdoptedSegment& segment,
                                   uint32_t expandable, uint32_t& last,
                                   std::vector<Allocation>& allocations) {
  const bool small = segment.is_small;
  Pool& pool = small ? small_pool_ : large_pool_;
  std::vector<uint32_t> free_blocks;
  auto append = [&](uint64_t ptr, uint64_t size) {
    const uint32_t b = NewBlock(ptr, size, segment.stream, small);
    blocks_[b].expandable_segment = expandable;
    blocks_[b].prev = last;
    if (last != kNone) blocks_[last].next = b;
    last = b;
    return b;
  };
  uint64_t cursor = segment.address;
  for (const AdoptedBlock& adopted : segment.blocks) {
    if (adopted.address > cursor) {
      free_blocks.push_back(append(cursor, adopted.address - cursor));
    }
    const uint32_t b = append(adopted.address, adopted.size);
    Block& block = blocks_[b];
    block.requested_size = adopted.requested_size;
    const auto size = static_cast<int64_t>(adopted.size);
    stats_.active.Increase(small, 1);
    stats_.active_bytes.Increase(small, size);
    stats_.requested_bytes.Increase(
        small, static_cast<int64_t>(adopted.requested_size));
    if (adopted.free_pending) {
      block.free_pending = true;
      pending_frees_.push_back({b, block.generation});
    } else {
      block.allocated = true;
      stats_.allocation.Increase(small, 1);
      stats_.allocated_bytes.Increase(small, size);
      if (adopted.size >= config_.max_split_size) {
        stats_.oversize_allocations.Increase(1);
      }
    }
    allocations.push_back(Allocation{block.ptr, block.size, b, block.generation});
    cursor = adopted.address + adopted.size;
  }
  if (cursor < segment.address + segment.size) {
    free_blocks.push_back(append(cursor, segment.address + segment.size - cursor));
  }
  for (const uint32_t b : free_blocks) {
    InsertIntoBlocks(pool, b);
    // PyTorch leaves expandable segments out of inactive_split.
    if (expandable == kNone && blocks_[b].is_split()) {
      stats_.inactive_split.Increase(small, 1);
      stats_.inactive_split_bytes.Increase(
          small, static_cast<int64_t>(blocks_[b].size));
    }
  }
}

uint32_t CachingAllocator::AdoptUnmapped(uint64_t ptr, uint64_t size,
                                         StreamId stream, bool is_small,
                                         uint32_t expandable, uint32_t& last) {
  const uint32_t b = NewBlock(ptr, size, stream, is_small);
  Block& block = blocks_[b];
  block.mapped = false;
  block.expandable_segment = expandable;
  block.prev = last;
  if (last != kNone) blocks_[last].next = b;
  last = b;
  (is_small ? small_pool_ : large_pool_).unmapped.insert(AddressKeyOf(b));
  return b;
}

// ---------------------------------------------------------------------------
// Snapshot

std::vector<SegmentInfo> CachingAllocator::Snapshot() const {
  std::vector<SegmentInfo> segments;
  for (uint32_t b = 0; b < blocks_.size(); ++b) {
    const Block& head = blocks_[b];
    if (!head.in_use || !head.mapped) continue;
    // A segment starts at a block with no mapped block before it.
    if (head.prev != kNone && blocks_[head.prev].mapped) continue;
    SegmentInfo segment{head.ptr, 0, head.stream, head.is_small,
                        head.expandable_segment != kNone, {}};
    for (uint32_t cur = b; cur != kNone && blocks_[cur].mapped;
         cur = blocks_[cur].next) {
      const Block& block = blocks_[cur];
      const BlockInfo::State state =
          block.allocated      ? BlockInfo::State::kAllocated
          : block.free_pending ? BlockInfo::State::kFreePending
                               : BlockInfo::State::kInactive;
      segment.blocks.push_back(
          BlockInfo{block.ptr, block.size, block.requested_size, state});
      segment.total_size += block.size;
    }
    segments.push_back(std::move(segment));
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) {
              return a.address < b.address;
            });
  return segments;
}

}  // namespace allocd
