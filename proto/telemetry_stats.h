// Telemetry stats (TelemetryReport.stats) that are allocd's own, not
// PyTorch's memory_stats() names: the client adds them to what the process
// publishes, the daemon reads them.
#ifndef ALLOCD_PROTO_TELEMETRY_STATS_H_
#define ALLOCD_PROTO_TELEMETRY_STATS_H_

#include <cstddef>

namespace allocd {

// Bytes the client read ahead (AcquireChunksRequest.read_ahead) and holds
// unmapped: a reclaim counts them as cached.
inline constexpr char kReadAheadStat[] = "allocd.read_ahead_bytes";

// The most segments of a working set (TelemetryReport.working_set) a
// client sends and the daemon keeps.
inline constexpr size_t kMaxWorkingSetSegments = 4096;

}  // namespace allocd

#endif  // ALLOCD_PROTO_TELEMETRY_STATS_H_
