#include "allocator/trace/snapshot_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/trace/pickle.h"

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

enum class Action {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kSnapshot,
  kOom,
};

// The event fields the trace reads.
enum Field { kActionField, kAddrField, kSizeField, kStreamField, kOtherField };

Field ParseField(std::string_view key) {
  static constexpr std::string_view kFields[] = {"action", "addr", "size",
                                                 "stream"};
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
  // Most frequent first.
  static constexpr std::pair<std::string_view, Action> kActions[] = {
      {"alloc", Action::kAlloc},
      {"free_requested", Action::kFreeRequested},
      {"free_completed", Action::kFreeCompleted},
      {"segment_alloc", Action::kSegmentAlloc},
      {"segment_free", Action::kSegmentFree},
      {"segment_map", Action::kSegmentMap},
      {"segment_unmap", Action::kSegmentUnmap},
      {"snapshot", Action::kSnapshot},
      {"oom", Action::kOom},
  };
  for (const auto& [n, action] : kActions) {
    if (n == name) return action;
  }
  return std::nullopt;
}

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
        return AddFree(*kind, address);
      case Action::kSegmentAlloc:
        if (absl::Status s = GetUint(addr, "addr", address); !s.ok()) return s;
        if (absl::Status s = GetUint(size, "size", bytes); !s.ok()) return s;
        trace_.recorded_segments.push_back(
            {address, bytes, trace_.events.size()});
        return absl::OkStatus();
      case Action::kSegmentFree:
        ++trace_.omitted.segment_free;
        return absl::OkStatus();
      case Action::kSegmentMap:
        ++trace_.omitted.segment_map;
        return absl::OkStatus();
      case Action::kSegmentUnmap:
        ++trace_.omitted.segment_unmap;
        return absl::OkStatus();
      case Action::kSnapshot:
        ++trace_.omitted.snapshot;
        return absl::OkStatus();
      case Action::kOom:
        ++trace_.omitted.oom;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // The trace, with stream indices in ascending handle order.
  Trace Finish() && {
    std::vector<uint64_t> sorted = stream_handles_;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint16_t> final_index(stream_handles_.size());
    for (size_t i = 0; i < stream_handles_.size(); ++i) {
      final_index[i] = static_cast<uint16_t>(
          std::lower_bound(sorted.begin(), sorted.end(), stream_handles_[i]) -
          sorted.begin());
    }
    for (TraceEvent& e : trace_.events) e.stream = final_index[e.stream];
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

  template <typename... Args>
  absl::Status Error(const absl::FormatSpec<Args...>& format,
                     const Args&... args) const {
    return SnapshotError("device_traces[%d][%d]: %s", trace_.device, index_,
                         absl::StrFormat(format, args...));
  }

  // Reads the non-negative int `field` called `name` into `out`.
  absl::Status GetUint(const std::optional<PickleValue>& field,
                       std::string_view name, uint64_t& out) const {
    if (field && field->kind() == PickleKind::kInt &&
        doc_.int_value(*field) >= 0) {
      out = static_cast<uint64_t>(doc_.int_value(*field));
      return absl::OkStatus();
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
    auto [stream, inserted] = stream_index_.try_emplace(
        handle, static_cast<uint16_t>(stream_handles_.size()));
    if (inserted) {
      if (stream_handles_.size() > std::numeric_limits<uint16_t>::max()) {
        return Error("more than 65536 distinct streams");
      }
      stream_handles_.push_back(handle);
    }
    const uint32_t id = trace_.num_ids;
    auto [block, fresh] =
        live_.try_emplace(address, LiveBlock{id, stream->second, false, size});
    if (!fresh) {
      return Error(
          "alloc at 0x%x, which holds a live block since alloc #%d (its "
          "free_completed is missing)",
          address, block->second.id);
    }
    ++trace_.num_ids;
    trace_.events.push_back({TraceOp::kAlloc, stream->second, id, size});
    return absl::OkStatus();
  }

  // A free of an address no recorded alloc holds is skipped and counted:
  // recording began after the block was allocated.
  absl::Status AddFree(Action action, uint64_t address) {
    const auto it = live_.find(address);
    if (it == live_.end()) {
      ++trace_.omitted.unmatched_frees;
      return absl::OkStatus();
    }
    LiveBlock& block = it->second;
    const bool requested = action == Action::kFreeRequested;
    if (requested == block.free_requested) {
      return Error("%s of 0x%x (alloc #%d)",
                   requested ? "second free_requested"
                             : "free_completed without free_requested",
                   address, block.id);
    }
    trace_.events.push_back(
        {requested ? TraceOp::kFreeRequested : TraceOp::kFreeCompleted,
         block.stream, block.id, block.size});
    if (requested) {
      block.free_requested = true;
    } else {
      live_.erase(it);
    }
    return absl::OkStatus();
  }

  const PickleDocument& doc_;
  StrMeaning<Field, ParseField> fields_;
  StrMeaning<std::optional<Action>, ParseAction> actions_;
  Trace trace_;
  // The event being added, for error messages.
  size_t index_ = 0;
  absl::flat_hash_map<uint64_t, LiveBlock> live_;
  absl::flat_hash_map<uint64_t, uint16_t> stream_index_;
  // Handles by provisional index.
  std::vector<uint64_t> stream_handles_;
};

// device_traces[device], with `device` chosen as SnapshotReadOptions says.
absl::StatusOr<PickleValue> SelectDevice(const PickleDocument& doc,
                                         PickleValue device_traces,
                                         int& device) {
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
  if (device == -1) {
    if (with_events.size() == 1) {
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
  absl::StatusOr<PickleValue> events =
      SelectDevice(doc, *device_traces, device);
  if (!events.ok()) return events.status();
  absl::StatusOr<std::string> config = RecordedConfig(doc, root);
  if (!config.ok()) return config.status();

  TraceBuilder builder(doc, device, doc.size(*events));
  size_t index = 0;
  for (PickleValue event : doc.items(*events)) {
    if (absl::Status s = builder.Add(event, index++); !s.ok()) return s;
  }
  Trace trace = std::move(builder).Finish();
  trace.recorded_config = *std::move(config);
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
