// Request limits: the bounds the daemon holds each request to before it
// acts on it, so that no client makes it keep, log or loop over unbounded
// data. The wire limits both sides keep (chunk ids per request, events per
// batch) are proto/protocol.h's; the rest are the daemon's own.
//
// Each check returns InvalidArgument naming the field, its bound and what
// came, unless it says otherwise. Stateless: thread-safe.
#ifndef ALLOCD_SERVER_REQUEST_LIMITS_H_
#define ALLOCD_SERVER_REQUEST_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "allocd.pb.h"

namespace allocd {

// RegisterRequest.client: how the client describes itself, for logs.
inline constexpr size_t kMaxClientDescription = 256;
// RegisterRequest.gpu_uuid.
inline constexpr size_t kMaxGpuUuid = 128;
// RegisterRequest.device: the client's CUDA ordinal.
inline constexpr int kMaxClientDevice = 1023;
// OomReport.message, and ConfigAck.error (a NACK's reason).
inline constexpr size_t kMaxOomMessage = 4096;
// TelemetryReport.stats: how many named stats one report holds, and the
// bytes of a name (PyTorch's are under 64).
inline constexpr size_t kMaxStats = 1024;
inline constexpr size_t kMaxStatName = 128;
// AutotunePreferences.pinned_keys: how many, and the bytes of one
// (PYTORCH_CUDA_ALLOC_CONF has about a dozen keys, none over 40 bytes).
inline constexpr size_t kMaxPinnedKeys = 64;
inline constexpr size_t kMaxPinnedKey = 64;

// A registration's protocol version (FailedPrecondition, naming both, for
// another than kProtocolVersion), job label (ValidateJobLabel), device
// ordinal (0 to kMaxClientDevice), GPU UUID length, and autotune
// preferences: a mode that is empty, "off", "recommend" or "apply", and at
// most kMaxPinnedKeys pinned keys of 1 to kMaxPinnedKey bytes. The
// description is CheckClientDescription's, after the device is known.
absl::Status CheckRegisterRequest(const v1::RegisterRequest& r);
absl::Status CheckClientDescription(absl::string_view client);

// AcquireChunksRequest.bytes: 1 to `max_acquire_bytes`
// (DaemonCoreOptions::max_acquire_bytes).
absl::Status CheckAcquireBytes(uint64_t bytes, uint64_t max_acquire_bytes);

// The chunk ids of a ReleaseChunksRequest (1 to kMaxChunkIdsPerRequest) and
// of a ShareChunksRequest (at most kMaxChunkIdsPerRequest).
absl::Status CheckReleaseIds(int count);
absl::Status CheckShareIds(int count);

// A telemetry report's stats (at most kMaxStats, names of at most
// kMaxStatName bytes) and its event batch, if
// any: columns of one length, at most kMaxEventsPerBatch events, ops 0
// (alloc), 1 (free_requested), 2 (free_completed) or 3 (kEventOpStep, a
// step mark), sizes of at most kMaxEventBytes, and its allocator state's
// columns of one length, at most kMaxStateSegments segments and
// kMaxStateBlocks blocks, each segment and block of at most kMaxEventBytes
// and no block requesting more than its size. Its working set is the
// WorkingSetStore's to check.
absl::Status CheckTelemetry(const v1::TelemetryReport& r);

// OomReport.message and ConfigAck.error: at most kMaxOomMessage bytes.
absl::Status CheckOomMessage(absl::string_view message);
absl::Status CheckNackError(absl::string_view error);

}  // namespace allocd

#endif  // ALLOCD_SERVER_REQUEST_LIMITS_H_
