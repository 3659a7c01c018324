#include "server/restart_adoption.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "server/log.h"
#include "server/pool_metrics.h"

namespace allocd {

namespace {

// The sessions file the daemon before left, or nothing (logged unless
// there was none).
SessionsFile ReadBefore(const std::string& path) {
  if (path.empty()) return {};
  absl::StatusOr<SessionsFile> read = ReadSessionsFile(path, ProcessAlive);
  if (read.ok()) return *std::move(read);
  if (!absl::IsNotFound(read.status())) {
    LogError(absl::StrCat("the sessions file of the daemon before: ",
                          read.status().message(),
                          "; no chunk of the daemon before is adopted"));
  }
  return {};
}

}  // namespace

RestartAdoption::RestartAdoption(Options options, absl::Time started,
                                 const DevicePools* pools,
                                 const SessionRegistry* sessions,
                                 Metrics* metrics)
    : options_(std::move(options)),
      pools_(pools),
      sessions_(sessions),
      metrics_(metrics),
      before_(ReadBefore(options_.sessions_file)),
      window_(before_.sessions, started + options_.window) {
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
    absl::MutexLock lock(&settle_mu_);
    std::map<std::string, uint64_t> listed_bytes;  // by device
    for (const auto& [tenant, chunks] : before_.chunks) {
      for (const HandedChunk& c : chunks) {
        awaited_chunks_[tenant][{c.device, c.id}] = c.bytes;
        listed_bytes[c.device] += c.bytes;
      }
    }
    // A capacity taken from the device's free memory at start lacks what
    // the survivors hold (in use then): for the window it grows by what
    // the file lists, so that their declarations fit; fitting takes that
    // back and adds what was adopted.
    for (const DevicePool& device : pools_->devices()) {
      const size_t i = static_cast<size_t>(device.index);
      auto listed = listed_bytes.find(device.uuid);
      if (i >= options_.devices_at_start.size() ||
          !options_.devices_at_start[i].capacity_from_free ||
          listed == listed_bytes.end()) {
        continue;
      }
      raised_for_window_[device.index] = listed->second;
      device.pool->SetCapacity(device.pool->capacity() + listed->second);
    }
  }
  before_.chunks.clear();  // kept in awaited_chunks_ while the window is open
  Settle();
}

void RestartAdoption::Await() {
  window_.Wait();
  Settle();
}

absl::StatusOr<AdoptOutcome> RestartAdoption::Declare(
    const TenantId& tenant, const DevicePool& device,
    std::vector<DeclaredChunk> chunks, AdoptFn adopt) {
  AdoptOutcome refused;
  std::vector<DeclaredChunk> listed;
  absl::MutexLock lock(&settle_mu_);
  if (settled_ || !window_.open()) {
    for (const DeclaredChunk& c : chunks) {
      refused.refused.emplace_back(
          c.id, "declared outside the adoption window after a daemon "
                "start: only chunks of the daemon before, while it is open, "
                "are adopted");
    }
    return refused;  // `chunks` and their FDs go with it
  }
  static const std::map<std::pair<std::string, uint64_t>, uint64_t> kNone;
  auto of_tenant = awaited_chunks_.find(tenant);
  const auto& awaited =
      of_tenant == awaited_chunks_.end() ? kNone : of_tenant->second;
  for (DeclaredChunk& c : chunks) {
    auto it = awaited.find({device.uuid, c.id});
    if (it == awaited.end()) {
      refused.refused.emplace_back(
          c.id, absl::StrCat("the daemon before did not hand it to tenant ",
                             tenant, " on device ", device.uuid,
                             ", or it was adopted already"));
    } else if (it->second != c.bytes) {
      refused.refused.emplace_back(
          c.id, absl::StrCat("declared as ", FormatSize(c.bytes),
                             "; the daemon before handed it out as ",
                             FormatSize(it->second)));
    } else {
      listed.push_back(std::move(c));
    }
  }
  chunks.clear();  // the refused ones' FDs, closed now
  absl::StatusOr<AdoptOutcome> outcome = adopt(std::move(listed));
  if (!outcome.ok()) return outcome;
  for (uint64_t id : outcome->adopted) {
    of_tenant->second.erase({device.uuid, id});  // adopted: it was listed
  }
  for (auto& r : refused.refused) outcome->refused.push_back(std::move(r));
  return outcome;
}

void RestartAdoption::FinishedDeclaring(pid_t pid) {
  window_.Returned(pid);
  SaveSessions();
  Settle();
}

void RestartAdoption::Tick(absl::Time now) {
  SaveChunks(now);
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
  awaited_chunks_.clear();
  for (const DevicePool& device : pools_->devices()) FitCapacity(device);
}

void RestartAdoption::FitCapacity(const DevicePool& device) {
  if (static_cast<size_t>(device.index) >= options_.devices_at_start.size()) {
    return;
  }
  const DeviceAtStart& at_start = options_.devices_at_start[device.index];
  if (!at_start.free_memory.has_value()) return;
  PoolStats stats = device.pool->Stats();
  // Back to the capacity before the window raised it.
  if (auto raised = raised_for_window_.find(device.index);
      raised != raised_for_window_.end()) {
    stats.capacity -= raised->second;
    device.pool->SetCapacity(stats.capacity);
  }
  // Before any Acquire: the live chunks are the adopted ones, in use on the
  // device at start, so not in its free memory.
  const uint64_t adopted = stats.created_bytes;
  if (at_start.capacity_from_free) {
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
  device.pool->SetCapacity(limit);
  PublishPool(device, *metrics_);
}

uint64_t RestartAdoption::HoldingsVersion() const {
  uint64_t version = 0;
  for (const DevicePool& device : pools_->devices()) {
    version += device.pool->holdings_version();
  }
  return version;
}

// How the file keeps up with the chunks, cheaply: a grant appends its
// chunks (one write() of a few lines, Granted) before it is answered, so a
// crash -- even kill -9 right after a grant -- never loses a chunk a
// client was handed, and a restarted daemon adopts exactly what clients
// hold. Releases are not written as they happen: the file is rewritten
// whole (O(chunks)) only when sessions start or end, and otherwise at
// most every save_chunks_every (250 ms) when chunks changed hands, which
// drops the released ones; a node busy with grants and releases writes it
// 4 times a second, not thousands. What that costs: a chunk released in
// the last 250 ms before a crash is still listed, for the tenant it was
// handed to, which may still map it; adopting it is counted against the
// capacity and the quotas like any other, and gives nothing across
// tenants.
void RestartAdoption::SaveChunks(absl::Time now) {
  if (options_.sessions_file.empty() || shutting_down_) return;
  {
    absl::MutexLock lock(&file_mu_);
    if (HoldingsVersion() == saved_version_ ||
        now - saved_at_ < options_.save_chunks_every) {
      return;
    }
  }
  SaveSessions();
}

void RestartAdoption::SaveSessions() {
  if (options_.sessions_file.empty() || shutting_down_) return;
  absl::MutexLock lock(&file_mu_);
  // Read before the state it versions: a change after it is saved again.
  const uint64_t version = HoldingsVersion();
  SessionsFile contents;
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    ++contents.sessions[s->identity().pid];
  }
  // A process that has not finished declaring counts as it did before.
  for (const auto& [pid, awaited] : window_.pending()) {
    int& count = contents.sessions[pid];
    count = std::max(count, awaited);
  }
  for (const DevicePool& device : pools_->devices()) {
    for (const HeldChunk& held : device.pool->HeldChunks()) {
      contents.chunks[held.tenant].push_back(
          {.device = device.uuid, .id = held.id, .bytes = held.bytes});
    }
  }
  {
    // The daemon before's chunks nobody adopted yet stay listed while the
    // window is open: a crash now must not lose them.
    absl::MutexLock settle(&settle_mu_);
    for (const auto& [tenant, chunks] : awaited_chunks_) {
      for (const auto& [where, bytes] : chunks) {
        contents.chunks[tenant].push_back(
            {.device = where.first, .id = where.second, .bytes = bytes});
      }
    }
  }
  absl::StatusOr<UniqueFd> written =
      WriteSessionsFile(options_.sessions_file, contents);
  if (!written.ok()) {
    LogError(absl::StrCat("the sessions file (for the next daemon after a "
                          "restart): ", written.status().message()));
    journal_.reset();
    return;
  }
  journal_ = *std::move(written);
  saved_version_ = version;
  saved_at_ = absl::Now();
}

void RestartAdoption::Granted(const TenantId& tenant,
                              const DevicePool& device,
                              absl::Span<const uint64_t> ids,
                              absl::Span<const uint64_t> sizes) {
  if (options_.sessions_file.empty() || shutting_down_ || ids.empty()) return;
  std::vector<HandedChunk> chunks;
  chunks.reserve(ids.size());
  for (size_t i = 0; i < ids.size() && i < sizes.size(); ++i) {
    chunks.push_back({.device = device.uuid, .id = ids[i], .bytes = sizes[i]});
  }
  absl::MutexLock lock(&file_mu_);
  if (!journal_.valid()) return;  // the last write failed, and said so
  if (absl::Status s = AppendHandedChunks(journal_.get(), tenant, chunks);
      !s.ok()) {
    LogError(absl::StrCat(s.message(), ": after a restart, the chunks of "
                          "this grant will not be adopted"));
  }
}

void RestartAdoption::ShutDown() {
  SaveSessions();
  shutting_down_ = true;
}

}  // namespace allocd
