#include "allocator/trace/snapshot_writer.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <iterator>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/trace/pickle_writer.h"

namespace allocd {
namespace {

const char* BlockState(BlockInfo::State state) {
  switch (state) {
    case BlockInfo::State::kAllocated:
      return "active_allocated";
    case BlockInfo::State::kFreePending:
      return "active_pending_free";
    case BlockInfo::State::kInactive:
      break;
  }
  return "inactive";
}

absl::StatusOr<std::string> Gzip(std::string_view data) {
  z_stream zs = {};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("gzip: cannot initialize zlib");
  }
  absl::Cleanup end_deflate = [&zs] { deflateEnd(&zs); };
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  // zlib counts in uInt: feed and drain at most UINT_MAX bytes a call.
  size_t fed = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (zs.avail_in == 0) {
      zs.avail_in =
          static_cast<uInt>(std::min<size_t>(data.size() - fed, UINT_MAX));
      fed += zs.avail_in;
    }
    zs.avail_out = static_cast<uInt>(
        std::min<size_t>(out.size() - zs.total_out, UINT_MAX));
    rc = deflate(&zs, fed == data.size() ? Z_FINISH : Z_NO_FLUSH);
  }
  if (rc != Z_STREAM_END) {
    return absl::InternalError(absl::StrCat("gzip: deflate failed (", rc, ")"));
  }
  out.resize(zs.total_out);
  return out;
}

}  // namespace

SnapshotRecorder::SnapshotRecorder(const Trace& trace,
                                   const AllocatorConfig& config)
    : trace_(trace), conf_(FormatAllocatorConfig(config)) {
  // Most trace events make one snapshot event.
  events_.reserve(trace.events.size());
  // A partial trace's replay starts from the memory its first event found:
  // those segments and blocks are there before any event.
  if (!trace.partial.reconstructed()) return;
  auto segment = trace.partial.segments.begin();
  for (const InitialSegment& s : trace.partial.segments) {
    ranges_[s.address] = Range{s.size, s.stream};
  }
  // An expandable segment's pages may be mapped anywhere in its reservation,
  // which the snapshot does not show: its ranges reach up to the next one.
  for (const InitialSegment& s : trace.partial.segments) {
    if (!s.is_expandable) continue;
    const auto it = ranges_.find(s.address);
    const auto next = std::next(it);
    it->second.bytes =
        (next == ranges_.end() ? ~uint64_t{0} : next->first) - s.address;
  }
  for (const InitialBlock& block : trace.partial.blocks) {
    while (segment->address + segment->size <= block.address) ++segment;
    live_[block.id] = LiveBlock{block.address, block.requested_size,
                                segment->stream,
                                block.free_requested ? ++free_requests_ : 0};
  }
}

void SnapshotRecorder::Add(Action action, StreamId stream, uint64_t addr,
                           uint64_t size) {
  events_.push_back(Event{action, stream, time_, addr, size});
}

uint64_t SnapshotRecorder::StreamHandle(StreamId stream) const {
  // Traces built in code may leave `streams` empty: the index is the handle.
  return stream < trace_.streams.size() ? trace_.streams[stream] : stream;
}

StreamId SnapshotRecorder::StreamOfRange(uint64_t address) const {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return stream_;
  --it;
  return address < it->first + it->second.bytes ? it->second.stream : stream_;
}

void SnapshotRecorder::OnEvent(uint64_t index, const TraceEvent& event) {
  if (max_events_ != 0 && events_.size() >= 2 * max_events_) {
    // Trimmed only between events: OnCacheFlush inserts at event_begin_.
    events_.erase(events_.begin(),
                  events_.end() - static_cast<ptrdiff_t>(max_events_));
  }
  time_ = index;
  stream_ = event.stream;
  event_begin_ = events_.size();
}

void SnapshotRecorder::OnDeviceCall(DeviceCall call, uint64_t address,
                                    uint64_t bytes) {
  switch (call) {
    case DeviceCall::kSegmentAlloc:
      ranges_[address] = Range{bytes, stream_};
      Add(Action::kSegmentAlloc, stream_, address, bytes);
      return;
    case DeviceCall::kSegmentFree: {
      const auto node = ranges_.extract(address);
      Add(Action::kSegmentFree, node.empty() ? stream_ : node.mapped().stream,
          address, bytes);
      return;
    }
    case DeviceCall::kReserve:
      // Not a snapshot event: the range only tells later maps their stream.
      ranges_[address] = Range{bytes, stream_};
      return;
    case DeviceCall::kRelease:
      ranges_.erase(address);
      return;
    case DeviceCall::kMap:
      Add(Action::kSegmentMap, StreamOfRange(address), address, bytes);
      return;
    case DeviceCall::kUnmap:
      Add(Action::kSegmentUnmap, StreamOfRange(address), address, bytes);
      return;
  }
}

void SnapshotRecorder::OnCacheFlush() {
  std::vector<std::pair<uint64_t, uint32_t>> completed;  // (order, id)
  for (const auto& [id, block] : live_) {
    if (block.free_requested != 0)
      completed.emplace_back(block.free_requested, id);
  }
  std::sort(completed.begin(), completed.end());
  std::vector<Event> frees;
  for (const auto& [order, id] : completed) {
    const LiveBlock block = live_.at(id);
    live_.erase(id);
    flushed_.insert(id);
    frees.push_back(Event{Action::kFreeCompleted, block.stream, time_,
                          block.addr, block.size});
  }
  // The flush synchronised before it released anything; the completions go
  // before every device call of the allocation, which keeps each block
  // inside a live segment.
  events_.insert(events_.begin() + static_cast<ptrdiff_t>(event_begin_),
                 frees.begin(), frees.end());
}

void SnapshotRecorder::OnBlock(const TraceEvent& event,
                               const Allocation& allocation) {
  switch (event.op) {
    case TraceOp::kAlloc:
      live_[event.id] = LiveBlock{allocation.address, event.size, event.stream};
      Add(Action::kAlloc, event.stream, allocation.address, event.size);
      return;
    case TraceOp::kFreeRequested: {
      // Absent when it was allocated before recording began.
      LiveBlock& block =
          live_.try_emplace(event.id, LiveBlock{allocation.address, event.size,
                                                event.stream})
              .first->second;
      block.free_requested = ++free_requests_;
      Add(Action::kFreeRequested, block.stream, block.addr, block.size);
      return;
    }
    case TraceOp::kFreeCompleted: {
      const auto node = live_.extract(event.id);
      if (!node.empty()) {
        const LiveBlock& block = node.mapped();
        Add(Action::kFreeCompleted, block.stream, block.addr, block.size);
      } else if (!flushed_.erase(event.id)) {
        // Neither completed by a cache flush nor seen since recording began.
        Add(Action::kFreeCompleted, event.stream, allocation.address,
            event.size);
      }
      return;
    }
  }
}

void SnapshotRecorder::OnOutOfMemory(const TraceEvent& event,
                                     uint64_t device_free) {
  Add(Action::kOom, event.stream, device_free, event.size);
}

void SnapshotRecorder::OnEnd(const CachingAllocator& allocator) {
  segments_ = allocator.Snapshot();
}

std::string SnapshotRecorder::Pickle() const {
  PickleWriter w;
  w.BeginDict();

  w.Str("segments").BeginList();
  for (const SegmentInfo& segment : segments_) {
    uint64_t allocated = 0, active = 0, requested = 0;
    for (const BlockInfo& block : segment.blocks) {
      if (block.state == BlockInfo::State::kInactive) continue;
      active += block.size;
      requested += block.requested_size;
      if (block.state == BlockInfo::State::kAllocated) allocated += block.size;
    }
    w.BeginDict();
    w.Str("device").Int(trace_.device);
    w.Str("address").Uint(segment.address);
    w.Str("total_size").Uint(segment.total_size);
    w.Str("allocated_size").Uint(allocated);
    w.Str("active_size").Uint(active);
    w.Str("requested_size").Uint(requested);
    w.Str("stream").Uint(StreamHandle(segment.stream));
    w.Str("segment_type").Str(segment.is_small ? "small" : "large");
    w.Str("is_expandable").Bool(segment.is_expandable);
    w.Str("frames").BeginList().EndList();
    w.Str("blocks").BeginList();
    for (const BlockInfo& block : segment.blocks) {
      w.BeginDict();
      w.Str("address").Uint(block.address);
      w.Str("size").Uint(block.size);
      w.Str("requested_size").Uint(block.requested_size);
      w.Str("state").Str(BlockState(block.state));
      w.Str("frames").BeginList().EndList();
      w.EndDict();
    }
    w.EndList();
    w.EndDict();
  }
  w.EndList();

  w.Str("device_traces").BeginList();
  for (int device = 0; device < trace_.device; ++device) {
    w.BeginList().EndList();
  }
  w.BeginList();
  const size_t first = max_events_ != 0 && events_.size() > max_events_
                           ? events_.size() - max_events_
                           : 0;
  for (size_t i = first; i < events_.size(); ++i) {
    const Event& e = events_[i];
    w.BeginDict();
    w.Str("action").Str(SnapshotActionName(e.action));
    if (e.action == Action::kOom) {
      w.Str("device_free").Uint(e.addr);
    } else {
      w.Str("addr").Uint(e.addr);
    }
    w.Str("size").Uint(e.size);
    w.Str("stream").Uint(StreamHandle(e.stream));
    w.Str("time_us").Uint(e.time);
    w.Str("frames").BeginList().EndList();
    w.EndDict();
  }
  w.EndList();
  w.EndList();

  w.Str("allocator_settings").BeginDict();
  w.Str("PYTORCH_CUDA_ALLOC_CONF").Str(conf_);
  w.EndDict();

  w.EndDict();
  return w.Finish();
}

absl::Status WriteSnapshotFile(const std::string& path,
                               std::string_view pickle) {
  std::string gzipped;
  if (absl::EndsWith(path, ".gz")) {
    absl::StatusOr<std::string> z = Gzip(pickle);
    if (!z.ok()) return z.status();
    gzipped = *std::move(z);
    pickle = gzipped;
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  const bool written =
      std::fwrite(pickle.data(), 1, pickle.size(), file) == pickle.size();
  const int write_errno = errno;
  if (std::fclose(file) != 0 || !written) {
    return absl::ErrnoToStatus(written ? errno : write_errno,
                               absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace allocd
