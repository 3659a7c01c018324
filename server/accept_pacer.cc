#include "server/accept_pacer.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace allocd {
namespace {

// Past this many uids, those with a full bucket (as if never seen) go.
constexpr size_t kPruneAbove = 4096;

}  // namespace

AcceptPacer::AcceptPacer(std::string what, std::string flag, AcceptRate rate)
    : what_(std::move(what)), flag_(std::move(flag)), rate_(rate) {}

absl::Status AcceptPacer::Take(uid_t uid, pid_t pid, absl::Time now) {
  if (rate_.per_second <= 0) return absl::OkStatus();
  const double burst = std::max(rate_.burst, 1.0);
  auto refill = [&](Bucket& b) {
    b.tokens = std::min(
        burst, b.tokens + absl::ToDoubleSeconds(now - b.filled_at) *
                              rate_.per_second);
    b.filled_at = now;
  };
  if (buckets_.size() > kPruneAbove) {
    absl::erase_if(buckets_, [&](auto& entry) {
      refill(entry.second);
      return entry.second.tokens >= burst;
    });
  }
  auto [it, inserted] =
      buckets_.try_emplace(uid, Bucket{.tokens = burst, .filled_at = now});
  Bucket& bucket = it->second;
  if (!inserted) refill(bucket);
  if (bucket.tokens >= 1) {
    bucket.tokens -= 1;
    return absl::OkStatus();
  }
  absl::Status refused = absl::ResourceExhaustedError(absl::StrCat(
      "uid ", uid, " opens ", what_, "s faster than its rate (", flag_, "=",
      rate_.per_second, " per second, ", burst,
      " at once): reuse connections, or ask the node's admin to raise it"));
  refusals_.Refused(now, what_, [&] {
    return absl::StrCat("pid ", pid, "'s: ", refused.message());
  });
  return refused;
}

}  // namespace allocd
