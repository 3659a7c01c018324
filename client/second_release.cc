#include "client/second_release.h"

namespace allocd {
namespace {

int64_t Allocated(const std::map<std::string, int64_t>& stats) {
  auto it = stats.find(SecondRelease::kAllocated);
  return it == stats.end() ? 0 : it->second;
}

}  // namespace

void SecondRelease::Switched(AllocatorTarget& target) {
  const int64_t allocated = Allocated(target.Stats());
  absl::MutexLock lock(&mu_);
  if (allocated == 0) {
    // Nothing was live under the old config (a start config applied before
    // the job's first allocation, at advise()): the release at the switch
    // left none of its blocks, and one more only reshapes the new config's
    // segments (a DDP rank's whole-run peak 6% above the same config run
    // from its start).
    release_below_.reset();
    return;
  }
  release_below_ = allocated;
  unmarked_left_ = kUnmarkedReleases;
}

void SecondRelease::AtStepMark(AllocatorTarget& target) {
  {
    absl::MutexLock lock(&mu_);
    if (!release_below_.has_value()) return;
    release_below_.reset();
    ++releases_;
  }
  target.EmptyCache();
}

void SecondRelease::AtRound(const std::map<std::string, int64_t>& stats,
                            bool marks_steps, AllocatorTarget& target) {
  if (marks_steps) return;
  const int64_t allocated = Allocated(stats);
  {
    absl::MutexLock lock(&mu_);
    if (!release_below_.has_value() || allocated >= *release_below_) return;
    --unmarked_left_;
    if (unmarked_left_ > 0) {
      release_below_ =
          static_cast<int64_t>(static_cast<double>(allocated) *
                               (1 - kUnmarkedLower));
    } else {
      release_below_.reset();
    }
    ++releases_;
  }
  target.EmptyCache();
}

int64_t SecondRelease::releases() const {
  absl::MutexLock lock(&mu_);
  return releases_;
}

}  // namespace allocd
