#include "server/autotune/decision_inputs.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/autotune/grown_sizes.h"
#include "server/autotune/step_period.h"

namespace allocd {
namespace {

// How far FindStepPeriod follows a stream whose steps are not all the same
// length: a multi-scale ResNet-50's differ by up to 12 events (cuDNN's
// workspaces depend on the shape; on the H100 no step was found without
// this, so a job that lost no events was never decided on), and each event
// an advisor loses takes up to three with it (an allocation, then its two
// frees, which the window drops as unmatched). At most 32, past which a
// period check would cost more than finding the step is worth.
constexpr size_t kStepShift = 32;

}  // namespace

DecideOptions DecideOptionsFor(const AutotuneOptions& options) {
  DecideOptions decide;
  decide.threads = std::max(1, options.threads);
  decide.capacity = options.capacity;
  decide.total_memory = options.total_memory;
  decide.min_saving = options.min_saving;
  decide.max_call_ratio = options.max_call_ratio;
  decide.budget = options.budget;
  decide.min_events = std::min(options.first_pass_min_events, options.window_events);
  decide.max_shift = kStepShift;
  decide.on_replay = options.on_replay;
  return decide;
}

RunningConfig RunningConfigOf(const AllocatorConfig& config) {
  RunningConfig running;
  running.config = config;
  if (config.per_process_memory_fraction < 1.0) {
    running.memory_fraction = config.per_process_memory_fraction;
  }
  return running;
}

SwitchTrace TraceSwitchingAt(const JobWindow& window, uint64_t seq) {
  const uint64_t window_start = window.total_events() - window.size();
  const std::vector<uint64_t> states = window.StateSeqs();
  auto state = std::upper_bound(states.begin(), states.end(), seq);
  SwitchTrace out;
  // The trace's first event from the window is the window's event number
  // `from`, after `lead` events that rebuild what was live then.
  uint64_t from = window_start;
  uint64_t lead = 0;
  if (state != states.begin()) {
    from = *std::prev(state);
    out.trace = window.ToTraceFromState(from);
  } else {
    out.trace = window.ToTrace();
    // ToTrace starts with what was live at the window's start (the prelude).
    lead = out.trace.events.size() - window.size();
  }
  const auto index = [from, lead](uint64_t at) { return lead + (at - from); };
  out.switch_event = index(seq);
  // A mark right at the switch is where the client released again at once
  // (nothing live at the switch was freed yet): no later one is.
  for (const uint64_t end : window.StepEnds()) {
    if (window_start + end >= seq) {
      if (window_start + end > seq) out.first_mark_after = index(window_start + end);
      break;
    }
  }
  return out;
}

std::optional<StateSwitch> DecisionState(const JobWindow& window, uint64_t latest,
                                         uint64_t min_events) {
  const uint64_t window_start = window.total_events() - window.size();
  std::vector<uint64_t> ends = window.StepEnds();
  for (uint64_t& end : ends) end += window_start;
  auto from = [&](uint64_t seq) {
    StateSwitch s{seq, {}};
    for (uint64_t end : ends) {
      if (end > seq) s.step_ends.push_back(end - seq);
    }
    return s;
  };
  std::optional<StateSwitch> one_step;
  const std::vector<uint64_t> states = window.StateSeqs();
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    if (*it > latest || window.total_events() - *it < min_events) continue;
    StateSwitch s = from(*it);
    if (s.step_ends.size() >= 2) return s;
    if (s.step_ends.size() == 1 && !one_step) one_step = std::move(s);
  }
  return one_step;
}

std::optional<uint64_t> StateAtOrBefore(const JobWindow& window, uint64_t at,
                                        uint64_t min_events) {
  const std::vector<uint64_t> states = window.StateSeqs();
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    if (*it <= at && window.total_events() - *it >= min_events) return *it;
  }
  return std::nullopt;
}

bool LosesTooMany(const JobWindow& window, double max_lost_fraction) {
  return window.has_gap() && static_cast<double>(window.dropped_events()) >
                                 max_lost_fraction * static_cast<double>(window.total_events());
}

std::string SkipReason(const JobWindow& window, const std::string& config,
                       double max_lost_fraction, RunningConfig& running) {
  std::string why;
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
  if (!parsed.ok()) {
    why = absl::StrCat("the job's config '", config, "' does not parse: ",
                       parsed.status().message());
  } else {
    running = RunningConfigOf(*parsed);
  }
  if (LosesTooMany(window, max_lost_fraction)) {
    why = absl::StrFormat(
        "the client dropped events inside the window (%d so far, more than %g of "
        "them): its replay would miss allocations; the next run waits for the "
        "client's next allocator state (at a step mark, or where its stream "
        "restarts) or for the window to move past the gap",
        window.dropped_events(), max_lost_fraction);
  }
  return why;
}

FirstPassStep FindFirstPassStep(const Trace& trace, bool marks_steps) {
  FirstPassStep found;
  if (!marks_steps) found.step = FindStepPeriod(trace, kStepShift);
  found.periodic = found.step && ReturnsWhatItAllocates(trace, *found.step);
  return found;
}

std::string AperiodicWhy(bool marks_steps, const std::string& why) {
  return absl::StrCat(marks_steps
                          ? "aperiodic (its client marks optimizer steps and it marked none: "
                            "it runs no optimizer)"
                          : "aperiodic (no step marks, and no repeat in the stream that "
                            "gives back what it allocates)",
                      ": decided on its largest request so far; ", why);
}

DecisionInputs ReadDecisionInputs(const JobWindow& window, bool cover, bool first_pass,
                                  uint64_t min_events, uint64_t peaked_after) {
  DecisionInputs in;
  in.trace = window.ToTrace();
  // ToTrace starts with what was live at the window's start (the prelude).
  const uint64_t prelude = in.trace.events.size() - window.size();
  in.marked = window.steps_marked() > 0;
  for (uint64_t end : window.StepEnds()) in.step_ends.push_back(prelude + end);
  const uint64_t window_start = window.total_events() - window.size();
  if (window.largest_request_start() >= window_start) {
    in.largest_request = prelude + (window.largest_request_start() - window_start);
  }
  in.largest_peaked = window.total_events() - window.max_requested_at() >= peaked_after;
  in.max_requested = window.max_requested_bytes();
  if (std::optional<StateSwitch> at = DecisionState(
          window, cover ? window.largest_request_start() : window.total_events(), min_events)) {
    in.state_trace = window.ToTraceFromState(at->seq);
    in.state_step_ends = std::move(at->step_ends);
  } else if (!in.marked && (cover || first_pass)) {
    // Only a prediction that covers the largest request replays from it:
    // a larger request, growth, or an aperiodic first pass.
    if (std::optional<uint64_t> seq =
            StateAtOrBefore(window, window.largest_request_start(), min_events)) {
      in.cover_state_trace = window.ToTraceFromState(*seq);
    }
  }
  return in;
}

Decision DecideOnInputs(DecisionInputs& in, const RunningConfig& running, const JobPolicy& policy,
                        DecideOptions decide, std::optional<std::optional<uint64_t>> step,
                        bool cover_largest) {
  Decision d;
  if (!decide.size_growth) {
    // Over the whole window: a state's trace holds only the steps after it.
    decide.size_growth = StepGrowth(in.trace, in.step_ends, step.value_or(std::nullopt));
  }
  if (!in.state_trace && cover_largest && in.cover_state_trace) {
    // No step to switch at: from the state before the largest request,
    // which the prediction then covers.
    in.state_trace = std::move(in.cover_state_trace);
    decide.step_events = std::optional<uint64_t>();
    decide.cover_from = 0;
  }
  if (in.state_trace) {
    // Switched where the client's state was taken: everything after it
    // is the prediction's.
    DecideOptions from_state = decide;
    from_state.switch_event = 0;
    from_state.step_ends = std::move(in.state_step_ends);
    d = Decide(*in.state_trace, running, policy, from_state);
  }
  if (!in.state_trace || d.predicted_peak_current <= 0) {
    const std::string state_why =
        in.state_trace ? absl::StrCat("; from the window: the client's state gave no prediction (",
                                      d.why, ")")
                       : "";
    decide.step_events = step;
    decide.step_ends = std::move(in.step_ends);
    if (cover_largest) decide.cover_from = in.largest_request.value_or(0);
    d = Decide(in.trace, running, policy, decide);
    absl::StrAppend(&d.why, state_why);
  }
  return d;
}

std::shared_ptr<PushReplayInput> SwitchedAtPush(const JobWindow& window, uint64_t pushed_at,
                                                const AllocatorConfig& from) {
  auto input = std::make_shared<PushReplayInput>();
  SwitchTrace at_push = TraceSwitchingAt(window, pushed_at);
  input->trace = std::move(at_push.trace);
  input->switch_event = at_push.switch_event;
  input->first_mark_after = at_push.first_mark_after;
  // What the job ran, as a decision reads it (the decision's own
  // memory_fraction is the one it proposed).
  input->running = RunningConfigOf(from);
  return input;
}

ReplayOptions PushReplayBase(const PushReplayInput& in, const AutotuneOptions& options) {
  ReplayOptions base;
  base.capacity = options.capacity;
  base.total_memory = options.total_memory;
  base.memory_fraction = in.running.memory_fraction;
  return base;
}

absl::StatusOr<ReplayResult> ReplayFromPush(const PushReplayInput& in, bool keep,
                                            const AutotuneOptions& options) {
  ReplayOptions replay = PushReplayBase(in, options);
  replay.live_switch = LiveSwitch{
      in.switch_event, keep ? std::optional<AllocatorConfig>(in.pushed) : std::nullopt,
      std::nullopt};
  // The client's second release (SecondRelease, in every client's
  // LiveSession), at the first mark after the push; a job that marks no
  // steps releases at lows the stream does not show, left out. On the H200
  // a ViT pushed expandable segments from defaults was predicted 6.6% above
  // what it realised without it.
  if (keep && in.first_mark_after) {
    replay.live_switch->release_again_before_event = in.first_mark_after;
  }
  CountedReplay counted(options.on_replay);
  return Replay(in.trace, in.running.config, replay);
}

}  // namespace allocd
