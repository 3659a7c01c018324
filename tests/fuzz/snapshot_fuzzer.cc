// ParseSnapshot on arbitrary bytes (plain or gzipped pickles): any input
// must give a Trace or an error status, never a crash, a hang, a leak or an
// out-of-bounds access; and a Trace it gives must keep the contract of
// allocator/trace/trace.h, which the replay relies on.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "allocator/trace/snapshot_reader.h"

namespace {

// Traps unless ids and streams are in range and each id goes alloc, then
// free_requested, then free_completed, at most once each; a block live at a
// partial trace's first event starts past its alloc (and its free_requested
// when it was pending), inside a segment of that state.
void CheckTrace(const allocd::Trace& trace) {
  std::vector<int> stage(trace.num_ids, 0);
  const allocd::PartialTrace& partial = trace.partial;
  if (!partial.reconstructed() &&
      (!partial.blocks.empty() || !partial.segments.empty())) {
    __builtin_trap();
  }
  for (const allocd::InitialSegment& s : partial.segments) {
    if (s.stream >= trace.streams.size()) __builtin_trap();
  }
  for (const allocd::InitialBlock& b : partial.blocks) {
    if (b.id >= trace.num_ids || stage[b.id] != 0) __builtin_trap();
    stage[b.id] = b.free_requested ? 2 : 1;
  }
  for (const allocd::TraceEvent& e : trace.events) {
    if (e.id >= trace.num_ids || e.stream >= trace.streams.size()) {
      __builtin_trap();
    }
    const int op = static_cast<int>(e.op);
    if (stage[e.id] != op) __builtin_trap();
    stage[e.id] = op + 1;
  }
  for (size_t i = 1; i < trace.streams.size(); ++i) {
    if (trace.streams[i - 1] >= trace.streams[i]) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Device -1 and device 1 take different paths through device selection.
  for (int device : {-1, 1}) {
    absl::StatusOr<allocd::Trace> trace =
        allocd::ParseSnapshot(bytes, {device});
    if (trace.ok()) CheckTrace(*trace);
  }
  return 0;
}
