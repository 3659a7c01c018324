#include "allocator/trace/async_pool_model.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/strings/str_format.h"

namespace allocd {
namespace {

constexpr uint64_t kChunk = uint64_t{32} << 20;
// Requests above 1 MiB take whole 2 MiB pages; smaller ones 512-byte units.
constexpr uint64_t kLargeThreshold = uint64_t{1} << 20;
constexpr uint64_t kPage = uint64_t{2} << 20;
constexpr uint64_t kGranule = 512;

uint64_t PoolSize(uint64_t bytes) {
  const uint64_t unit = bytes > kLargeThreshold ? kPage : kGranule;
  return (bytes + unit - 1) / unit * unit;
}

// One growable address range: free space kept by address (for merging) and
// by (size, address) (for best fit); the end grows a chunk at a time.
class AsyncPool {
 public:
  explicit AsyncPool(uint64_t capacity) : capacity_(capacity) {}

  // Returns the address, or nullopt when the pool cannot grow enough.
  std::optional<uint64_t> Allocate(uint64_t bytes) {
    bytes = PoolSize(bytes);
    auto fit = by_size_.lower_bound({bytes, 0});
    if (fit == by_size_.end()) {
      if (!Grow(bytes)) return std::nullopt;
      fit = by_size_.lower_bound({bytes, 0});
    }
    const auto [size, address] = *fit;
    Erase(address, size);
    if (size > bytes) Insert(address + bytes, size - bytes);
    return address;
  }

  void Free(uint64_t address, uint64_t bytes) {
    bytes = PoolSize(bytes);
    auto next = by_address_.lower_bound(address);
    if (next != by_address_.end() && next->first == address + bytes) {
      const uint64_t next_size = next->second;
      Erase(next->first, next_size);
      bytes += next_size;
    }
    auto prev = by_address_.lower_bound(address);
    if (prev != by_address_.begin()) {
      --prev;
      if (prev->first + prev->second == address) {
        const auto [prev_address, prev_size] = *prev;
        Erase(prev_address, prev_size);
        address = prev_address;
        bytes += prev_size;
      }
    }
    Insert(address, bytes);
  }

  uint64_t reserved() const { return end_; }

 private:
  // Maps chunks at the end, enough for `bytes` together with a free tail.
  bool Grow(uint64_t bytes) {
    uint64_t tail = 0;
    if (!by_address_.empty()) {
      const auto& last = *by_address_.rbegin();
      if (last.first + last.second == end_) tail = last.second;
    }
    const uint64_t grow = (bytes - tail + kChunk - 1) / kChunk * kChunk;
    if (grow > capacity_ - end_) return false;
    const uint64_t start = end_;
    end_ += grow;
    Free(start, grow);
    return true;
  }

  void Insert(uint64_t address, uint64_t size) {
    by_address_.emplace(address, size);
    by_size_.insert({size, address});
  }
  void Erase(uint64_t address, uint64_t size) {
    by_address_.erase(address);
    by_size_.erase({size, address});
  }

  uint64_t capacity_;
  uint64_t end_ = 0;
  absl::btree_map<uint64_t, uint64_t> by_address_;
  absl::btree_set<std::pair<uint64_t, uint64_t>> by_size_;
};

}  // namespace

absl::StatusOr<ReplayResult> EstimateAsyncPoolReplay(
    const Trace& trace, const ReplayOptions& options) {
  uint64_t capacity = options.capacity == 0
                          ? std::numeric_limits<uint64_t>::max()
                          : options.capacity;
  if (options.memory_fraction) {
    const uint64_t total =
        options.total_memory == 0 ? options.capacity : options.total_memory;
    capacity = std::min<uint64_t>(
        capacity, static_cast<uint64_t>(*options.memory_fraction *
                                        static_cast<double>(total)));
  }
  AsyncPool pool(capacity);
  ReplayResult result;
  result.estimated = true;
  std::vector<std::optional<uint64_t>> addresses(trace.num_ids);
  std::vector<uint64_t> sizes(trace.num_ids);
  Stat allocated;
  Stat reserved;

  // A partial trace's first event found these blocks in the pool.
  if (trace.partial.reconstructed()) {
    for (const InitialBlock& b : trace.partial.blocks) {
      if (b.id >= trace.num_ids) {
        return absl::InvalidArgumentError(
            absl::StrFormat("initial block id %d out of range", b.id));
      }
      addresses[b.id] = pool.Allocate(b.requested_size);
      sizes[b.id] = b.requested_size;
      if (!addresses[b.id]) {
        return absl::ResourceExhaustedError(
            "the trace is partial: the memory live at its first event does "
            "not fit in the device");
      }
      if (!b.free_requested) {
        allocated.Increase(static_cast<int64_t>(b.requested_size));
      }
    }
    reserved.Increase(static_cast<int64_t>(pool.reserved()));
  }
  const auto start = std::chrono::steady_clock::now();
  uint64_t i = 0;
  for (; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.id >= trace.num_ids) {
      return absl::InvalidArgumentError(
          absl::StrFormat("trace event %d: id %d out of range", i, e.id));
    }
    switch (e.op) {
      case TraceOp::kAlloc:
        addresses[e.id] = pool.Allocate(e.size);
        sizes[e.id] = e.size;
        if (addresses[e.id]) {
          allocated.Increase(static_cast<int64_t>(e.size));
        } else {
          ++result.num_ooms;
          if (!result.first_oom_event) result.first_oom_event = i;
        }
        break;
      case TraceOp::kFreeRequested:
        if (addresses[e.id]) allocated.Decrease(static_cast<int64_t>(sizes[e.id]));
        break;
      case TraceOp::kFreeCompleted:
        if (addresses[e.id]) pool.Free(*addresses[e.id], sizes[e.id]);
        addresses[e.id].reset();
        break;
    }
    const auto now_reserved = static_cast<int64_t>(pool.reserved());
    if (now_reserved > reserved.current) reserved.Increase(now_reserved - reserved.current);
    if (options.stop_at_first_oom && result.first_oom_event) {
      ++i;
      break;
    }
  }
  SetRunTotals(start, i, result);
  result.peak_reserved = reserved.peak;
  result.peak_allocated = allocated.peak;
  result.peak_requested = allocated.peak;
  result.stats.reserved_bytes.by_pool[0] = reserved;
  result.stats.allocated_bytes.by_pool[0] = allocated;
  result.stats.requested_bytes.by_pool[0] = allocated;
  return result;
}

}  // namespace allocd
