#include "server/autotune/step_period.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/config.h"

namespace allocd {
namespace {

constexpr size_t kTail = 64;          // signatures matched to find candidates
constexpr double kMinMatch = 0.75;   // share of events equal one period back
constexpr double kNearBest = 0.15;
// Realigned, a layer scores closer to the step (llama_lora: 0.74 against
// 0.95) while the step's multiples still score within 0.01 of it.
constexpr double kNearBestRealigned = 0.05;
constexpr size_t kAnchors = 32;
constexpr size_t kMaxCandidates = 64;  // the best supported
constexpr size_t kMaxCompared = 50000;   // events compared per candidate (sampled)
constexpr size_t kRealign = 16;          // events that must match to move the offset

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
// over an even sample of at most kMaxCompared of them. With `max_shift`, a
// mismatch after which the next kRealign events do not match a period
// earlier either (the stream is out of step, not just different here) looks
// for the offset, at most `max_shift` events either way, at which they do,
// and keeps it: a lost event shifts what follows it, once as it enters the
// period and once as it leaves. The sample that moves the offset counts as a
// mismatch.
double MatchShare(const std::vector<uint32_t>& sig, size_t period, size_t max_shift) {
  const size_t n = sig.size();
  const size_t stride = std::max<size_t>(1, (n - period) / kMaxCompared);
  // Whether the kRealign events after i equal those after i - period + offset.
  auto next_equal = [&](size_t i, ptrdiff_t offset) {
    const ptrdiff_t j = static_cast<ptrdiff_t>(i - period) + offset;
    if (j < 0 || j >= static_cast<ptrdiff_t>(i) || i + kRealign >= n) return false;
    return std::equal(sig.begin() + i + 1, sig.begin() + i + 1 + kRealign, sig.begin() + j + 1);
  };
  const ptrdiff_t shift = static_cast<ptrdiff_t>(max_shift);
  ptrdiff_t offset = 0;
  size_t compared = 0;
  size_t equal = 0;
  for (size_t i = period; i < n; i += stride, ++compared) {
    const ptrdiff_t j = static_cast<ptrdiff_t>(i - period) + offset;
    if (j >= 0 && sig[i] == sig[j]) {
      ++equal;
      continue;
    }
    if (next_equal(i, offset)) continue;
    for (ptrdiff_t d = 1; d <= 2 * shift; ++d) {
      const ptrdiff_t to = offset + (d % 2 == 0 ? d / 2 : -(d + 1) / 2);
      if (to < -shift || to > shift || !next_equal(i, to)) continue;
      offset = to;
      break;
    }
  }
  return compared == 0 ? 0 : static_cast<double>(equal) / static_cast<double>(compared);
}

}  // namespace

std::optional<uint64_t> FindStepPeriod(const Trace& trace, size_t max_shift) {
  const std::vector<uint32_t> sig = Signatures(trace);
  const size_t n = sig.size();
  if (n < 4 * kTail) return std::nullopt;

  // Rolling hash of every kTail-long run. Runs ending at anchors spread
  // over the trace's second half are matched against all others; each
  // distance between a match and its anchor is a candidate, supported by
  // every anchor that gives it. The step is supported by nearly every
  // anchor, a layer only by the anchors inside its stretch.
  constexpr uint64_t kBase = 1000003;
  uint64_t power = 1;
  for (size_t i = 0; i < kTail; ++i) power *= kBase;
  auto hash_of = [&](size_t end) {
    uint64_t h = 0;
    for (size_t i = end - kTail; i < end; ++i) h = h * kBase + sig[i] + 1;
    return h;
  };
  absl::flat_hash_map<uint64_t, std::vector<size_t>> anchors;  // hash -> run ends
  for (size_t k = 0; k < kAnchors; ++k) {
    const size_t end = n - k * (n / 2) / kAnchors;
    anchors[hash_of(end)].push_back(end);
  }
  absl::flat_hash_map<size_t, int> support;  // distance -> anchors
  uint64_t h = hash_of(kTail);
  for (size_t end = kTail; end <= n; ++end) {
    if (auto it = anchors.find(h); it != anchors.end()) {
      for (size_t a : it->second) {
        if (end != a && std::equal(sig.begin() + (end - kTail), sig.begin() + end,
                                   sig.begin() + (a - kTail))) {
          ++support[a > end ? a - end : end - a];
        }
      }
    }
    if (end < n) h = h * kBase + sig[end] + 1 - power * (sig[end - kTail] + 1);
  }
  std::vector<std::pair<int, size_t>> ranked;  // (-support, distance)
  for (const auto& [distance, count] : support) {
    if (2 * distance <= n) ranked.emplace_back(-count, distance);
  }
  std::sort(ranked.begin(), ranked.end());
  if (ranked.size() > kMaxCandidates) ranked.resize(kMaxCandidates);
  std::vector<size_t> candidates;
  for (const auto& [count, distance] : ranked) candidates.push_back(distance);
  std::sort(candidates.begin(), candidates.end());

  // A step needs two repetitions in the trace. Its multiples match about
  // as well as it does: the shortest candidate near the best match wins.
  std::vector<std::pair<size_t, double>> shares;
  double best = 0;
  for (size_t period : candidates) {
    shares.emplace_back(period, MatchShare(sig, period, max_shift));
    best = std::max(best, shares.back().second);
  }
  if (best < kMinMatch) return std::nullopt;
  for (const auto& [period, share] : shares) {
    const double near = max_shift > 0 ? kNearBestRealigned : kNearBest;
    if (share >= std::max(kMinMatch, best - near)) return period;
  }
  return std::nullopt;
}

bool ReturnsWhatItAllocates(const Trace& trace, uint64_t period) {
  constexpr size_t kPeriods = 3;
  const size_t n = trace.events.size();
  if (period == 0 || kPeriods * period > n) return false;
  // floor[k]: the least live over the k-th of the last kPeriods periods.
  std::vector<uint64_t> size_of(trace.num_ids, 0);
  std::array<int64_t, kPeriods> floor;
  floor.fill(INT64_MAX);
  int64_t live = 0;
  int64_t allocated = 0;  // over the last period
  const size_t first = n - kPeriods * period;
  for (size_t i = 0; i < n; ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.id < size_of.size()) {
      if (e.op == TraceOp::kAlloc) {
        size_of[e.id] = e.size;
        live += static_cast<int64_t>(e.size);
        if (i >= n - period) allocated += static_cast<int64_t>(e.size);
      } else if (e.op == TraceOp::kFreeRequested) {
        live -= static_cast<int64_t>(size_of[e.id]);
        size_of[e.id] = 0;
      }
    }
    if (i >= first) {
      int64_t& f = floor[(i - first) / period];
      f = std::min(f, live);
    }
  }
  if (allocated == 0) return false;
  const int64_t last = floor[2] - floor[1];
  const int64_t before = floor[1] - floor[0];
  // Layers are alike: each keeps (or frees) the same bytes, a ramp.
  const bool ramp = last != 0 && (last > 0) == (before > 0) &&
                    10 * std::abs(last - before) <= std::max(std::abs(last), std::abs(before)) &&
                    10000 * std::abs(last) > allocated;
  return 100 * std::abs(last) <= allocated && !ramp;
}

}  // namespace allocd
