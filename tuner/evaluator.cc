#include "tuner/evaluator.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace allocd {

ReplaySummary Summarize(const ReplayResult& r) {
  if (const std::optional<ReplayPhase>& p = r.after_switch) {
    return ReplaySummary{p->peak_reserved,     p->peak_allocated,
                         p->num_device_alloc,  p->num_device_free,
                         p->num_alloc_retries, p->num_sync_all_streams,
                         p->num_ooms,          r.estimated};
  }
  return ReplaySummary{r.peak_reserved,     r.peak_allocated,
                       r.num_device_alloc,  r.num_device_free,
                       r.num_alloc_retries, r.num_sync_all_streams,
                       r.num_ooms,          r.estimated};
}

Evaluator::Evaluator(const Trace& trace, const EvaluatorOptions& options)
    : trace_(trace), options_(options) {
  options_.jobs = std::max(1, options_.jobs);
}

ReplayOptions CandidateReplayOptions(const Candidate& candidate,
                                     const EvaluatorOptions& options,
                                     uint64_t capacity) {
  ReplayOptions replay;
  replay.capacity = capacity;
  replay.total_memory = options.total_memory != 0 && capacity == options.capacity
                            ? options.total_memory
                            : capacity;
  replay.memory_fraction = candidate.memory_fraction;
  if (const std::optional<LiveStart>& start = options.live_start) {
    replay.memory_fraction = start->memory_fraction;
    replay.live_switch =
        LiveSwitch{start->switch_event, candidate.config, candidate.memory_fraction};
  }
  return replay;
}

ReplaySummary Evaluator::ReplayAt(const Candidate& candidate,
                                  uint64_t capacity, bool stop_at_oom) const {
  ReplayOptions options = CandidateReplayOptions(candidate, options_, capacity);
  options.stop_at_first_oom = stop_at_oom;
  const AllocatorConfig& start =
      options_.live_start ? options_.live_start->config : candidate.config;
  if (options_.on_replay) options_.on_replay(+1);
  absl::StatusOr<ReplayResult> result = Replay(trace_, start, options);
  if (options_.on_replay) options_.on_replay(-1);
  // The trace was replayed once before tuning started, so only a bug can
  // make a replay fail here; count it as an OOM so it never wins.
  if (!result.ok()) {
    ReplaySummary failed;
    failed.num_ooms = 1;
    return failed;
  }
  return Summarize(*result);
}

Evaluation Evaluator::EvaluateOne(const Candidate& candidate,
                                  size_t& replays) const {
  Evaluation e;
  e.candidate = candidate;
  e.key = CandidateKey(candidate);
  e.replay = ReplayAt(candidate, options_.capacity, /*stop_at_oom=*/false);
  ++replays;
  if (!options_.search_min_capacity || e.replay.estimated) return e;

  // Binary search on device memory. Below peak allocated nothing fits; the
  // unconstrained peak reserved always does (when the replay had no OOM).
  uint64_t lo = static_cast<uint64_t>(e.replay.peak_allocated);
  uint64_t hi = static_cast<uint64_t>(e.replay.peak_reserved);
  ReplaySummary at_hi = ReplayAt(candidate, hi, true);
  ++replays;
  if (at_hi.num_ooms != 0) return e;
  while (hi - lo > std::max<uint64_t>(uint64_t{2} << 20, hi / 200)) {
    const uint64_t mid = lo + (hi - lo) / 2;
    ReplaySummary at_mid = ReplayAt(candidate, mid, true);
    ++replays;
    if (at_mid.num_ooms == 0) {
      hi = mid;
      at_hi = at_mid;
    } else {
      lo = mid;
    }
  }
  e.min_capacity = hi;
  e.at_min_capacity = at_hi;
  return e;
}

std::vector<const Evaluation*> Evaluator::Evaluate(
    const std::vector<Candidate>& candidates,
    const std::function<void(size_t)>& progress) {
  std::vector<Candidate> todo;
  for (const Candidate& c : candidates) {
    const std::string key = CandidateKey(c);
    const bool queued = std::any_of(todo.begin(), todo.end(), [&](const Candidate& t) {
      return CandidateKey(t) == key;
    });
    if (!cache_.contains(key) && !queued) todo.push_back(c);
  }

  std::vector<Evaluation> results(todo.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> replays{0};
  std::mutex progress_mutex;
  size_t done = 0;
  auto worker = [&] {
    size_t local_replays = 0;
    for (size_t i = next++; i < todo.size(); i = next++) {
      results[i] = EvaluateOne(todo[i], local_replays);
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(cache_.size() + ++done);
      }
    }
    replays += local_replays;
  };
  {
    std::vector<std::jthread> threads;
    const size_t n = std::min<size_t>(options_.jobs, todo.size());
    for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
    worker();
  }
  replays_ += replays;
  for (Evaluation& e : results) cache_.emplace(e.key, std::move(e));

  std::vector<const Evaluation*> out;
  out.reserve(candidates.size());
  for (const Candidate& c : candidates) out.push_back(&cache_.at(CandidateKey(c)));
  return out;
}

const Evaluation* Evaluator::Find(const std::string& key) const {
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : &it->second;
}

}  // namespace allocd
