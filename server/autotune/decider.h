// Decide: whether switching a running job to another allocator config now
// would lower its peak reserved memory for the rest of its run.
//
// "Now" is the end of the job's window, and the rest of the run is
// predicted from the window's steady state: the window is replayed under
// the job's config up to a switch point that leaves whole steps after it
// (the job's own step marks: two steps when the window holds three marks,
// else one; else FindStepPeriod: two steps when the window holds three,
// else one, and at least a quarter of the window; without a step, the
// window's middle), never after `cover_from`, then each candidate is switched to live there (Reconfigure +
// empty_cache, as the client does after a push) and judged on the events
// after the switch against staying on the job's config over the same events.
// Candidates come from the tuner's search (coarse sweep, then refinement)
// over a space narrowed to the job's policy: pinned keys keep the job's
// value, and memory fractions only when the job allows them.
//
// The proposal is the lowest peak that passes the gates, or a candidate
// with fewer settings fitted to sizes within simpler_within of it. One
// with more settings fitted to sizes than the job's config must keep its
// gain when the job's requests grow (grown_sizes.h): the events after the
// switch replayed again with every request 25% larger, and by the window's
// own growth when larger, it must still save min_saving against staying
// and peak no higher than the best candidate fitted no more than the job's
// config; else that one is proposed (or the job stays). Gates,
// against staying: a saving of at least min_saving of the stayed peak, no
// OOM, no more cache flushes (alloc retries), and at most
// max_call_ratio times the device calls of switching to the job's own config
// (the empty cache makes every switch rebuild the cache once; staying makes
// almost no calls in a steady state, so it is no measure of churn), and
// nothing PyTorch cannot combine with what the job does (compatibility.h:
// such candidates are listed in `left_out` with the reason). Then
// the proposal's rollback is predicted (rollback_model.h): a push whose
// rollback would leave the job above staying by more than the push is
// predicted to save is made only when that is unlikely enough, measured by
// how closely staying's replay matched the job's realised peak, or the GPU
// has room for it (WeighRollback): a push that goes wrong cannot be undone
// without leaving the job worse than not pushing.
//
// What a prediction covers is said in `why`: the events after the switch
// point, replayed from the state the window rebuilds there (allocations
// live at the window's start, from its prelude) or, for a `window` that
// starts from the client's real state (JobWindow::ToTraceFromState) switched
// at its first event, from that state; a job whose later steps allocate
// more needs more under every config.
#ifndef ALLOCD_SERVER_AUTOTUNE_DECIDER_H_
#define ALLOCD_SERVER_AUTOTUNE_DECIDER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/trace/trace.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/compatibility.h"
#include "tuner/candidate.h"
#include "tuner/evaluator.h"

namespace allocd {

struct DecideOptions {
  int threads = 1;
  uint64_t capacity = 0;      // device memory for replays (0: unlimited)
  uint64_t total_memory = 0;  // base of memory fractions (0: capacity)
  double min_saving = 0.05;
  // Of the candidates that pass the gates, the one with the fewest settings
  // fitted to sizes (SizeFittedSettings) whose peak is within this share of
  // the lowest is proposed. A setting that saves less than this on the
  // window's steps is fitted to their sizes and can cost memory on sizes the
  // window has not seen. On the H200, ResNet-50 at random resolutions was
  // pushed roundup_power2_divisions:8 with expandable segments, which
  // peaked less than 0.01 GiB below expandable segments alone on its first
  // steps, and reserved 14-24% more than expandable segments from step 0
  // over the rest of its run; pushed expandable segments alone, 0.6% more.
  double simpler_within = 0.02;
  double max_call_ratio = 2.0;  // the tuner's default
  // Candidates evaluated at most (each one replay of the window).
  size_t budget = 32;
  // Windows shorter than this are not decided on.
  size_t min_events = 1000;
  // Events the window may have lost in a row (FindStepPeriod's max_shift).
  size_t max_shift = 0;
  // FindStepPeriod(window, max_shift) when the caller has it already (the
  // autotuner's first pass); unset: Decide finds it.
  std::optional<std::optional<uint64_t>> step_events;
  // Where to switch, an index into the window's events (the autotuner's
  // review of a push: where it happened); unset, or past the window's end:
  // the switch point described above.
  std::optional<uint64_t> switch_event;
  // The job's step marks in the window: each the index of the first event
  // after a step's end, ascending (JobWindow::StepEnds plus the prelude).
  // Two or more: the steps are these, not FindStepPeriod's.
  std::vector<uint64_t> step_ends;
  // The switch point comes at or before this index, so that the prediction
  // covers what follows it (the job's largest request).
  std::optional<uint64_t> cover_from;
  // The peak reserved the job realised over the window's steps under the
  // config it runs (PyTorch's reserved_bytes.all.peak), when the window
  // holds its stream from where that peak counts from: staying's replay of
  // the window is measured against it, and the error weighs a rollback's
  // worst case by the chance of a miss (WeighRollback). Unset: the worst
  // case counts as certain.
  std::optional<int64_t> realized_peak_reserved;
  // Device memory on the job's GPU that no session holds, when known: a
  // push whose rollback's worst case fits in it is made (WeighRollback).
  std::optional<uint64_t> device_room;
  // How much more the job's newest step asked for than the steps before it
  // (StepGrowth), when the caller has the whole window: a candidate that
  // adds settings fitted to sizes is checked at that growth too
  // (CheckGrownSizes). Unset: found on `window` itself.
  std::optional<double> size_growth;
  // See EvaluatorOptions::on_replay.
  std::function<void(int)> on_replay;
  // A config to propose unless a passing candidate peaks at least min_saving
  // below it (PreferUnlessBeaten): the safe config of a job started on a
  // harmful one, decided on before it has marked two steps (the early push,
  // on a repeat found in its stream or none). Such a window cannot tell
  // configs apart within a few percent, and the safe
  // config, expandable segments without a split limit, serves any size the
  // job asks later; the best of 22 candidates on a DDP rank's first 3,428
  // events, PyTorch's defaults, peaked 37-66% above it over the whole run.
  // Unset, not among the candidates that pass the gates, or a decision on
  // two or more `step_ends` (the job's own steps): no preference.
  std::optional<AllocatorConfig> preferred;
  // What the job's processes do: a candidate that ConfigIncompatibility
  // refuses for them, switched to live, is left out (Decision::left_out),
  // expandable segments from the search itself.
  JobFeatures features;
};

// What the job runs now.
struct RunningConfig {
  AllocatorConfig config;
  std::optional<double> memory_fraction;
};

struct Decision {
  enum class Result { kPropose, kKeep, kSkip };
  Result result = Result::kSkip;
  // kPropose: what to push (`to_config` the string: pushed with
  // _set_allocator_settings to the running job, or started fresh, it gives
  // exactly `to.config`).
  Candidate to;
  std::string to_config;
  int64_t predicted_peak_current = 0;   // staying, after the switch point
  int64_t predicted_peak_switched = 0;  // the proposal (or the best kept one)
  // Peak allocated after the switch point: the job's own need, the same
  // under every config.
  int64_t predicted_peak_allocated = 0;
  // The same in sizes as asked (no rounding, so no config's): what a
  // stream of the job's events after a push is measured against.
  int64_t predicted_peak_requested = 0;
  // If a proposal were rolled back at the window's end (rollback_model.h):
  // the peak over the events after the switch repeated, and staying's over
  // the same repeat. 0 unless proposed or refused for it.
  int64_t predicted_peak_rolled_back = 0;
  int64_t predicted_peak_staying_repeat = 0;
  // The chance the proposal misses, as the last gate weighed it
  // (WeighRollback; 1: the worst case counted as certain).
  double miss_chance = 1.0;
  uint64_t switch_event = 0;
  std::optional<uint64_t> step_events;
  size_t candidates = 0;
  double replay_seconds = 0;
  std::string why;
  // What would break the job (DecideOptions::features), each once: a key
  // left out of the search ("expandable_segments:True"), then candidates
  // replayed that the search could not be narrowed to leave out.
  std::vector<LeftOutConfig> left_out;
};

Decision Decide(const Trace& window, const RunningConfig& running, const JobPolicy& policy,
                const DecideOptions& options);

// How many of `candidate`'s settings are fitted to the sizes a job
// allocates, away from PyTorch's defaults: max_split_size_mb,
// max_non_split_rounding_mb, roundup_power2_divisions,
// garbage_collection_threshold, large_segment_size_mb and a memory fraction
// (one, however set). expandable_segments is none: it serves any size. See
// DecideOptions::simpler_within.
int SizeFittedSettings(const Candidate& candidate);

// Of `passing`, the candidates that pass every gate with the lowest peak
// first, the proposal: the one with the fewest SizeFittedSettings (the
// earliest of those) whose peak is within `simpler_within` of the first's;
// nullptr when `passing` is empty.
const Evaluation* ChooseProposal(const std::vector<const Evaluation*>& passing,
                                 double simpler_within);

// `best`, unless `passing` holds `preferred` (without a memory fraction)
// and `best` does not peak at least `min_saving` below it: then that one.
// nullptr when `best` is.
const Evaluation* PreferUnlessBeaten(const std::vector<const Evaluation*>& passing,
                                     const Evaluation* best, const AllocatorConfig& preferred,
                                     double min_saving);

// The first key of `pinned_keys` (PYTORCH_CUDA_ALLOC_CONF names) on which
// `a` and `b` differ, or nullptr: what a candidate, or a start config
// chosen for a job, may not change.
const char* ChangedPinnedKey(const AllocatorConfig& a, const AllocatorConfig& b,
                             const std::vector<std::string>& pinned_keys);

// The string to push so that a process running `running` ends up holding
// exactly `target`, whether it applies it as a live update or starts with
// it: the canonical string when that suffices, else one that also names the
// keys that persist across updates.
std::string LiveConfigString(const AllocatorConfig& target, const AllocatorConfig& running);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_DECIDER_H_
