// Tune: finds the PYTORCH_CUDA_ALLOC_CONF (and, where it pays, the memory
// fraction that lets garbage collection act) that best fits a job, by
// replaying its trace under candidates from a SearchSpace.
//
// Strategy: a coarse sweep (each dimension's values with the others at their
// defaults, with expandable segments off and on), then rounds of local
// refinement around the best candidates (neighbouring values of each
// dimension, and the best value each dimension showed), until no round
// improves or the budget of evaluations is spent. Evaluations run in
// parallel; results do not depend on the number of threads.
#ifndef ALLOCD_TUNER_TUNER_H_
#define ALLOCD_TUNER_TUNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"
#include "tuner/evaluator.h"
#include "tuner/search_space.h"

namespace allocd {

enum class Objective {
  // Least peak reserved memory with no OOM (and at most max_retries cache
  // flushes) at the given capacity.
  kPeak,
  // Least device memory on which the job runs with no OOM.
  kCapacity,
  // Fewest cudaMalloc/cudaFree calls (and page maps/unmaps) whose peak
  // reserved fits the memory budget.
  kDeviceAllocs,
};

absl::StatusOr<Objective> ParseObjective(std::string_view name);
const char* ObjectiveName(Objective objective);

struct TuneOptions {
  Objective objective = Objective::kPeak;
  // Device memory the job can use (cudaMemGetInfo's free); 0: unlimited.
  uint64_t capacity = 0;
  // The device's total memory, the base of memory fractions; 0: capacity.
  uint64_t total_memory = 0;
  // Most candidates to evaluate (at least the coarse sweep's first ones).
  size_t budget = 200;
  int jobs = 1;
  // kPeak: candidates needing more cache flushes (each a sync of all
  // streams) than this are not recommended.
  int64_t max_retries = 0;
  // kPeak: candidates making more than this many times the cudaMalloc /
  // cudaFree calls of PyTorch's defaults are not recommended: each call
  // can synchronise the device, so a config that churns segments to save
  // memory slows training down. 0: no limit.
  double max_call_ratio = 2.0;
  // kDeviceAllocs: the peak reserved memory allowed; 0: capacity.
  uint64_t memory_budget = 0;
  // Called as evaluations finish: (done, planned so far).
  std::function<void(size_t, size_t)> progress;
  // Tune a switch in a running job (see LiveStart): candidates are judged
  // on the events after the switch, and the guides' configs are not
  // compared (each would replace the job's whole config). The caller has
  // replayed the trace to find its switch point, so Tune does not check it.
  std::optional<LiveStart> live_start;
  // See EvaluatorOptions::on_replay.
  std::function<void(int)> on_replay;
  // What max_call_ratio compares with (TuneReport::baseline); nullopt:
  // PyTorch's defaults. A live switch compares with switching to the job's
  // own config, whose empty cache costs the same rebuild.
  std::optional<Candidate> baseline;
};

// A config the tuning guides recommend, replayed for comparison (or, when
// PyTorch rejects it, with its error).
struct ReferenceConfig {
  std::string conf;
  std::string error;  // PyTorch's rejection, if any
  std::optional<Evaluation> evaluation;
};

struct TuneReport {
  Objective objective;
  TuneOptions options;
  // Every evaluated candidate, best first: feasible ones by the objective's
  // score, then the infeasible ones.
  std::vector<Evaluation> ranked;
  // Indices into `ranked` of the feasible candidates on the Pareto front of
  // (peak reserved, device allocs + frees), by peak.
  std::vector<size_t> pareto;
  Evaluation baseline;  // PyTorch's defaults, or TuneOptions::baseline
  std::vector<ReferenceConfig> references;
  size_t evaluations = 0;
  size_t replays = 0;
  double seconds = 0;
  size_t grid_size = 0;

  // ranked[0] when it is feasible.
  const Evaluation* recommended() const;
  bool Feasible(const Evaluation& e) const;
  // The objective's number for `e` (lower is better).
  double Score(const Evaluation& e) const;
};

absl::StatusOr<TuneReport> Tune(const Trace& trace, const SearchSpace& space,
                                const TuneOptions& options);

// The configs popular fine-tuning guides recommend, two of which PyTorch
// 2.11 rejects.
const std::vector<std::string>& GuideConfigs();

}  // namespace allocd

#endif  // ALLOCD_TUNER_TUNER_H_
