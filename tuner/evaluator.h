// Evaluator: replays candidates on a trace, in parallel, each once.
#ifndef ALLOCD_TUNER_EVALUATOR_H_
#define ALLOCD_TUNER_EVALUATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "allocator/trace/replay.h"
#include "allocator/trace/trace.h"
#include "tuner/candidate.h"

namespace allocd {

// What the tuner keeps of one replay (no timeline, no full stats): the
// whole replay, or with a live switch the part after it.
struct ReplaySummary {
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t num_alloc_retries = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_ooms = 0;
  bool estimated = false;
};

ReplaySummary Summarize(const ReplayResult& result);

struct Evaluation {
  Candidate candidate;
  std::string key;  // CandidateKey(candidate)
  // The replay at the tuning capacity (the device's free memory).
  ReplaySummary replay;
  // For the capacity objective: the least device memory (2 MiB resolution,
  // or 0.5% of it) on which the candidate runs without an OOM, and what it
  // costs there.
  std::optional<uint64_t> min_capacity;
  ReplaySummary at_min_capacity;
};

// Candidates judged as a switch in a running job: each replay starts under
// `config` (and `memory_fraction`) and switches live to the candidate before
// event `switch_event` (see LiveSwitch); the summary covers the events after
// the switch.
struct LiveStart {
  AllocatorConfig config;
  std::optional<double> memory_fraction;
  uint64_t switch_event = 0;
};

struct EvaluatorOptions {
  uint64_t capacity = 0;      // 0: unlimited
  uint64_t total_memory = 0;  // base of memory fractions; 0: capacity
  bool search_min_capacity = false;
  int jobs = 1;
  std::optional<LiveStart> live_start;
  // Called with +1 as a replay starts and -1 as it ends, from the replaying
  // thread (the autotuner's metrics and tests count replays in flight).
  std::function<void(int)> on_replay;
};

// How the evaluator replays `candidate` at `capacity` (the tuning capacity,
// or one the least-capacity search tries): a memory fraction is of the
// tuning's device when `capacity` is its capacity, else of `capacity`.
ReplayOptions CandidateReplayOptions(const Candidate& candidate,
                                     const EvaluatorOptions& options,
                                     uint64_t capacity);

class Evaluator {
 public:
  Evaluator(const Trace& trace, const EvaluatorOptions& options);

  // Evaluates the candidates not seen before, `jobs` at a time, and returns
  // the evaluations of all of them in the order given. `progress` (may be
  // empty) is called after each new evaluation with the number done so far.
  std::vector<const Evaluation*> Evaluate(
      const std::vector<Candidate>& candidates,
      const std::function<void(size_t)>& progress = {});

  const Evaluation* Find(const std::string& key) const;
  size_t evaluations() const { return cache_.size(); }
  size_t replays() const { return replays_; }

 private:
  Evaluation EvaluateOne(const Candidate& candidate, size_t& replays) const;
  ReplaySummary ReplayAt(const Candidate& candidate, uint64_t capacity,
                         bool stop_at_oom) const;

  const Trace& trace_;
  EvaluatorOptions options_;
  std::map<std::string, Evaluation> cache_;
  size_t replays_ = 0;
};

}  // namespace allocd

#endif  // ALLOCD_TUNER_EVALUATOR_H_
