#include "server/autotune/step_period.h"

#include <algorithm>
#include <vector>

#include "allocator/config.h"

namespace allocd {
namespace {

constexpr size_t kTail = 64;          // signatures matched to find candidates
constexpr double kMinMatch = 0.75;   // share of events equal one period back
constexpr double kNearBest = 0.03;
constexpr size_t kMaxCandidates = 512;
constexpr size_t kMaxCompared = 50000;   // events compared per candidate (sampled)

std::vector<uint32_t> Signatures(const Trace& trace) {
  std::vector<uint8_t> small(trace.num_ids, 0);
  std::vector<uint32_t> sig;
  sig.reserve(trace.events.size());
  for (const TraceEvent& e : trace.events) {
    if (e.op == TraceOp::kAlloc && e.id < small.size()) small[e.id] = e.size < kMiB;
    const uint32_t pool = e.id < small.size() ? small[e.id] : 0;
    const uint32_t stream = e.op == TraceOp::kAlloc ? e.stream : 0;
    sig.push_back(static_cast<uint32_t>(e.op) | pool << 2 | stream << 3);
  }
  return sig;
}

// Share of events from `period` on that equal the one a period earlier,
// over an even sample of at most kMaxCompared of them.
double MatchShare(const std::vector<uint32_t>& sig, size_t period) {
  const size_t n = sig.size();
  const size_t stride = std::max<size_t>(1, (n - period) / kMaxCompared);
  size_t compared = 0;
  size_t equal = 0;
  for (size_t i = period; i < n; i += stride, ++compared) {
    equal += sig[i] == sig[i - period];
  }
  return compared == 0 ? 0 : static_cast<double>(equal) / static_cast<double>(compared);
}

}  // namespace

std::optional<uint64_t> FindStepPeriod(const Trace& trace) {
  const std::vector<uint32_t> sig = Signatures(trace);
  const size_t n = sig.size();
  if (n < 4 * kTail) return std::nullopt;

  // Rolling hash of every kTail-long run. The runs ending at a few
  // anchors are matched against all others: the distances are candidates.
  // Several anchors, since the trace's very end can be the program's
  // teardown rather than a step.
  constexpr uint64_t kBase = 1000003;
  uint64_t power = 1;
  for (size_t i = 0; i < kTail; ++i) power *= kBase;
  auto hash_of = [&](size_t end) {
    uint64_t h = 0;
    for (size_t i = end - kTail; i < end; ++i) h = h * kBase + sig[i] + 1;
    return h;
  };
  const std::vector<size_t> anchors = {n, n - n / 8, n - n / 4, n / 2};
  std::vector<uint64_t> anchor_hashes;
  for (size_t a : anchors) anchor_hashes.push_back(hash_of(a));
  std::vector<size_t> candidates;
  uint64_t h = hash_of(kTail);
  for (size_t end = kTail; end <= n; ++end) {
    for (size_t k = 0; k < anchors.size(); ++k) {
      const size_t a = anchors[k];
      if (h == anchor_hashes[k] && end != a &&
          std::equal(sig.begin() + (end - kTail), sig.begin() + end,
                     sig.begin() + (a - kTail))) {
        candidates.push_back(a > end ? a - end : end - a);
      }
    }
    if (end < n) h = h * kBase + sig[end] + 1 - power * (sig[end - kTail] + 1);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  // A step needs two repetitions in the trace. Its multiples match about
  // as well as it does: the shortest candidate near the best match wins.
  std::vector<std::pair<size_t, double>> shares;
  double best = 0;
  for (size_t period : candidates) {
    if (2 * period > n || shares.size() == kMaxCandidates) break;
    shares.emplace_back(period, MatchShare(sig, period));
    best = std::max(best, shares.back().second);
  }
  if (best < kMinMatch) return std::nullopt;
  for (const auto& [period, share] : shares) {
    if (share >= best - kNearBest) return period;
  }
  return std::nullopt;
}

}  // namespace allocd
