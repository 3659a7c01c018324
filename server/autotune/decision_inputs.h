// What the autotuner's replays run on, read from a job's window
// (JobWindow) while the autotuner holds its lock, so that the replays
// themselves run without it: a decision's traces and where they may switch
// (DecisionInputs), and a push's window switched where the push happened
// (PushReplayInput: what a review, a judgement and a reprediction replay).
#ifndef ALLOCD_SERVER_AUTOTUNE_DECISION_INPUTS_H_
#define ALLOCD_SERVER_AUTOTUNE_DECISION_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "absl/status/statusor.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/trace.h"
#include "server/autotune/autotune_options.h"
#include "server/autotune/autotune_types.h"
#include "server/autotune/decider.h"
#include "server/autotune/job_window.h"

namespace allocd {

// What every replay of a job's window by Decide runs under.
DecideOptions DecideOptionsFor(const AutotuneOptions& options);

// What a job running `config` runs, as a decision reads it: the config,
// and its memory fraction when it sets one.
RunningConfig RunningConfigOf(const AllocatorConfig& config);

// A replay that switches at the window's event number `seq`: from the
// client's newest state at or before it (its real memory there), else from
// the window's start (the state its prelude rebuilds). With the job's first
// step mark after `seq`, where its client released the cache again after a
// push (LiveSwitch::release_again_before_event).
struct SwitchTrace {
  Trace trace;
  uint64_t switch_event = 0;                 // index into `trace`
  std::optional<uint64_t> first_mark_after;  // index into `trace`
};
SwitchTrace TraceSwitchingAt(const JobWindow& window, uint64_t seq);

// The client's state a decision switches from: the newest that leaves two of
// the job's marked steps after it, else one, and at least `min_events`
// (never one past `latest`: the prediction must cover what follows it).
// Unset: none does.
struct StateSwitch {
  uint64_t seq;                     // where the state was taken
  std::vector<uint64_t> step_ends;  // the marks after it, as indices from it
};
std::optional<StateSwitch> DecisionState(const JobWindow& window, uint64_t latest,
                                         uint64_t min_events);

// The newest state the client sent at or before `at` (stream position,
// JobWindow::total_events() numbering) with at least `min_events` after it,
// whatever marks follow: what a prediction that must cover from `at` on
// replays from for a job that marks no steps. The client sends one where
// its stream begins, and it holds what the job allocated before (advise()
// called once the model was built, or `allocd run`, whose stream starts
// once PyTorch first asked for memory): without it the replay lacks the
// model's weights.
std::optional<uint64_t> StateAtOrBefore(const JobWindow& window, uint64_t at,
                                        uint64_t min_events);

// Why no decision can be made on `window` for a job running `config`
// (empty: it can be): the config does not parse, or the client dropped
// more than `max_lost_fraction` of the events inside the window. Sets
// `running` from `config` when it parses.
std::string SkipReason(const JobWindow& window, const std::string& config,
                       double max_lost_fraction, RunningConfig& running);
// Whether the client dropped more than `max_lost_fraction` of the events,
// some of them inside the window: its replay would miss allocations.
bool LosesTooMany(const JobWindow& window, double max_lost_fraction);

// A first pass without step marks decides once the window ends in three
// steps of training: a repeat that keeps or drifts is the model's
// construction or one pass's layers (ReturnsWhatItAllocates). A client
// that marks its steps (`marks_steps`) and marked none runs no optimizer:
// nothing in its stream is a step (under `allocd run` a generation job's
// stream began mid-call, and a decoded token of 75 events passed for its
// step: decided on 1,078 events, it stayed on PyTorch's defaults until a
// larger call). `step`: FindStepPeriod's (none for such a client);
// `periodic`: it is a step of training.
struct FirstPassStep {
  std::optional<uint64_t> step;
  bool periodic = false;
};
FirstPassStep FindFirstPassStep(const Trace& trace, bool marks_steps);

// The why of a decision on an aperiodic job (a decoded token repeats, but
// keeps what it allocates), decided on its largest request so far.
std::string AperiodicWhy(bool marks_steps, const std::string& why);

// A decision's view of its job's window.
struct DecisionInputs {
  Trace trace;                      // the window, from its prelude
  std::vector<uint64_t> step_ends;  // the job's marks, indices into `trace`
  bool marked = false;              // the job has marked steps
  // Where the largest request began, as an index into `trace` (nullopt:
  // before the window), and whether it has peaked (the stream moved on by
  // `peaked_after` events).
  std::optional<uint64_t> largest_request;
  bool largest_peaked = false;
  int64_t max_requested = 0;
  // The job from the client's real state (DecisionState), and its marks.
  std::optional<Trace> state_trace;
  std::vector<uint64_t> state_step_ends;
  // A job without marks: its state at or before its largest request
  // (StateAtOrBefore), for a prediction that covers that request.
  std::optional<Trace> cover_state_trace;
};
// `cover`: the prediction must cover the job's largest request (a larger
// request, growth); `first_pass`: the job's first decision. States leave at
// least `min_events` after them.
DecisionInputs ReadDecisionInputs(const JobWindow& window, bool cover, bool first_pass,
                                  uint64_t min_events, uint64_t peaked_after);

// The decision on `in` for a job running `running` under `policy`: from the
// client's state where it has one (or, `cover_largest` without a step, its
// state before the largest request), else from the window with `step` (see
// DecideOptions::step_events) and, `cover_largest`, covering the largest
// request; either way with the growth of the whole window's steps
// (DecideOptions::size_growth). Moves the traces out of `in`.
Decision DecideOnInputs(DecisionInputs& in, const RunningConfig& running, const JobPolicy& policy,
                        DecideOptions decide, std::optional<std::optional<uint64_t>> step,
                        bool cover_largest);

// A push's window for a review, a judgement or a reprediction: the canary's
// events switched where the push happened, what the job ran before it, and
// (judgement, reprediction) what it was pushed; (review) its policy.
struct PushReplayInput {
  Trace trace;
  uint64_t switch_event = 0;
  std::optional<uint64_t> first_mark_after;  // SwitchTrace's
  RunningConfig running;
  JobPolicy policy;
  JobFeatures features;  // the job's: the review's candidates must not break it
  AllocatorConfig pushed;
};
// `window` switched at `pushed_at` from `from`, which it runs before.
std::shared_ptr<PushReplayInput> SwitchedAtPush(const JobWindow& window, uint64_t pushed_at,
                                                const AllocatorConfig& from);

// What a replay of `in` runs under (no switch).
ReplayOptions PushReplayBase(const PushReplayInput& in, const AutotuneOptions& options);
// Staying on `in.running` replayed on the events after the push, with a
// switch at the push to the pushed config (`keep`) or none: against what
// the job realised on them (a judgement), or what the pushed config needs
// for them (a reprediction).
absl::StatusOr<ReplayResult> ReplayFromPush(const PushReplayInput& in, bool keep,
                                            const AutotuneOptions& options);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_DECISION_INPUTS_H_
