// SnapshotAction: the `action` of an event in a PyTorch memory snapshot's
// device_traces (torch.cuda.memory._snapshot()), by the name PyTorch writes.
// The reader parses them and the writer writes them from this one table.
#ifndef ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_ACTION_H_
#define ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_ACTION_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace allocd {

enum class SnapshotAction : uint8_t {
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

// Every action with its name, most frequent first (the reader tries them
// in this order).
inline constexpr std::pair<std::string_view, SnapshotAction>
    kSnapshotActions[] = {
        {"alloc", SnapshotAction::kAlloc},
        {"free_requested", SnapshotAction::kFreeRequested},
        {"free_completed", SnapshotAction::kFreeCompleted},
        {"segment_alloc", SnapshotAction::kSegmentAlloc},
        {"segment_free", SnapshotAction::kSegmentFree},
        {"segment_map", SnapshotAction::kSegmentMap},
        {"segment_unmap", SnapshotAction::kSegmentUnmap},
        {"snapshot", SnapshotAction::kSnapshot},
        {"oom", SnapshotAction::kOom},
};

// The action PyTorch calls `name`; nullopt for a name it does not write.
constexpr std::optional<SnapshotAction> ParseSnapshotAction(
    std::string_view name) {
  for (const auto& [n, action] : kSnapshotActions) {
    if (n == name) return action;
  }
  return std::nullopt;
}

// The name PyTorch writes for `action`.
constexpr std::string_view SnapshotActionName(SnapshotAction action) {
  for (const auto& [n, a] : kSnapshotActions) {
    if (a == action) return n;
  }
  return "";
}

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_SNAPSHOT_ACTION_H_
