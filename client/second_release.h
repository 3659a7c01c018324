// SecondRelease: the release of the cache once more after a pushed config
// is applied, which every client makes (the daemon's replay of a push
// models it: LiveSwitch::release_again_before_event).
//
// The release at the switch cannot free a segment that holds a block live
// then (a step's activations, a generation's growing KV cache). Freed
// later, such a segment stays cached as the old config cut it, and the new
// config builds its own beside it. So the cache is released once more when
// what was live at the switch has gone: at the job's next step mark (the
// step's activations are freed by its optimizer step), once. A job that
// marks no steps shows no such point: it is released at the first round
// that finds less allocated than at the switch, and again at each round
// that finds kUnmarkedLower less than at its last release, at most
// kUnmarkedReleases times in all (a dip between two decoded tokens comes
// before the call's KV cache is freed, the call's end after). On the H200
// (bench/gpu/results/autotune/run_2130_second_release), GPT-2 generation
// pushed expandable segments in its first call went from 12-18% above
// expandable segments from the start to 1-3% (one run 8%), ResNet-50
// pushed from defaults under `allocd run` from 23% to 0.4%; on the H100
// (run_2151_at_need) one generation run released once, inside the call,
// and stayed 15% above.
//
// Thread-safe: step marks come from the job's thread, rounds from the
// session's.
#ifndef ALLOCD_CLIENT_SECOND_RELEASE_H_
#define ALLOCD_CLIENT_SECOND_RELEASE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/allocator_target.h"

namespace allocd {

class SecondRelease {
 public:
  // The counter the rounds read, as torch.cuda.memory_stats() names it.
  static constexpr char kAllocated[] = "allocated_bytes.all.current";
  static constexpr double kUnmarkedLower = 0.10;
  static constexpr int kUnmarkedReleases = 3;

  // A config was applied to `target` and its cache released: the next
  // releases wait for what is allocated now to go; none when nothing is.
  void Switched(AllocatorTarget& target) ABSL_LOCKS_EXCLUDED(mu_);
  // The job marked a step: `target` is released if a release is pending,
  // and none after it.
  void AtStepMark(AllocatorTarget& target) ABSL_LOCKS_EXCLUDED(mu_);
  // A round read `stats` from `target`: a job that marks no steps
  // (`marks_steps` false) is released at each new low (see above).
  void AtRound(const std::map<std::string, int64_t>& stats, bool marks_steps,
               AllocatorTarget& target) ABSL_LOCKS_EXCLUDED(mu_);

  // The releases made so far.
  int64_t releases() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  // A job that marks no steps is released below this (nullopt: nothing
  // pending), and has this many releases left.
  std::optional<int64_t> release_below_ ABSL_GUARDED_BY(mu_);
  int unmarked_left_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_SECOND_RELEASE_H_
