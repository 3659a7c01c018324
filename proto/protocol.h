// The wire contract beyond allocd.proto's messages: the protocol version and
// the limits both sides hold each other to. The client and the daemon read
// them from here, so a limit cannot differ between the side that keeps to it
// and the side that enforces it.
#ifndef ALLOCD_PROTO_PROTOCOL_H_
#define ALLOCD_PROTO_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace allocd {

// RegisterRequest.protocol_version: a daemon refuses a client that speaks
// another (FailedPrecondition, naming both).
inline constexpr uint32_t kProtocolVersion = 1;

// Where the daemon serves clients, and where they look for it, unless told
// otherwise (allocd serve --socket, $ALLOCD_SOCKET). The Python package reads
// it from the client library (allocd_default_socket).
inline constexpr char kDefaultSocket[] = "/run/allocd/allocd.sock";

// The most chunk ids one ReleaseChunksRequest or ShareChunksRequest holds;
// a client releases more in batches of this many.
inline constexpr size_t kMaxChunkIdsPerRequest = 65536;

// The most events one TelemetryReport's EventBatch holds.
inline constexpr size_t kMaxEventsPerBatch = 65536;

// StreamDemand.from_reserved for a session whose stream the daemon does not
// read at all: its job's autotuner reads another session's (one a job), and
// tells this one when it reads it instead (its demand then says how much).
inline constexpr uint64_t kStreamNotRead = ~uint64_t{0};

// The largest size an event, an allocator state's segment or block (and
// its requested size) may name: 256 TiB, far past any device's memory.
// Bounded so that what the daemon sums over a session's allocations never
// overflows.
inline constexpr uint64_t kMaxEventBytes = uint64_t{1} << 48;

// EventBatch.ops: after alloc (0), free_requested (1) and free_completed (2),
// a step mark: the job ended a step here (its optimizer stepped), so the
// daemon knows the job's steps instead of guessing them. Its size, id and
// stream are 0. Clients that send none still work: the daemon then finds
// the step in the stream itself.
inline constexpr uint32_t kEventOpStep = 3;

// AllocatorState (EventBatch.state_after): the most segments and blocks
// one holds, so that a report carrying it stays under the daemon's 1 MiB
// message limit (a client whose allocator holds more sends none), and its
// flags.
inline constexpr size_t kMaxStateSegments = 4096;
inline constexpr size_t kMaxStateBlocks = 16384;
inline constexpr uint32_t kStateSegmentSmall = 1;
inline constexpr uint32_t kStateSegmentExpandable = 2;
inline constexpr uint32_t kStateBlockFreeRequested = 1;

// The most grants one read-ahead takes (AcquireChunksRequest.count).
inline constexpr uint32_t kMaxReadAheadGrants = 16;

// The largest side-socket message either side reads (a frame of a
// SideRequest or SideResponse).
inline constexpr size_t kMaxSideMessageBytes = size_t{1} << 20;

// Telemetry stats (TelemetryReport.stats) that are allocd's own, not
// PyTorch's memory_stats() names: the client adds them to what the process
// publishes, the daemon reads them.
//
// Bytes the client read ahead (AcquireChunksRequest.read_ahead) and holds
// unmapped: a reclaim counts them as cached.
inline constexpr char kReadAheadStat[] = "allocd.read_ahead_bytes";

// The most segments of a working set (TelemetryReport.working_set) a
// client sends and the daemon keeps.
inline constexpr size_t kMaxWorkingSetSegments = 4096;

// Admin's SetConfig, GetConfig and ClearConfig name a job config by a
// key: a job label (empty: the node default), its config in every tenant,
// or "LABEL@TENANT" (TENANT as SessionInfo.tenant shows it), the label's
// config in that tenant alone. '@' is in no label, so a key reads one way.
inline std::string TenantJobKey(std::string_view job, std::string_view tenant) {
  std::string key(job);
  if (!tenant.empty()) key.append("@").append(tenant);
  return key;
}

}  // namespace allocd

#endif  // ALLOCD_PROTO_PROTOCOL_H_
