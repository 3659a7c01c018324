#include "server/request_limits.h"

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"
#include "server/autotune/autotuner.h"
#include "server/config_store.h"

namespace allocd {
namespace {

absl::Status CheckAllocatorState(const v1::AllocatorState& s);

absl::Status CheckBytes(absl::string_view what, uint64_t bytes) {
  if (bytes <= kMaxEventBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is ", bytes, " bytes; at most ",
                                                 FormatSize(kMaxEventBytes)));
}

absl::Status CheckEvents(const v1::EventBatch& b) {
  const int n = b.ops_size();
  if (b.sizes_size() != n || b.ids_size() != n || b.streams_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event batch columns differ in length: ", n, " ops, ", b.sizes_size(),
        " sizes, ", b.ids_size(), " ids, ", b.streams_size(), " streams"));
  }
  if (static_cast<size_t>(n) > kMaxEventsPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event batch holds ", n, " events; at most ", kMaxEventsPerBatch));
  }
  for (uint32_t op : b.ops()) {
    if (op > kEventOpStep) {
      return absl::InvalidArgumentError(absl::StrCat(
          "event op ", op, " is not 0 (alloc), 1 (free_requested), 2 "
          "(free_completed) or 3 (step)"));
    }
  }
  for (uint64_t size : b.sizes()) {
    if (absl::Status s = CheckBytes("event size", size); !s.ok()) return s;
  }
  return b.has_state_after() ? CheckAllocatorState(b.state_after()) : absl::OkStatus();
}

// Shapes only: whether the blocks lie in the segments is the autotuner's
// to judge (JobWindow::AddState), as it judges the events.
absl::Status CheckAllocatorState(const v1::AllocatorState& s) {
  const int segments = s.segment_addresses_size();
  if (s.segment_sizes_size() != segments || s.segment_streams_size() != segments ||
      s.segment_flags_size() != segments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator state segment columns differ in length: ", segments, " addresses, ",
        s.segment_sizes_size(), " sizes, ", s.segment_streams_size(), " streams, ",
        s.segment_flags_size(), " flags"));
  }
  const int blocks = s.block_ids_size();
  if (s.block_addresses_size() != blocks || s.block_sizes_size() != blocks ||
      s.block_requested_size() != blocks || s.block_flags_size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator state block columns differ in length: ", blocks, " ids, ",
        s.block_addresses_size(), " addresses, ", s.block_sizes_size(), " sizes, ",
        s.block_requested_size(), " requested, ", s.block_flags_size(), " flags"));
  }
  if (static_cast<size_t>(segments) > kMaxStateSegments ||
      static_cast<size_t>(blocks) > kMaxStateBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator state holds ", segments, " segments and ", blocks, " blocks; at most ",
        kMaxStateSegments, " and ", kMaxStateBlocks));
  }
  for (uint64_t size : s.segment_sizes()) {
    if (absl::Status bad = CheckBytes("allocator state segment size", size); !bad.ok()) {
      return bad;
    }
  }
  for (int i = 0; i < blocks; ++i) {
    if (absl::Status bad = CheckBytes("allocator state block size", s.block_sizes(i));
        !bad.ok()) {
      return bad;
    }
    if (s.block_requested(i) > s.block_sizes(i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allocator state block ", s.block_ids(i), " requested ", s.block_requested(i),
          " bytes, more than its size ", s.block_sizes(i)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRegisterRequest(const v1::RegisterRequest& r) {
  if (r.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("client speaks protocol ", r.protocol_version(),
                     "; this daemon speaks ", kProtocolVersion));
  }
  if (absl::Status s = ValidateJobLabel(r.job()); !s.ok()) return s;
  if (r.device() < 0 || r.device() > kMaxClientDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", r.device(), " out of range"));
  }
  if (r.gpu_uuid().size() > kMaxGpuUuid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_uuid is ", r.gpu_uuid().size(), " bytes; at most ", kMaxGpuUuid));
  }
  // A run id is a key of the autotuner's, shown by allocctl: a label's
  // bytes and length.
  if (absl::Status s = ValidateJobLabel(r.rank().run_id()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("rank.run_id: ", s.message()));
  }
  if (r.rank().world_size() > 0 && r.rank().rank() >= r.rank().world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank().rank(),
                                                   " of a world of ", r.rank().world_size()));
  }
  const v1::AutotunePreferences& autotune = r.autotune();
  if (!autotune.mode().empty()) {
    if (absl::Status s = ParseAutotuneMode(autotune.mode()).status(); !s.ok()) return s;
  }
  if (static_cast<size_t>(autotune.pinned_keys_size()) > kMaxPinnedKeys) {
    return absl::InvalidArgumentError(absl::StrCat("autotune pins ", autotune.pinned_keys_size(),
                                                   " keys; at most ", kMaxPinnedKeys));
  }
  for (const std::string& key : autotune.pinned_keys()) {
    if (key.empty() || key.size() > kMaxPinnedKey) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a pinned key is ", key.size(), " bytes; 1 to ", kMaxPinnedKey));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckClientDescription(absl::string_view client) {
  if (client.size() <= kMaxClientDescription) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("client description is ", client.size(),
                   " bytes; at most ", kMaxClientDescription));
}

absl::Status CheckAcquireBytes(uint64_t bytes, uint64_t max_acquire_bytes) {
  if (bytes != 0 && bytes <= max_acquire_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("bytes must be in [1, ", FormatSize(max_acquire_bytes),
                   "]; got ", bytes));
}

absl::Status CheckReleaseIds(int count) {
  if (count != 0 && static_cast<size_t>(count) <= kMaxChunkIdsPerRequest) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "chunk_ids must hold 1 to ", kMaxChunkIdsPerRequest, " ids; got ",
      count));
}

absl::Status CheckShareIds(int count) {
  if (static_cast<size_t>(count) <= kMaxChunkIdsPerRequest) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("chunk_ids must hold at most ", kMaxChunkIdsPerRequest,
                   " ids; got ", count));
}

absl::Status CheckTelemetry(const v1::TelemetryReport& r) {
  if (static_cast<size_t>(r.stats_size()) > kMaxStats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "telemetry holds ", r.stats_size(), " stats; at most ", kMaxStats));
  }
  for (const auto& [name, value] : r.stats()) {
    if (name.size() > kMaxStatName) {
      return absl::InvalidArgumentError(absl::StrCat("a stat's name is ", name.size(),
                                                     " bytes; at most ", kMaxStatName));
    }
  }
  return r.has_events() ? CheckEvents(r.events()) : absl::OkStatus();
}

absl::Status CheckOomMessage(absl::string_view message) {
  if (message.size() <= kMaxOomMessage) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "OOM message is ", message.size(), " bytes; at most ", kMaxOomMessage));
}

absl::Status CheckNackError(absl::string_view error) {
  if (error.size() <= kMaxOomMessage) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("NACK error text over ", kMaxOomMessage, " bytes"));
}

}  // namespace allocd
