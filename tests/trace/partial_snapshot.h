// Makes partial snapshots out of whole ones, for tests: the last N events of
// one device, as a late _record_memory_history() or its ring buffer
// (max_entries=N) would have kept them, with the end state (`segments`)
// intact.
#ifndef ALLOCD_TESTS_TRACE_PARTIAL_SNAPSHOT_H_
#define ALLOCD_TESTS_TRACE_PARTIAL_SNAPSHOT_H_

#include <zlib.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator/trace/pickle.h"
#include "allocator/trace/pickle_writer.h"

namespace allocd {

namespace partial_snapshot_internal {

// Copies plain data: None, bool, int, str, list (tuples as lists), dict.
// Dict entries of other kinds (floats, bytes) are left out: no key the
// reader uses holds one.
inline void Copy(const PickleDocument& doc, PickleValue v, PickleWriter& w) {
  switch (v.kind()) {
    case PickleKind::kNone:
      w.None();
      return;
    case PickleKind::kBool:
      w.Bool(doc.bool_value(v));
      return;
    case PickleKind::kInt:
      w.Int(doc.int_value(v));
      return;
    case PickleKind::kBigInt:
      w.Uint(doc.uint_value(v).value_or(0));
      return;
    case PickleKind::kStr:
      w.Str(doc.str_value(v));
      return;
    case PickleKind::kList:
    case PickleKind::kTuple:
    case PickleKind::kSet:
    case PickleKind::kFrozenSet:
      w.BeginList();
      for (PickleValue item : doc.items(v)) Copy(doc, item, w);
      w.EndList();
      return;
    case PickleKind::kDict:
      w.BeginDict();
      for (const PickleDocument::Entry& e : doc.entries(v)) {
        const PickleKind k = e.value.kind();
        if (e.key.kind() != PickleKind::kStr || k == PickleKind::kFloat ||
            k == PickleKind::kBytes || k == PickleKind::kByteArray) {
          continue;
        }
        w.Str(doc.str_value(e.key));
        Copy(doc, e.value, w);
      }
      w.EndDict();
      return;
    default:
      w.None();
      return;
  }
}

}  // namespace partial_snapshot_internal

// The content of a gzipped (or plain) file; "" when it cannot be read.
inline std::string ReadGunzipped(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return "";
  std::string out;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  gzclose(file);
  return out;
}

struct PartialSnapshotOptions {
  // Events of device_traces[device] to keep, the newest.
  size_t keep_last_events = 0;
  int device = 0;
  // Leave `segments` out too (a snapshot with nothing to reconstruct from).
  bool drop_end_state = false;
};

// `pickle` (not gzipped) with only the newest events of one device.
inline absl::StatusOr<std::string> MakePartialSnapshot(
    std::string_view pickle, const PartialSnapshotOptions& options) {
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  if (!doc.ok()) return doc.status();
  PickleWriter w;
  w.BeginDict();
  for (const PickleDocument::Entry& e : doc->entries(doc->root())) {
    const std::string_view key = doc->str_value(e.key);
    if (key == "segments" && options.drop_end_state) continue;
    if (key != "device_traces") {
      if (key == "segments" || key == "allocator_settings") {
        w.Str(key);
        partial_snapshot_internal::Copy(*doc, e.value, w);
      }
      continue;
    }
    w.Str(key).BeginList();
    int device = 0;
    for (PickleValue events : doc->items(e.value)) {
      w.BeginList();
      const size_t n = doc->size(events);
      const size_t first =
          device == options.device && n > options.keep_last_events
              ? n - options.keep_last_events
              : 0;
      size_t i = 0;
      for (PickleValue event : doc->items(events)) {
        if (i++ >= first) partial_snapshot_internal::Copy(*doc, event, w);
      }
      w.EndList();
      ++device;
    }
    w.EndList();
  }
  w.EndDict();
  return w.Finish();
}

}  // namespace allocd

#endif  // ALLOCD_TESTS_TRACE_PARTIAL_SNAPSHOT_H_
