#include "server/reclaimer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"
#include "server/log.h"

namespace allocd {
namespace {

// What a session could give back, by its last telemetry: what its
// allocator caches (reserved, not allocated) and what its client read
// ahead and has not mapped.
uint64_t CachedBytes(const std::map<std::string, int64_t>& stats) {
  auto reserved = stats.find("reserved_bytes.all.current");
  auto allocated = stats.find("allocated_bytes.all.current");
  auto read_ahead = stats.find(kReadAheadStat);
  int64_t cached = 0;
  if (reserved != stats.end() && allocated != stats.end()) {
    cached += std::max<int64_t>(reserved->second - allocated->second, 0);
  }
  if (read_ahead != stats.end()) {
    cached += std::max<int64_t>(read_ahead->second, 0);
  }
  return static_cast<uint64_t>(cached);
}

// What the rest of `asker`'s peak needs beyond what the pool has free
// (`available`), by the working set it last reported (its segments at its
// highest), when that says: nullopt when it reported none, or holds that
// much already (it grows past it). A job gathers its peak one segment at a
// time (a 60 GiB peak of 2 GiB tensors asks 30 times), and a client that
// gives back only what it is asked and keeps the rest mapped (a partial
// give-back: client/spare_segments.h) would otherwise be asked once a
// segment, each a round trip. The working set is the asker's word: no
// more is asked for than its session quota lets it hold.
std::optional<uint64_t> RestOfPeak(const Session& asker,
                                   const PoolStats& stats, uint64_t available) {
  uint64_t peak = 0;
  for (uint64_t bytes : asker.WorkingSet()) peak += bytes;
  const auto holding = stats.sessions.find(asker.id());
  const bool known = holding != stats.sessions.end();
  const uint64_t held = known ? holding->second.bytes : 0;
  if (peak <= held) return std::nullopt;
  if (known && holding->second.quota.has_value()) {
    peak = std::min(peak, std::max(*holding->second.quota, held));
  }
  return peak - held > available ? peak - held - available : 0;
}

// What `asked` hold now less than in `before`: what they gave back, which
// other sessions' acquires meanwhile do not hide.
uint64_t GivenBy(const std::vector<SessionId>& asked, const PoolStats& before,
                 const PoolStats& now) {
  uint64_t given = 0;
  for (SessionId id : asked) {
    const auto was = before.sessions.find(id);
    if (was == before.sessions.end()) continue;
    const auto is = now.sessions.find(id);
    const uint64_t holds = is == now.sessions.end() ? 0 : is->second.bytes;
    if (holds < was->second.bytes) given += was->second.bytes - holds;
  }
  return given;
}

// Whether each of `counted` reported fresh telemetry (or ended) since it
// was counted.
bool AllReported(
    const std::vector<std::pair<std::shared_ptr<Session>, uint64_t>>& counted) {
  for (const auto& [session, version] : counted) {
    if (!session->closed() && session->stats_version() == version) {
      return false;
    }
  }
  return true;
}

}  // namespace

Reclaimer::Reclaimer(const SessionRegistry* sessions, Metrics* metrics,
                     absl::Duration wait)
    : sessions_(sessions), metrics_(metrics), wait_(wait) {}

Reclaimer::Others Reclaimer::CountOthers(const Session& except) {
  const int device = except.identity().node_device;
  Others others;
  absl::flat_hash_map<SessionId, uint64_t> still_asked;
  for (std::shared_ptr<Session>& s : sessions_->List()) {
    const uint64_t version = s->stats_version();
    const auto asked = asked_.find(s->id());
    const bool answering = asked != asked_.end() && asked->second == version;
    if (answering) still_asked.insert(*asked);
    // A session blocked in its own acquire answers no reclaim until that
    // returns: waiting on it could only time out.
    // Only memory of the same GPU helps.
    if (s->id() == except.id() || s->identity().node_device != device ||
        s->acquiring()) {
      continue;
    }
    const std::map<std::string, int64_t> stats = s->Stats();
    if (auto r = stats.find("reserved_bytes.all.current");
        r != stats.end() && r->second > 0) {
      others.holders.emplace_back(s, version);
    }
    const uint64_t cached = CachedBytes(stats);
    if (cached == 0 || answering) continue;
    others.reclaimable += cached;
    others.cachers.push_back(
        {.session = std::move(s), .cached = cached, .version = version});
  }
  asked_ = std::move(still_asked);
  std::sort(others.cachers.begin(), others.cachers.end(),
            [](const Cacher& a, const Cacher& b) {
              if (a.cached != b.cached) return a.cached > b.cached;
              return a.session->id() < b.session->id();
            });
  return others;
}

void Reclaimer::Reclaim(const Session& except, NodePool& pool,
                        uint64_t shortfall) {
  const int device = except.identity().node_device;
  const PoolStats before = pool.Stats();
  const absl::Time deadline = absl::Now() + wait_;
  absl::MutexLock lock(&mu_);
  // What the others cache (reserved but not allocated, from their last
  // telemetry) is all a reclaim can free; ask only when it can cover the
  // shortfall, or the asker would wait for nothing.
  Others others = CountOthers(except);
  if (others.reclaimable < shortfall && !others.holders.empty()) {
    // A job that has just freed its peak into its allocator's cache reports
    // it with its next telemetry (another job gathering its own peak in the
    // meantime would be refused): wait for each job holding memory to
    // report once more, within the wait.
    const auto counted = std::move(others.holders);
    while (others.reclaimable < shortfall && !AllReported(counted) &&
           !released_.WaitWithDeadline(&mu_, deadline)) {
      others = CountOthers(except);
    }
    others = CountOthers(except);
  }
  if (others.reclaimable < shortfall) return;
  // Where the asker's peak is not known, each cacher asked is asked for
  // everything it caches (0): what it gives then covers the segments the
  // asker asks for next as well.
  const std::optional<uint64_t> rest =
      RestOfPeak(except, before, pool.AvailableBytes());
  const uint64_t wanted = std::min(others.reclaimable,
                                   std::max(shortfall, rest.value_or(0)));
  size_t asked = 0;
  std::vector<SessionId> asked_ids;
  for (uint64_t short_by = wanted;
       short_by > 0 && asked < others.cachers.size(); ++asked) {
    const Cacher& cacher = others.cachers[asked];
    asked_ids.push_back(cacher.session->id());
    const uint64_t bytes = std::min(cacher.cached, short_by);
    v1::ControlMessage message;
    message.mutable_reclaim()->set_bytes(rest.has_value() ? bytes : 0);
    message.mutable_reclaim()->set_reason(absl::StrCat(
        "session ", except.id(), " needs memory and the node pool of device ",
        device, " is short by ", FormatSize(shortfall)));
    cacher.session->Push(std::move(message));
    asked_[cacher.session->id()] = cacher.version;
    short_by -= bytes;
  }
  metrics_->ReclaimRequested();
  const absl::Time asked_at = absl::Now();
  uint64_t returned = 0;
  while (absl::Now() < deadline) {
    // Given back since the ask: in the cache, or the device's again.
    const PoolStats now = pool.Stats();
    returned = std::max(
        before.in_use_bytes - std::min(now.in_use_bytes, before.in_use_bytes),
        GivenBy(asked_ids, before, now));
    if (returned >= shortfall) break;
    released_.WaitWithDeadline(&mu_, deadline);
  }
  // Why a job waited, or got nothing, is the first question of an OOM.
  LogInfo(absl::StrCat(
      "reclaim for session ", except.id(), " on device ", device, ": short by ",
      FormatSize(shortfall),
      !rest.has_value() ? " (its peak not known: asked for all they cache)"
      : wanted > shortfall
          ? absl::StrCat(" (", FormatSize(wanted), " for the rest of its peak)")
          : "",
      ", asked ", asked, " of ", others.cachers.size(),
      " session(s) caching ", FormatSize(others.reclaimable), "; ",
      FormatSize(returned), " came back in ",
      absl::ToInt64Milliseconds(absl::Now() - asked_at), " ms",
      returned >= shortfall ? ""
                            : " (not enough: the acquire is retried once)"));
}

void Reclaimer::SignalReleased() {
  absl::MutexLock lock(&mu_);
  released_.SignalAll();
}

}  // namespace allocd
