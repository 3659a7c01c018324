#include "server/restart_adoption.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "server/log.h"
#include "server/pool_metrics.h"

namespace allocd {

RestartAdoption::RestartAdoption(Options options, absl::Time started,
                                 const DevicePools* pools,
                                 const SessionRegistry* sessions,
                                 Metrics* metrics)
    : options_(std::move(options)),
      pools_(pools),
      sessions_(sessions),
      metrics_(metrics),
      window_(options_.sessions_file.empty()
                  ? SessionsByPid{}
                  : ReadSessionsFile(options_.sessions_file, ProcessAlive),
              started + options_.window) {
  if (const SessionsByPid awaited = window_.pending(); !awaited.empty()) {
    std::string pids;
    for (const auto& [pid, sessions] : awaited) {
      absl::StrAppend(&pids, pids.empty() ? "" : ", ", pid);
    }
    LogInfo(absl::StrCat(
        "restarted with ", awaited.size(), " process(es) of the daemon "
        "before still alive (pids ", pids, "): new memory waits up to ",
        absl::FormatDuration(options_.window),
        " for them to re-declare the chunks they hold"));
  }
  Settle();
}

void RestartAdoption::Await() {
  window_.Wait();
  Settle();
}

void RestartAdoption::Adopted(const DevicePool& device,
                              uint64_t adopted_bytes) {
  absl::MutexLock lock(&settle_mu_);
  auto ceiling = capacity_ceiling_.find(device.index);
  if (ceiling != capacity_ceiling_.end() && adopted_bytes > 0) {
    NodePool& pool = *device.pool;
    pool.SetCapacity(
        std::min(ceiling->second, pool.capacity() + adopted_bytes));
  }
}

void RestartAdoption::FinishedDeclaring(pid_t pid) {
  window_.Returned(pid);
  SaveSessions();
  Settle();
}

void RestartAdoption::Tick(absl::Time now) {
  if (!window_.open()) return;
  window_.Tick(now);
  if (window_.open()) return;
  SaveSessions();
  Settle();
}

void RestartAdoption::Settle() {
  if (window_.open()) return;
  absl::MutexLock lock(&settle_mu_);
  if (settled_) return;
  settled_ = true;
  for (const DevicePool& device : pools_->devices()) FitCapacity(device);
}

void RestartAdoption::FitCapacity(const DevicePool& device) {
  if (static_cast<size_t>(device.index) >= options_.devices_at_start.size()) {
    return;
  }
  const DeviceAtStart& at_start = options_.devices_at_start[device.index];
  if (!at_start.free_memory.has_value()) return;
  const PoolStats stats = device.pool->Stats();
  // Before any Acquire: the live chunks are the adopted ones, in use on the
  // device at start, so not in its free memory.
  const uint64_t adopted = stats.created_bytes;
  if (at_start.capacity_from_free) {
    capacity_ceiling_[device.index] = UINT64_MAX;
    if (adopted == 0) return;
    device.pool->SetCapacity(stats.capacity + adopted);
    LogInfo(absl::StrCat("device ", device.index, " (", device.uuid,
                         "): capacity ", FormatSize(stats.capacity + adopted),
                         ", its free memory at start less --headroom plus ",
                         FormatSize(adopted),
                         " its surviving clients hold"));
    PublishPool(device, *metrics_);
    return;
  }
  const uint64_t limit = *at_start.free_memory + adopted;
  if (stats.capacity <= limit) return;
  LogError(absl::StrCat(
      "device ", device.index, " (", device.uuid, "): --capacity ",
      FormatSize(stats.capacity), " is more than the device can give: ",
      FormatSize(*at_start.free_memory), " free at start",
      adopted > 0 ? absl::StrCat(" plus ", FormatSize(adopted),
                                 " its surviving clients hold")
                  : "",
      "; serving ", FormatSize(limit), " (other processes use the rest of "
      "the GPU: lower --capacity to silence this)"));
  capacity_ceiling_[device.index] = stats.capacity;
  device.pool->SetCapacity(limit);
  PublishPool(device, *metrics_);
}

void RestartAdoption::SaveSessions() {
  if (options_.sessions_file.empty() || shutting_down_) return;
  absl::MutexLock lock(&file_mu_);
  SessionsByPid sessions;
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    ++sessions[s->identity().pid];
  }
  // A process that has not finished declaring counts as it did before.
  for (const auto& [pid, awaited] : window_.pending()) {
    int& count = sessions[pid];
    count = std::max(count, awaited);
  }
  if (absl::Status s = WriteSessionsFile(options_.sessions_file, sessions);
      !s.ok()) {
    LogError(absl::StrCat("the sessions file (for the next daemon after a "
                          "restart): ", s.message()));
  }
}

}  // namespace allocd
