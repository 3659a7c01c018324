#include "allocator/trace/snapshot_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/config.h"
#include "allocator/size_rounding.h"
#include "allocator/trace/pickle.h"
#include "allocator/trace/snapshot_action.h"

namespace allocd {
namespace {

// The pickle reader takes at most this much, so a gzip stream that inflates
// to more (a "zip bomb") stops here.
constexpr size_t kMaxPickleBytes = size_t{4} << 30;
// Deflate cannot compress better than about 1032:1.
constexpr size_t kMaxDeflateRatio = 1032;

template <typename... Args>
absl::Status SnapshotError(const absl::FormatSpec<Args...>& format,
                           const Args&... args) {
  return absl::InvalidArgumentError(
      absl::StrCat("snapshot: ", absl::StrFormat(format, args...)));
}

bool IsGzip(std::string_view bytes) {
  return bytes.size() >= 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b';
}

// Inflates a gzip file, including one of several members (`cat a.gz b.gz`)
// and trailing zero padding, as Python's gzip module does.
absl::StatusOr<std::string> Gunzip(std::string_view gz) {
  z_stream zs = {};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError("gzip: cannot initialize zlib");
  }
  absl::Cleanup end_inflate = [&zs] { inflateEnd(&zs); };

  // The trailer states the size mod 2^32; trust it only as far as the
  // compressed size allows.
  std::string out;
  if (gz.size() >= 18) {
    const auto* tail =
        reinterpret_cast<const unsigned char*>(gz.data() + gz.size() - 4);
    const size_t stated = tail[0] | tail[1] << 8 | tail[2] << 16 |
                          static_cast<size_t>(tail[3]) << 24;
    out.resize(
        std::min({stated, gz.size() * kMaxDeflateRatio, kMaxPickleBytes}));
  }
  size_t consumed = 0;
  size_t produced = 0;
  while (true) {
    if (produced == out.size()) {
      if (out.size() >= kMaxPickleBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gzip: inflates to more than ", kMaxPickleBytes, " bytes"));
      }
      out.resize(
          std::min(std::max(out.size() * 2, size_t{1} << 20), kMaxPickleBytes));
    }
    if (zs.avail_in == 0) {
      zs.next_in =
          reinterpret_cast<Bytef*>(const_cast<char*>(gz.data())) + consumed;
      zs.avail_in =
          static_cast<uInt>(std::min<size_t>(gz.size() - consumed, UINT_MAX));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out =
        static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT_MAX));
    const uInt avail_in = zs.avail_in;
    const uInt avail_out = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    consumed += avail_in - zs.avail_in;
    produced += avail_out - zs.avail_out;
    if (rc == Z_STREAM_END) {
      while (consumed < gz.size() && gz[consumed] == '\0') ++consumed;
      if (consumed == gz.size()) break;
      inflateReset(&zs);
      zs.avail_in = 0;
      continue;
    }
    if (rc == Z_BUF_ERROR && consumed == gz.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gzip: the stream is truncated after ", gz.size(), " bytes"));
    }
    if (rc == Z_MEM_ERROR) {
      return absl::ResourceExhaustedError("gzip: out of memory");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return absl::InvalidArgumentError(
          absl::StrCat("gzip: corrupt data near compressed offset ", consumed,
                       ": ", zs.msg != nullptr ? zs.msg : "inflate failed"));
    }
  }
  out.resize(produced);
  return out;
}

using Action = SnapshotAction;

// The event fields the trace reads.
enum Field {
  kActionField,
  kAddrField,
  kSizeField,
  kStreamField,
  kTimeField,
  kOtherField
};

Field ParseField(std::string_view key) {
  static constexpr std::string_view kFields[] = {"action", "addr", "size",
                                                 "stream", "time_us"};
  for (size_t i = 0; i < std::size(kFields); ++i) {
    if (kFields[i] == key) return static_cast<Field>(i);
  }
  return kOtherField;
}

// What a str means to the reader (a key's Field, an action's Action),
// worked out once per distinct handle: Python memoizes the keys and actions
// that every event repeats, so after the first event they are found by
// comparing 8-byte handles.
template <typename T, T (*kParse)(std::string_view)>
class StrMeaning {
 public:
  T Get(const PickleDocument& doc, PickleValue str) {
    for (const auto& [handle, meaning] : known_) {
      if (handle == str) return meaning;
    }
    const T meaning = kParse(doc.str_value(str));
    // Strs that are not memoized (each a new handle) are not kept.
    if (known_.size() < 16) known_.push_back({str, meaning});
    return meaning;
  }

 private:
  std::vector<std::pair<PickleValue, T>> known_;
};

std::optional<Action> ParseAction(std::string_view name) {
  return ParseSnapshotAction(name);
}

// A block of the snapshot's end state that the program holds.
struct EndBlock {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size;
  bool free_requested;  // 'active_pending_free'
};

// A segment of the snapshot's end state (`segments`, this device's).
struct EndSegment {
  uint64_t address;
  uint64_t size;
  uint64_t stream;
  bool is_small;
  bool is_expandable;
  std::vector<EndBlock> live_blocks;
};

// The snapshot's `segments`; nullopt when it has none (an older or
// hand-made snapshot: nothing to reconstruct from).
using EndState = std::optional<std::vector<EndSegment>>;

// Turns the event dicts of one device, in order, into a Trace.
class TraceBuilder {
 public:
  TraceBuilder(const PickleDocument& doc, int device, size_t num_events)
      : doc_(doc) {
    trace_.device = device;
    // Each snapshot event makes at most one Trace event.
    trace_.events.reserve(num_events);
  }

  // Adds device_traces[device][index].
  absl::Status Add(PickleValue event, size_t index) {
    index_ = index;
    if (event.kind() != PickleKind::kDict) {
      return Error("is %s, expected dict", PickleKindName(event.kind()));
    }
    // One pass over the keys; a repeated key takes its last value, as in
    // Python.
    std::optional<PickleValue> fields[kOtherField];  // By Field.
    for (const PickleDocument::Entry& e : doc_.entries(event)) {
      if (e.key.kind() != PickleKind::kStr) continue;
      const Field field = fields_.Get(doc_, e.key);
      if (field != kOtherField) fields[field] = e.value;
    }
    const std::optional<PickleValue>& action = fields[kActionField];
    const std::optional<PickleValue>& addr = fields[kAddrField];
    const std::optional<PickleValue>& size = fields[kSizeField];
    const std::optional<PickleValue>& stream = fields[kStreamField];
    NoteTime(fields[kTimeField]);
    if (!action) return Error("missing 'action'");
    if (action->kind() != PickleKind::kStr) {
      return Error("'action' is %s, expected str",
                   PickleKindName(action->kind()));
    }
    const std::optional<Action> kind = actions_.Get(doc_, *action);
    if (!kind) return Error("unknown action '%s'", doc_.str_value(*action));

    uint64_t address = 0, bytes = 0, stream_handle = 0;
    switch (*kind) {
      case Action::kAlloc:
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
        if (absl::Status s = GetUint(stream, "stream", stream_handle);
            !s.ok()) {
          return s;
        }
        return AddAlloc(address, bytes, stream_handle);
      case Action::kFreeRequested:
      case Action::kFreeCompleted:
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        return AddFree(*kind, address, size, stream);
      case Action::kSegmentAlloc:
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
        trace_.recorded_segments.push_back(
            {address, bytes, trace_.events.size()});
        window_segments_.insert(address);
        return absl::OkStatus();
      case Action::kSegmentFree:
        ++trace_.omitted.segment_free;
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        if (window_segments_.erase(address) == 0) {
          // Allocated before the first event.
          if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
          if (absl::Status s = GetUint(stream, "stream", stream_handle);
              !s.ok()) {
            return s;
          }
          freed_initial_segments_.push_back(
              {address, bytes, stream_handle, bytes == kSmallBuffer, false, {}});
        }
        return absl::OkStatus();
      case Action::kSegmentMap:
      case Action::kSegmentUnmap: {
        ++(*kind == Action::kSegmentMap ? trace_.omitted.segment_map
                                        : trace_.omitted.segment_unmap);
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
        if (absl::Status s = GetUint(stream, "stream", stream_handle);
            !s.ok()) {
          return s;
        }
        mappings_.push_back(
            {*kind == Action::kSegmentMap, address, bytes, stream_handle});
        return absl::OkStatus();
      }
      case Action::kSnapshot:
        ++trace_.omitted.snapshot;
        return absl::OkStatus();
      case Action::kOom:
        ++trace_.omitted.oom;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // The trace, with stream indices in ascending handle order, and the state
  // at its first event reconstructed from `end` where the trace is partial.
  void set_recorded_config(std::string config) {
    trace_.recorded_config = std::move(config);
  }

  Trace Finish(const EndState& end, size_t num_events) && {
    ReconstructInitialState(end, num_events);
    // Times for some events only pace nothing reliably.
    if (!every_event_timed_) trace_.event_times_us.clear();
    std::vector<uint64_t> sorted = stream_handles_;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint16_t> final_index(stream_handles_.size());
    for (size_t i = 0; i < stream_handles_.size(); ++i) {
      final_index[i] = static_cast<uint16_t>(
          std::lower_bound(sorted.begin(), sorted.end(), stream_handles_[i]) -
          sorted.begin());
    }
    for (TraceEvent& e : trace_.events) e.stream = final_index[e.stream];
    for (InitialSegment& s : trace_.partial.segments) {
      s.stream = final_index[s.stream];
    }
    trace_.streams = std::move(sorted);
    return std::move(trace_);
  }

 private:
  // A block from its alloc to its free_completed.
  struct LiveBlock {
    uint32_t id;
    // Provisional stream index (first-seen order) until Finish.
    uint16_t stream;
    bool free_requested;
    uint64_t size;
  };

  // A segment_map (or segment_unmap) event of an expandable segment.
  struct Mapping {
    bool map;
    uint64_t address;
    uint64_t size;
    uint64_t stream;
  };

  // A block that a free shows was allocated before the first event.
  struct FreedInitialBlock {
    uint32_t id;
    uint64_t address;
    uint64_t requested_size;
    bool free_requested;  // at the first event
  };

  template <typename... Args>
  absl::Status Error(const absl::FormatSpec<Args...>& format,
                     const Args&... args) const {
    return SnapshotError("device_traces[%d][%d]: %s", trace_.device, index_,
                         absl::StrFormat(format, args...));
  }

  // Keeps the event's `time_us` for the Trace event it may make; an event
  // without one (or with one that is not an int) leaves the trace untimed.
  void NoteTime(const std::optional<PickleValue>& time) {
    std::optional<int64_t> us;
    if (time.has_value() && time->kind() == PickleKind::kInt) {
      us = doc_.int_value(*time);
    }
    if (!us.has_value()) every_event_timed_ = false;
    time_us_ = us.value_or(0);
  }

  // Appends a Trace event with the time of the snapshot event that made it.
  void AddEvent(const TraceEvent& event) {
    trace_.events.push_back(event);
    if (every_event_timed_) trace_.event_times_us.push_back(time_us_);
  }

  // Reads the non-negative int `field` called `name` into `out`.
  absl::Status GetUint(const std::optional<PickleValue>& field,
                       std::string_view name, uint64_t& out) const {
    if (field) {
      if (const std::optional<uint64_t> u = doc_.uint_value(*field)) {
        out = *u;
        return absl::OkStatus();
      }
    }
    if (!field) return Error("missing '%s'", name);
    if (field->kind() == PickleKind::kBigInt) {
      return Error("'%s' does not fit in 64 bits", name);
    }
    if (field->kind() == PickleKind::kInt) {
      return Error("'%s' is %d, expected a non-negative int", name,
                   doc_.int_value(*field));
    }
    return Error("'%s' is %s, expected int", name,
                 PickleKindName(field->kind()));
  }

  // The alloc at a live address is an error rather than an implicit free:
  // PyTorch never reuses an address before its free_completed, so the trace
  // lost events and replaying it would misstate memory.
  absl::Status AddAlloc(uint64_t address, uint64_t size, uint64_t handle) {
    if (trace_.num_ids == std::numeric_limits<uint32_t>::max()) {
      return Error("more than 2^32 allocations");
    }
    absl::StatusOr<uint16_t> stream = StreamIndex(handle);
    if (!stream.ok()) return stream.status();
    const uint32_t id = trace_.num_ids;
    auto [block, fresh] =
        live_.try_emplace(address, LiveBlock{id, *stream, false, size});
    if (!fresh) {
      return Error(
          "alloc at 0x%x, which holds a live block since alloc #%d (its "
          "free_completed is missing)",
          address, block->second.id);
    }
    ++trace_.num_ids;
    AddEvent({TraceOp::kAlloc, *stream, id, size});
    return absl::OkStatus();
  }

  // The provisional index of the stream with CUDA handle `handle`.
  absl::StatusOr<uint16_t> StreamIndex(uint64_t handle) {
    auto [stream, inserted] = stream_index_.try_emplace(
        handle, static_cast<uint16_t>(stream_handles_.size()));
    if (inserted) {
      if (stream_handles_.size() > std::numeric_limits<uint16_t>::max()) {
        return Error("more than 65536 distinct streams");
      }
      stream_handles_.push_back(handle);
    }
    return stream->second;
  }

  // A free of an address no recorded alloc holds frees a block allocated
  // before the first event: it gets an id of its own, and Finish either
  // reconstructs the block or drops its events.
  absl::Status AddFree(Action action, uint64_t address,
                       const std::optional<PickleValue>& size,
                       const std::optional<PickleValue>& stream) {
    const bool requested = action == Action::kFreeRequested;
    auto it = live_.find(address);
    if (it != live_.end() && initial_ids_.contains(it->second.id)) {
      ++trace_.partial.unmatched_frees;
    }
    if (it == live_.end()) {
      ++trace_.partial.unmatched_frees;
      uint64_t bytes = 0, handle = 0;
      if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
      if (absl::Status s = GetUint(stream, "stream", handle); !s.ok()) return s;
      absl::StatusOr<uint16_t> index = StreamIndex(handle);
      if (!index.ok()) return index.status();
      if (trace_.num_ids == std::numeric_limits<uint32_t>::max()) {
        return Error("more than 2^32 allocations");
      }
      const uint32_t id = trace_.num_ids++;
      freed_initial_.push_back({id, address, bytes, !requested});
      initial_ids_.insert(id);
      it = live_.try_emplace(address, LiveBlock{id, *index, !requested, bytes})
               .first;
    }
    LiveBlock& block = it->second;
    if (requested == block.free_requested) {
      return Error("%s of 0x%x (alloc #%d)",
                   requested ? "second free_requested"
                             : "free_completed without free_requested",
                   address, block.id);
    }
    AddEvent({requested ? TraceOp::kFreeRequested : TraceOp::kFreeCompleted,
              block.stream, block.id, block.size});
    if (requested) {
      block.free_requested = true;
    } else {
      live_.erase(it);
    }
    return absl::OkStatus();
  }

  // Sets trace_.partial: what makes the trace partial, and the state at the
  // first event where `end` allows; otherwise drops the events of blocks
  // allocated before it.
  void ReconstructInitialState(const EndState& end, size_t num_events) {
    PartialTrace& partial = trace_.partial;
    std::vector<InitialSegment> segments;
    std::vector<InitialBlock> blocks;
    std::string unrecoverable = CollectInitialState(end, segments, blocks);
    partial.state_before_first_event =
        !segments.empty() || blocks.size() > freed_initial_.size();
    if (!partial.partial()) return;
    // _record_memory_history(max_entries=N) keeps exactly N events once the
    // ring is full; people choose round numbers.
    partial.ring_buffer_wrapped =
        num_events >= 1000 &&
        (num_events % 1000 == 0 || (num_events & (num_events - 1)) == 0);
    if (unrecoverable.empty()) {
      partial.segments = std::move(segments);
      partial.blocks = std::move(blocks);
      return;
    }
    partial.unrecoverable = std::move(unrecoverable);
    DropInitialBlocks();
  }

  // The state at the first event: the end state's segments and blocks less
  // what the events made, plus what they freed. Returns why that cannot be
  // known, or "".
  std::string CollectInitialState(const EndState& end,
                                  std::vector<InitialSegment>& segments,
                                  std::vector<InitialBlock>& blocks) {
    if (!end) {
      return freed_initial_.empty()
                 ? ""
                 : "the snapshot has no 'segments' (the memory state at its "
                   "end), so what was live when recording began is unknown";
    }
    std::string why;
    auto fail = [&why](std::string reason) {
      if (why.empty()) why = std::move(reason);
    };
    // Blocks that frees show, by address; those the end state holds get its
    // exact size below.
    absl::flat_hash_map<uint64_t, size_t> block_at;
    for (const FreedInitialBlock& f : freed_initial_) {
      if (!block_at.try_emplace(f.address, blocks.size()).second) {
        fail(absl::StrFormat(
            "two blocks at 0x%x were live at the first event: events are "
            "missing",
            f.address));
      }
      blocks.push_back({f.id, f.address, 0, f.requested_size, f.free_requested});
    }
    for (const EndSegment& seg : *end) {
      absl::StatusOr<uint16_t> stream = StreamIndex(seg.stream);
      if (!stream.ok()) {
        fail(std::string(stream.status().message()));
        continue;
      }
      if (!seg.is_expandable && !window_segments_.contains(seg.address)) {
        segments.push_back({seg.address, seg.size, *stream, seg.is_small});
      }
      for (const EndBlock& b : seg.live_blocks) {
        const auto live = live_.find(b.address);
        if (live != live_.end() && !initial_ids_.contains(live->second.id)) {
          continue;  // allocated by the trace
        }
        if (live != live_.end()) {
          // Freed before the end, not completed: the end state knows its size.
          blocks[block_at.at(b.address)].size = b.size;
          continue;
        }
        // Never freed in the trace.
        const uint32_t id = trace_.num_ids++;
        initial_ids_.insert(id);
        blocks.push_back({id, b.address, b.size, b.requested_size, b.free_requested});
      }
    }
    for (const EndSegment& seg : freed_initial_segments_) {
      absl::StatusOr<uint16_t> stream = StreamIndex(seg.stream);
      if (stream.ok()) {
        segments.push_back({seg.address, seg.size, *stream, seg.is_small});
      }
    }
    CollectInitialMappings(*end, segments, fail);
    if (!why.empty()) return why;
    SizeInitialBlocks(segments, blocks, why);
    return why;
  }

  // Expandable segments' ranges mapped at the first event: those mapped at
  // the end, less what the events mapped, plus what they unmapped (walked
  // back from the end), by stream and pool.
  template <typename Fail>
  void CollectInitialMappings(const std::vector<EndSegment>& end,
                              std::vector<InitialSegment>& segments,
                              Fail& fail) {
    if (mappings_.empty() &&
        std::none_of(end.begin(), end.end(),
                     [](const EndSegment& s) { return s.is_expandable; })) {
      return;
    }
    using Key = std::pair<uint64_t, bool>;  // (stream handle, is_small)
    std::map<Key, std::map<uint64_t, uint64_t>> mapped;  // start -> end
    for (const EndSegment& seg : end) {
      if (seg.is_expandable) {
        AddRange(mapped[{seg.stream, seg.is_small}], seg.address,
                 seg.address + seg.size);
      }
    }
    for (auto m = mappings_.rbegin(); m != mappings_.rend(); ++m) {
      const uint64_t lo = m->address, hi = m->address + m->size;
      if (m->map) {
        // Before it was mapped, the range was not.
        bool found = false;
        for (bool small : {false, true}) {
          auto group = mapped.find({m->stream, small});
          if (group != mapped.end() && RemoveRange(group->second, lo, hi)) {
            found = true;
            break;
          }
        }
        if (!found) {
          fail(absl::StrFormat(
              "segment_map of 0x%x (%d bytes) is not mapped at the end and "
              "no later event unmaps it: the end state does not match the "
              "events",
              lo, m->size));
        }
        continue;
      }
      AddRange(mapped[{m->stream, PoolOfUnmapped(mapped, *m)}], lo, hi);
    }
    for (const auto& [key, ranges] : mapped) {
      absl::StatusOr<uint16_t> stream = StreamIndex(key.first);
      if (!stream.ok()) {
        fail(std::string(stream.status().message()));
        continue;
      }
      for (const auto& [lo, hi] : ranges) {
        segments.push_back({lo, hi - lo, *stream, key.second, true});
      }
    }
  }

  // The pool of a range that an unmap returned: the one of its stream with
  // mapped space nearest to it; without one, the small pool for sizes that
  // are not whole 20 MiB large pages.
  template <typename Groups>
  static bool PoolOfUnmapped(const Groups& mapped, const Mapping& m) {
    std::optional<std::pair<uint64_t, bool>> nearest;  // (distance, small)
    for (bool small : {false, true}) {
      auto group = mapped.find({m.stream, small});
      if (group == mapped.end() || group->second.empty()) continue;
      const uint64_t first = group->second.begin()->first;
      const uint64_t last = group->second.rbegin()->second;
      const uint64_t distance = m.address < first  ? first - m.address
                                : m.address >= last ? m.address - last
                                                    : 0;
      if (!nearest || distance < nearest->first) nearest = {distance, small};
    }
    return nearest ? nearest->second : m.size % kLargeBuffer != 0;
  }

  // [lo, hi) joins `ranges` (start -> end), merged with its neighbours.
  static void AddRange(std::map<uint64_t, uint64_t>& ranges, uint64_t lo,
                       uint64_t hi) {
    auto it = ranges.upper_bound(lo);
    if (it != ranges.begin() && std::prev(it)->second >= lo) {
      --it;
      lo = it->first;
      hi = std::max(hi, it->second);
      it = ranges.erase(it);
    }
    while (it != ranges.end() && it->first <= hi) {
      hi = std::max(hi, it->second);
      it = ranges.erase(it);
    }
    ranges.emplace(lo, hi);
  }

  // Takes [lo, hi) out of `ranges`; false when it is not all inside one.
  static bool RemoveRange(std::map<uint64_t, uint64_t>& ranges, uint64_t lo,
                          uint64_t hi) {
    auto it = ranges.upper_bound(lo);
    if (it == ranges.begin()) return false;
    --it;
    const uint64_t start = it->first, end = it->second;
    if (hi > end) return false;
    ranges.erase(it);
    if (start < lo) ranges.emplace(start, lo);
    if (hi < end) ranges.emplace(hi, end);
    return true;
  }

  // Gives blocks that only a free names their size: the request rounded
  // under the recorded config, plus the rest of the space up to the next
  // block when that rest is at most 1 MiB of the large pool (PyTorch keeps
  // no free large block that small: it did not split). Checks that every
  // block lies in a segment, alone.
  void SizeInitialBlocks(std::vector<InitialSegment>& segments,
                         std::vector<InitialBlock>& blocks,
                         std::string& why) const {
    absl::StatusOr<AllocatorConfig> config =
        ParseAllocatorConfig(trace_.recorded_config);
    const AllocatorConfig rules = config.ok() ? *config : AllocatorConfig{};
    auto by_address = [](const auto& a, const auto& b) {
      return a.address < b.address;
    };
    std::sort(segments.begin(), segments.end(), by_address);
    std::sort(blocks.begin(), blocks.end(), by_address);
    for (size_t i = 1; i < segments.size(); ++i) {
      if (segments[i - 1].address + segments[i - 1].size > segments[i].address) {
        why = absl::StrFormat(
            "segments at 0x%x and 0x%x overlap at the first event: the end "
            "state does not match the events",
            segments[i - 1].address, segments[i].address);
        return;
      }
    }
    size_t s = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      InitialBlock& block = blocks[i];
      while (s < segments.size() &&
             segments[s].address + segments[s].size <= block.address) {
        ++s;
      }
      if (s == segments.size() || block.address < segments[s].address) {
        why = absl::StrFormat(
            "the block at 0x%x, live at the first event, is in no segment "
            "the snapshot shows",
            block.address);
        return;
      }
      const InitialSegment& segment = segments[s];
      uint64_t boundary = segment.address + segment.size;
      if (i + 1 < blocks.size()) {
        boundary = std::min(boundary, blocks[i + 1].address);
      }
      if (block.size == 0) {
        const uint64_t rounded = RoundSize(block.requested_size, rules);
        block.size = rounded;
        const uint64_t end = block.address + rounded;
        // Expandable segments split off any remainder.
        if (end < boundary && !segment.is_small && !segment.is_expandable &&
            boundary - end <= kSmallSize) {
          block.size = boundary - block.address;
        }
      }
      if (block.address + block.size > boundary) {
        why = absl::StrFormat(
            "the block at 0x%x (%d bytes), live at the first event, overlaps "
            "the next block or leaves its segment",
            block.address, block.size);
        return;
      }
    }
  }

  // Removes the events of blocks allocated before the first event and
  // renumbers the rest densely, as if the frees had been skipped.
  void DropInitialBlocks() {
    trace_.omitted.unmatched_frees = trace_.partial.unmatched_frees;
    if (initial_ids_.empty()) return;
    std::vector<uint32_t> new_id(trace_.num_ids, 0);
    uint32_t next = 0;
    for (uint32_t id = 0; id < trace_.num_ids; ++id) {
      if (!initial_ids_.contains(id)) new_id[id] = next++;
    }
    // The events and their times, compacted in step.
    size_t kept = 0;
    for (size_t i = 0; i < trace_.events.size(); ++i) {
      if (initial_ids_.contains(trace_.events[i].id)) continue;
      trace_.events[kept] = trace_.events[i];
      if (every_event_timed_) {
        trace_.event_times_us[kept] = trace_.event_times_us[i];
      }
      ++kept;
    }
    trace_.events.resize(kept);
    if (every_event_timed_) trace_.event_times_us.resize(kept);
    for (TraceEvent& e : trace_.events) e.id = new_id[e.id];
    trace_.num_ids = next;
  }

  const PickleDocument& doc_;
  StrMeaning<Field, ParseField> fields_;
  StrMeaning<std::optional<Action>, ParseAction> actions_;
  Trace trace_;
  // The event being added, for error messages.
  size_t index_ = 0;
  // Its time_us, and whether every event so far had one.
  int64_t time_us_ = 0;
  bool every_event_timed_ = true;
  absl::flat_hash_map<uint64_t, LiveBlock> live_;
  // Ids of blocks allocated before the first event.
  absl::flat_hash_set<uint32_t> initial_ids_;
  std::vector<FreedInitialBlock> freed_initial_;
  // Segments allocated by the trace and not freed since, by address.
  absl::flat_hash_set<uint64_t> window_segments_;
  // Segments freed by the trace that it did not allocate.
  std::vector<EndSegment> freed_initial_segments_;
  // segment_map and segment_unmap events, in order.
  std::vector<Mapping> mappings_;
  absl::flat_hash_map<uint64_t, uint16_t> stream_index_;
  // Handles by provisional index.
  std::vector<uint64_t> stream_handles_;
};

// device_traces[device], with `device` chosen as SnapshotReadOptions says.
absl::StatusOr<PickleValue> SelectDevice(const PickleDocument& doc,
                                         PickleValue device_traces,
                                         int& device,
                                         std::vector<int>& other_devices) {
  std::vector<PickleValue> lists;
  std::vector<int> with_events;
  for (PickleValue list : doc.items(device_traces)) {
    if (list.kind() != PickleKind::kList) {
      return SnapshotError("device_traces[%d] is %s, expected list",
                           lists.size(), PickleKindName(list.kind()));
    }
    if (doc.size(list) > 0)
      with_events.push_back(static_cast<int>(lists.size()));
    lists.push_back(list);
  }
  for (const int d : with_events) {
    if (d != device) other_devices.push_back(d);
  }
  if (device == -1) {
    if (with_events.size() == 1) {
      other_devices.clear();
      device = with_events[0];
      return lists[device];
    }
    if (with_events.empty()) {
      return SnapshotError(
          "no device has trace events (call "
          "torch.cuda.memory._record_memory_history() before the "
          "allocations to record)");
    }
    return SnapshotError("devices %s have trace events: choose one of them",
                         absl::StrJoin(with_events, ", "));
  }
  if (device < 0 || static_cast<size_t>(device) >= lists.size()) {
    return SnapshotError(
        "device %d is out of range: device_traces %s", device,
        lists.empty() ? "is empty"
                      : absl::StrCat("has devices 0..", lists.size() - 1));
  }
  return lists[device];
}

// allocator_settings['PYTORCH_CUDA_ALLOC_CONF']; snapshots of older PyTorch
// versions have no allocator_settings.
absl::StatusOr<std::string> RecordedConfig(const PickleDocument& doc,
                                           PickleValue root) {
  const std::optional<PickleValue> settings =
      doc.Find(root, "allocator_settings");
  if (!settings) return std::string();
  if (settings->kind() != PickleKind::kDict) {
    return SnapshotError("allocator_settings is %s, expected dict",
                         PickleKindName(settings->kind()));
  }
  const std::optional<PickleValue> conf =
      doc.Find(*settings, "PYTORCH_CUDA_ALLOC_CONF");
  if (!conf) return std::string();
  if (conf->kind() != PickleKind::kStr) {
    return SnapshotError(
        "allocator_settings['PYTORCH_CUDA_ALLOC_CONF'] is %s, expected str",
        PickleKindName(conf->kind()));
  }
  return std::string(doc.str_value(*conf));
}

// Reads the non-negative int doc[key] of `dict` (an address may pass 2^63).
absl::Status GetUintField(const PickleDocument& doc, PickleValue dict,
                          std::string_view key, std::string_view where,
                          uint64_t& out) {
  const std::optional<PickleValue> v = doc.Find(dict, key);
  if (v) {
    if (const std::optional<uint64_t> u = doc.uint_value(*v)) {
      out = *u;
      return absl::OkStatus();
    }
  }
  return SnapshotError("%s: '%s' is %s, expected a non-negative int", where,
                       key, v ? PickleKindName(v->kind()) : "missing");
}

// The `segments` of `device`, with the blocks the program holds.
absl::StatusOr<EndState> ReadEndState(const PickleDocument& doc,
                                      PickleValue root, int device) {
  const std::optional<PickleValue> segments = doc.Find(root, "segments");
  if (!segments) return EndState();
  if (segments->kind() != PickleKind::kList) {
    return SnapshotError("segments is %s, expected list",
                         PickleKindName(segments->kind()));
  }
  std::vector<EndSegment> end;
  size_t i = 0;
  for (PickleValue seg : doc.items(*segments)) {
    const std::string where = absl::StrCat("segments[", i++, "]");
    if (seg.kind() != PickleKind::kDict) {
      return SnapshotError("%s is %s, expected dict", where,
                           PickleKindName(seg.kind()));
    }
    uint64_t seg_device = 0;
    if (doc.Find(seg, "device")) {
      if (absl::Status s = GetUintField(doc, seg, "device", where, seg_device);
          !s.ok()) {
        return s;
      }
    }
    if (seg_device != static_cast<uint64_t>(device)) continue;
    EndSegment e{};
    for (const auto& [key, out] :
         {std::pair<std::string_view, uint64_t*>{"address", &e.address},
          {"total_size", &e.size},
          {"stream", &e.stream}}) {
      if (absl::Status s = GetUintField(doc, seg, key, where, *out); !s.ok()) {
        return s;
      }
    }
    const std::optional<PickleValue> type = doc.Find(seg, "segment_type");
    e.is_small = type && type->kind() == PickleKind::kStr
                     ? doc.str_value(*type) == "small"
                     : e.size == kSmallBuffer;
    const std::optional<PickleValue> expandable = doc.Find(seg, "is_expandable");
    e.is_expandable = expandable && expandable->kind() == PickleKind::kBool &&
                      doc.bool_value(*expandable);
    const std::optional<PickleValue> blocks = doc.Find(seg, "blocks");
    if (!blocks || blocks->kind() != PickleKind::kList) {
      return SnapshotError("%s: 'blocks' is %s, expected list", where,
                           blocks ? PickleKindName(blocks->kind()) : "missing");
    }
    size_t j = 0;
    for (PickleValue block : doc.items(*blocks)) {
      const std::string block_where = absl::StrCat(where, "['blocks'][", j++, "]");
      if (block.kind() != PickleKind::kDict) {
        return SnapshotError("%s is %s, expected dict", block_where,
                             PickleKindName(block.kind()));
      }
      const std::optional<PickleValue> state = doc.Find(block, "state");
      if (!state || state->kind() != PickleKind::kStr) {
        return SnapshotError("%s: 'state' is %s, expected str", block_where,
                             state ? PickleKindName(state->kind()) : "missing");
      }
      const std::string_view name = doc.str_value(*state);
      if (name == "inactive") continue;
      EndBlock b{};
      b.free_requested = name == "active_pending_free";
      for (const auto& [key, out] :
           {std::pair<std::string_view, uint64_t*>{"address", &b.address},
            {"size", &b.size},
            {"requested_size", &b.requested_size}}) {
        if (absl::Status s = GetUintField(doc, block, key, block_where, *out);
            !s.ok()) {
          return s;
        }
      }
      e.live_blocks.push_back(b);
    }
    end.push_back(std::move(e));
  }
  return EndState(std::move(end));
}

absl::StatusOr<Trace> ToTrace(const PickleDocument& doc, int device) {
  const PickleValue root = doc.root();
  if (root.kind() != PickleKind::kDict) {
    return SnapshotError(
        "the pickle holds a %s, not the dict of torch.cuda.memory._snapshot()",
        PickleKindName(root.kind()));
  }
  const std::optional<PickleValue> device_traces =
      doc.Find(root, "device_traces");
  if (!device_traces) {
    return SnapshotError(
        "no 'device_traces': not a torch.cuda.memory._snapshot() pickle");
  }
  if (device_traces->kind() != PickleKind::kList) {
    return SnapshotError("device_traces is %s, expected list",
                         PickleKindName(device_traces->kind()));
  }
  std::vector<int> other_devices;
  absl::StatusOr<PickleValue> events =
      SelectDevice(doc, *device_traces, device, other_devices);
  if (!events.ok()) return events.status();
  absl::StatusOr<std::string> config = RecordedConfig(doc, root);
  if (!config.ok()) return config.status();
  absl::StatusOr<EndState> end = ReadEndState(doc, root, device);
  if (!end.ok()) return end.status();

  TraceBuilder builder(doc, device, doc.size(*events));
  size_t index = 0;
  for (PickleValue event : doc.items(*events)) {
    if (absl::Status s = builder.Add(event, index++); !s.ok()) return s;
  }
  builder.set_recorded_config(*std::move(config));
  Trace trace = std::move(builder).Finish(*end, index);
  trace.partial.other_devices = std::move(other_devices);
  return trace;
}

}  // namespace

absl::StatusOr<Trace> ParseSnapshot(std::string_view bytes,
                                    const SnapshotReadOptions& options) {
  std::string inflated;
  if (IsGzip(bytes)) {
    absl::StatusOr<std::string> s = Gunzip(bytes);
    if (!s.ok()) return s.status();
    inflated = *std::move(s);
    bytes = inflated;
  }
  absl::StatusOr<PickleDocument> doc = ParsePickle(bytes);
  if (!doc.ok()) return doc.status();
  return ToTrace(*doc, options.device);
}

absl::StatusOr<Trace> ReadSnapshotFile(const std::string& path,
                                       const SnapshotReadOptions& options) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  absl::Cleanup close_file = [file] { std::fclose(file); };
  std::string bytes;
  if (std::fseek(file, 0, SEEK_END) == 0) {
    const long size = std::ftell(file);
    if (size > 0) bytes.reserve(static_cast<size_t>(size));
    std::rewind(file);
  }
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    bytes.append(buffer, n);
  }
  if (std::ferror(file)) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  absl::StatusOr<Trace> trace = ParseSnapshot(bytes, options);
  if (!trace.ok()) {
    return absl::Status(trace.status().code(),
                        absl::StrCat(path, ": ", trace.status().message()));
  }
  return trace;
}

}  // namespace allocd
