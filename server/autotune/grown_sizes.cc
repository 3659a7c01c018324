#include "server/autotune/grown_sizes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "server/autotune/autotune_types.h"

namespace allocd {

Trace GrowRequests(const Trace& trace, uint64_t from, double factor) {
  Trace out = trace;
  std::vector<bool> grown(trace.num_ids, false);
  for (uint64_t i = from; i < out.events.size(); ++i) {
    TraceEvent& e = out.events[i];
    if (e.id >= grown.size()) continue;  // the replay refuses the trace for it
    if (e.op == TraceOp::kAlloc) grown[e.id] = true;
    if (grown[e.id]) {
      e.size = static_cast<uint64_t>(std::llround(static_cast<double>(e.size) * factor));
    }
  }
  return out;
}

std::optional<double> StepGrowth(const Trace& trace, const std::vector<uint64_t>& marks,
                                 std::optional<uint64_t> step) {
  const uint64_t n = trace.events.size();
  std::vector<uint64_t> ends;
  if (marks.size() >= 3) {
    for (uint64_t m : marks) {
      if (m <= n) ends.push_back(m);
    }
  } else if (step && *step > 0) {
    // Periods ending at the trace's end; not the first, whose start may be
    // the prelude that rebuilds what was live at the window's start.
    for (uint64_t k = 0; (k + 1) * *step <= n; ++k) ends.push_back(n - k * *step);
    std::reverse(ends.begin(), ends.end());
  }
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  if (ends.size() < 3) return std::nullopt;

  // Bytes asked for, held from an alloc to its free_requested.
  std::vector<int64_t> size_of(trace.num_ids, 0);
  for (const InitialBlock& b : trace.partial.blocks) {
    if (b.id < size_of.size() && !b.free_requested) {
      size_of[b.id] = static_cast<int64_t>(b.requested_size);
    }
  }
  std::vector<int64_t> added;  // per whole step
  int64_t held = 0, start_held = 0, peak = 0;
  size_t next = 0;  // the next boundary
  for (uint64_t i = 0; next < ends.size(); ++i) {
    if (i == ends[next]) {
      if (next > 0) added.push_back(peak - start_held);
      start_held = peak = held;
      if (++next == ends.size()) break;
    }
    const TraceEvent& e = trace.events[i];
    if (e.id >= size_of.size()) continue;
    if (e.op == TraceOp::kAlloc) {
      size_of[e.id] = static_cast<int64_t>(e.size);
      held += size_of[e.id];
      peak = std::max(peak, held);
    } else if (e.op == TraceOp::kFreeRequested) {
      held -= size_of[e.id];
      size_of[e.id] = 0;
    }
  }
  const int64_t earlier = *std::max_element(added.begin(), added.end() - 1);
  if (earlier <= 0) return std::nullopt;
  return static_cast<double>(added.back()) / static_cast<double>(earlier);
}

std::vector<double> GrowthFactors(std::optional<double> window_growth) {
  std::vector<double> factors = {kGrowBy};
  if (window_growth && *window_growth > kGrowBy) {
    factors.push_back(std::min(*window_growth, kMaxGrowth));
  }
  return factors;
}

namespace {

// Whether `candidate` is still at least as good as `other` on the same
// grown events: no more OOMs, no higher peak.
bool NoWorse(const ReplaySummary& candidate, const ReplaySummary& other) {
  return candidate.num_ooms <= other.num_ooms && candidate.peak_reserved <= other.peak_reserved;
}

}  // namespace

GrownSizesCheck CheckGrownSizes(const Trace& window, const Candidate& staying,
                                const Candidate& candidate, const std::optional<Candidate>& simpler,
                                const GrownSizesOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  GrownSizesCheck check;
  const uint64_t from = options.replays.live_start ? options.replays.live_start->switch_event : 0;
  std::vector<Candidate> switched = {staying, candidate};
  if (simpler) switched.push_back(*simpler);
  for (double factor : options.factors) {
    const Trace grown = GrowRequests(window, from, factor);
    Evaluator evaluator(grown, options.replays);
    const std::vector<const Evaluation*> evaluated = evaluator.Evaluate(switched);
    check.grown.push_back(GrownPeaks{
        .factor = factor,
        .staying = evaluated[0]->replay,
        .candidate = evaluated[1]->replay,
        .simpler = simpler ? evaluated[2]->replay : evaluated[0]->replay});
    const GrownPeaks& p = check.grown.back();
    const bool saves =
        SavesAtLeast(p.staying.peak_reserved, p.candidate.peak_reserved, options.min_saving);
    if (!NoWorse(p.candidate, p.staying) || !NoWorse(p.candidate, p.simpler) || !saves) {
      check.holds = false;
      check.failed = check.grown.size() - 1;
      break;  // refused: the other growths would not change that
    }
  }
  check.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return check;
}

std::string GrowthPercent(double factor) {
  return absl::StrFormat("%.0f%%", 100 * (factor - 1));
}

}  // namespace allocd
