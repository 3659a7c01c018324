// Reads torch.cuda.memory._snapshot() pickles (gzipped or not) into a Trace.
//
// The pickle is decoded by a restricted unpickler (allocator/trace/pickle.h)
// that executes nothing: a corrupt or malicious file is an InvalidArgument
// status naming the byte offset and the opcode, never a crash or a hang.
#ifndef ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_READER_H_
#define ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_READER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"

namespace allocd {

struct SnapshotReadOptions {
  // Which device's trace to read. -1: the only device that has events; an
  // error naming the devices when several have.
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
