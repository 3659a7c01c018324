// Reads torch.cuda.memory._snapshot() pickles (gzipped or not) into a Trace.
//
// The pickle is decoded by a restricted unpickler (allocator/trace/pickle.h)
// that executes nothing: a corrupt or malicious file is an InvalidArgument
// status naming the byte offset and the opcode, never a crash or a hang.
// A gzip file (detected by its magic bytes; several members allowed) may
// inflate to at most 4 GiB.
//
// The events of device_traces[device], in order, become the Trace:
// - `alloc`: the next id (0, 1, 2, ...), which its address names from now on.
// - `free_requested`, `free_completed`: the id the address names, with the
//   alloc's size and stream; free_completed ends the naming. A free of an
//   address that no recorded alloc holds frees a block allocated before the
//   first event (recording began later, or _record_memory_history's
//   max_entries dropped the alloc): it gets an id of its own.
// - `segment_alloc`: a Trace::recorded_segments entry.
// - `segment_free`, `segment_map`, `segment_unmap`, `snapshot`, `oom`:
//   counted in Trace::omitted.
//
// A partial snapshot (Trace::partial): the memory its first event found is
// reconstructed from the end state (`segments` of the device: segments,
// expandable segments' mapped ranges, and the blocks in them that are
// 'active_allocated' or 'active_pending_free') walked back through the
// events: less what segment_alloc and segment_map made, plus what
// segment_free and segment_unmap returned; live blocks less those the trace
// allocated, plus those it freed. A block only a free names gets the request
// rounded under the recorded config, and the rest of its space up to the
// next block when that is at most 1 MiB of the large pool (PyTorch keeps no
// free large block that small). Where that cannot be done (no `segments`,
// or an end state that contradicts the events) Trace::partial.unrecoverable
// says why, and the frees of those blocks are skipped and counted in
// Trace::omitted.unmatched_frees. A partial trace of exactly 1000·k or 2^k
// events (k ≥ 10 for 2^k) looks like a wrapped ring buffer.
// Trace::streams are the distinct stream handles of the allocs, ascending;
// Trace::recorded_config is allocator_settings['PYTORCH_CUDA_ALLOC_CONF'].
//
// Events that cannot be replayed faithfully are InvalidArgument errors
// naming the event ("device_traces[0][1234]: missing 'size'"): an unknown
// action, a missing or mistyped field, an alloc at an address that is still
// live (PyTorch never reuses an address before its free_completed, so events
// were lost), a second free_requested, a free_completed without one.
#ifndef ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_READER_H_
#define ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_READER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"

namespace allocd {

struct SnapshotReadOptions {
  // Which device's trace to read. -1: the only device that has events; an
  // error naming the devices when several have, or when none has. A device
  // that device_traces does not have is an error; one without events gives
  // an empty Trace.
  int device = -1;
};

// `bytes` is the file's content: a pickle, or a gzip stream of one.
absl::StatusOr<Trace> ParseSnapshot(std::string_view bytes,
                                    const SnapshotReadOptions& options = {});

// Reads and parses the file at `path`.
absl::StatusOr<Trace> ReadSnapshotFile(const std::string& path,
                                       const SnapshotReadOptions& options = {});

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_READER_H_
