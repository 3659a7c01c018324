// Replay: runs a Trace through the caching-allocator engine under a config
// and a device capacity, and reports what PyTorch's memory_stats() would
// (what it is asked and reports: replay_types.h).
#ifndef ALLOCD_ALLOCATOR_TRACE_REPLAY_H_
#define ALLOCD_ALLOCATOR_TRACE_REPLAY_H_

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "allocator/trace/replay_types.h"
#include "allocator/trace/trace.h"

namespace allocd {

// Replays `trace` under `config`. A partial trace whose state at the first
// event was reconstructed (Trace::partial.reconstructed()) starts from it:
// its segments and blocks are adopted at their recorded addresses, as
// if recording had begun then under `config` (the engine keeps what it
// finds, as after _set_allocator_settings), so peaks include what was
// live; ResourceExhausted when that state alone passes the capacity, and
// InvalidArgument with options.device (a live device cannot hold it).
// InvalidArgument for a trace that frees what it never allocated, options
// that make no sense (fraction outside [0,1], a switch past the end of the
// trace or to another backend), or an observer or a live switch on a
// backend:cudaMallocAsync replay (an estimate without blocks).
absl::StatusOr<ReplayResult> Replay(const Trace& trace,
                                    const AllocatorConfig& config,
                                    const ReplayOptions& options = {});

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_REPLAY_H_
