#include "server/autotune/autotune_job.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "server/autotune/decider.h"

namespace allocd {

bool AutotuneSession::Fragmented(int64_t reserved, int64_t allocated, absl::Time now,
                                 const AutotuneOptions& options) {
  if (allocated <= 0 || static_cast<double>(reserved) <=
                            options.fragmentation_ratio * static_cast<double>(allocated)) {
    fragmented_since.reset();
    return false;
  }
  if (!fragmented_since) {
    fragmented_since = now;
    return false;
  }
  if (now - *fragmented_since < options.fragmentation_for) return false;
  fragmented_since.reset();
  return true;
}

AutotuneDecision* AutotuneJob::FindDecision(uint64_t id) {
  return const_cast<AutotuneDecision*>(std::as_const(*this).FindDecision(id));
}

const AutotuneDecision* AutotuneJob::FindDecision(uint64_t id) const {
  for (const AutotuneDecision& d : history) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

void AutotuneJob::Record(AutotuneDecision decision, size_t kept) {
  history.push_back(std::move(decision));
  while (history.size() > std::max<size_t>(1, kept)) history.pop_front();
}

std::optional<std::string> AutotuneJob::NotProposedAgain(const std::string& config,
                                                         int64_t requested,
                                                         double growth_margin) const {
  auto it = rolled_back.find(config);
  if (it == rolled_back.end()) return std::nullopt;
  if (it->second == kRolledBackForGood) {
    return "; it was rolled back before, so it is not pushed again";
  }
  const auto needed =
      static_cast<int64_t>((1.0 + growth_margin) * static_cast<double>(it->second));
  if (requested > needed) return std::nullopt;
  return absl::StrFormat(
      "; it was rolled back before, judged on what the job requested then (at most %s), so "
      "it is pushed again only once the job requests more than %s (so far %s)",
      GiB(it->second), GiB(needed), GiB(requested));
}

AutotuneJob::Taken AutotuneJob::Decided(AutotuneDecision& rec, const Decision& d,
                                        const RunningConfig& running, int64_t max_requested,
                                        AutotuneMode mode, const AutotuneOptions& options,
                                        absl::Time now) {
  Taken taken;
  rec.decided_on = recorded;
  rec.from_config = FormatAllocatorConfig(running.config);
  rec.predicted_peak_current = d.predicted_peak_current;
  rec.predicted_peak_switched = d.predicted_peak_switched;
  rec.predicted_saving = d.predicted_peak_current - d.predicted_peak_switched;
  rec.predicted_peak_allocated = d.predicted_peak_allocated;
  rec.predicted_peak_requested = d.predicted_peak_requested;
  if (d.predicted_peak_rolled_back > 0) {
    rec.predicted_peak_rolled_back = d.predicted_peak_rolled_back;
  }
  rec.replay_seconds = d.replay_seconds;
  rec.candidates = d.candidates;
  rec.why = d.why;
  rec.left_out = d.left_out;
  switch (d.result) {
    case Decision::Result::kSkip:
      rec.result = AutotuneResult::kSkipped;
      break;
    case Decision::Result::kKeep:
      rec.result = AutotuneResult::kKept;
      break;
    case Decision::Result::kPropose:
      rec.to_config = d.to_config;
      rec.memory_fraction = d.to.memory_fraction;
      if (std::optional<std::string> why_not =
              NotProposedAgain(d.to_config, max_requested, options.growth_margin)) {
        rec.result = AutotuneResult::kKept;
        absl::StrAppend(&rec.why, *why_not);
      } else if (mode != AutotuneMode::kApply) {
        rec.result = AutotuneResult::kRecommended;
      } else if (sessions.empty()) {
        rec.result = AutotuneResult::kSkipped;
        absl::StrAppend(&rec.why, "; the job has no session left to push to");
      } else {
        rec.result = AutotuneResult::kPushed;
        if (auto it = rolled_back.find(d.to_config); it != rolled_back.end()) {
          absl::StrAppend(&rec.why, absl::StrFormat(
              "; rolled back before on requests of at most %s, pushed again now that the "
              "job requests %s", GiB(it->second), GiB(max_requested)));
        }
        taken.canary = sessions.front();  // the oldest
        rec.sessions = {*taken.canary};
        acting.emplace(
            Canary::Push{
                .decision_id = rec.id,
                .canary = *taken.canary,
                .to_config = d.to_config,
                .pushed_config = FormatAllocatorConfig(d.to.config),
                .rollback_config = LiveConfigString(running.config, d.to.config),
                .predicted_current = d.predicted_peak_current,
                .predicted = {d.predicted_peak_switched, d.predicted_peak_allocated,
                              d.predicted_peak_requested},
                .lockstep = lockstep},
            CanaryOptionsOf(options));
        // The canary's growth is measured from here.
        if (window) window->ResetPeakRequested();
      }
      break;
  }
  if (rec.result != AutotuneResult::kPushed && rec.result != AutotuneResult::kRecommended) {
    rec.to_config.clear();
  }
  queued = false;
  queued_id = 0;
  first_pass_done = true;
  cooldown_until = now + options.cooldown;
  decided_requested = std::max(decided_requested, max_requested);
  if (rec.result != AutotuneResult::kSkipped) {
    // What the config the job runs from now on needs: the pushed one's
    // prediction, else staying's.
    settled_need = rec.result == AutotuneResult::kPushed ? d.predicted_peak_switched
                                                         : d.predicted_peak_current;
  }
  // A decision on the canary's stream that keeps the pushed config is the
  // newest prediction for it, once it covers more than the standing one.
  if (rec.result == AutotuneResult::kKept && acting && recorded == acting->canary() &&
      rec.from_config == acting->pushed_config() &&
      acting->TakePrediction({d.predicted_peak_current, d.predicted_peak_allocated,
                              d.predicted_peak_requested})) {
    if (AutotuneDecision* pushed = FindDecision(acting->decision_id())) {
      pushed->at_need_basis = absl::StrFormat("decision %d, which kept it", rec.id);
      acting->UpdatePredictionAtNeed(pushed);
      taken.pushed_update = *pushed;
    }
  }
  Record(rec, options.history_per_job);
  return taken;
}

std::optional<AutotuneJob::Due> AutotuneJob::DueOnEvents(const AutotuneOptions& options) const {
  const JobWindow& w = *window;
  const size_t size = w.size();
  if (first_pass_done) {
    // A request larger than any the last decision saw, once it has
    // peaked (the stream moved on past it).
    if (decided_requested > 0 &&
        static_cast<double>(w.max_requested_bytes()) >
            (1.0 + options.growth_margin) * static_cast<double>(decided_requested) &&
        w.total_events() - w.max_requested_at() >= options.first_pass_min_events) {
      return Due{.trigger = AutotuneTrigger::kLargerRequest};
    }
  } else if (w.steps_marked() > 0) {
    // The job marks its steps: decided on once it has marked enough (a job
    // on a harmful config after its first whole step), on no fewer events
    // than any run decides on.
    const size_t marks = first_trigger == AutotuneTrigger::kBadStartConfig
                             ? 2
                             : std::max<size_t>(2, options.first_pass_steps);
    if (w.steps_marked() >= marks &&
        size >= std::min(options.first_pass_min_events, options.window_events)) {
      return Due{.trigger = first_trigger, .first_pass = true};
    }
  } else if (size >= next_first_pass_check) {
    // Probed on the worker (finding the step is not for this thread).
    return Due{.trigger = first_trigger, .first_pass = true, .probe = true};
  }
  return std::nullopt;
}

void AutotuneJob::ResetFirstPassCheck(const AutotuneOptions& options, bool marks_steps) {
  next_first_pass_check =
      std::min(marks_steps ? options.aperiodic_after_events : options.first_pass_min_events,
               options.window_events);
}

void AutotuneJob::Probed(size_t window_events) {
  const size_t size = window->size();
  next_first_pass_check = std::min(size + size / 2, window_events);
}

bool AutotuneJob::Grew(int64_t reserved, double growth_margin) const {
  const double grown = 1.0 + growth_margin;
  return first_pass_done && settled_need > 0 &&
         static_cast<double>(reserved) > grown * static_cast<double>(settled_need) &&
         static_cast<double>(reserved) > grown * static_cast<double>(growth_reserved);
}

std::optional<RecordedStream> AutotuneJob::Stream() const {
  if (window == nullptr) return std::nullopt;
  return RecordedStream{.session = recorded,
                        .total_events = window->total_events(),
                        .steps_marked = window->steps_marked(),
                        .held_requested = window->held_requested_bytes(),
                        .peak_held_requested = window->peak_held_requested_bytes()};
}

std::shared_ptr<PushReplayInput> AutotuneJob::CanaryEventsAfterPush() const {
  const std::optional<uint64_t> pushed_at = acting->pushed_at();
  if (!pushed_at || recorded != acting->canary() || window == nullptr) return nullptr;
  const uint64_t window_start = window->total_events() - window->size();
  if (*pushed_at >= window->total_events() || *pushed_at < window_start) return nullptr;
  const AutotuneDecision* d = FindDecision(acting->decision_id());
  if (d == nullptr) return nullptr;
  absl::StatusOr<AllocatorConfig> from = ParseAllocatorConfig(d->from_config);
  absl::StatusOr<AllocatorConfig> pushed = ParseAllocatorConfig(acting->pushed_config());
  if (!from.ok() || !pushed.ok()) return nullptr;  // canonical: they parsed to be decided on
  std::shared_ptr<PushReplayInput> input = SwitchedAtPush(*window, *pushed_at, *from);
  input->pushed = *pushed;
  return input;
}

std::shared_ptr<LearnCheckInput> AutotuneJob::LearnCheckOfPush() const {
  if (window == nullptr || window->size() == 0) return nullptr;
  const AutotuneDecision* d = FindDecision(acting->decision_id());
  auto input = std::make_shared<LearnCheckInput>();
  // Canonical, as the pushed config is.
  input->pushed = CanonicalAllocatorConfig(acting->to_config()).value_or(acting->to_config());
  for (const std::string& had : {d != nullptr ? d->from_config : acting->rollback_config(),
                                 window_config}) {
    const std::optional<std::string> c = CanonicalAllocatorConfig(had);
    if (c && *c != input->pushed &&
        std::find(input->alternatives.begin(), input->alternatives.end(), *c) ==
            input->alternatives.end()) {
      input->alternatives.push_back(*c);
    }
  }
  input->trace = window->ToTrace();
  return input;
}

std::shared_ptr<PushReplayInput> AutotuneJob::TakeReview(uint64_t& decision_id) {
  if (!review || window == nullptr) return nullptr;
  const auto [id, pushed_at] = *review;
  review.reset();
  decision_id = id;
  AutotuneDecision* d = FindDecision(id);
  // Rolled back: nothing to judge.
  if (d == nullptr || d->result != AutotuneResult::kPushed) return nullptr;
  absl::StatusOr<AllocatorConfig> from = ParseAllocatorConfig(d->from_config);
  if (!from.ok()) return nullptr;  // canonical: parses, as it did to be decided on
  // Nothing ran after the push: nothing to judge it on.
  if (pushed_at >= window->total_events()) return nullptr;
  const uint64_t window_start = window->total_events() - window->size();
  if (pushed_at < window_start) {
    absl::StrAppend(&d->why, "; not reviewed: the push left the window before the job ended");
    return nullptr;
  }
  return SwitchedAtPush(*window, pushed_at, *from);
}

bool AutotuneJob::CanaryEnded(SessionId id, std::vector<AutotuneDecision>& notify) {
  const Canary::Ended ended = acting->SessionEnded(id);
  AutotuneDecision* d = FindDecision(acting->decision_id());
  if (ended == Canary::Ended::kPromoteKept || ended == Canary::Ended::kPromoteWithinMargin) {
    // Judged on the same events and kept, or watched over whole steps
    // without leaving the margin, the push is what the job's next
    // sessions start with (a job of one session, the most common, may
    // not outlive its canary's watch: on the H200 a ViT ran its 100
    // steps in less than the 10 s after its push, and nothing was
    // learned).
    if (d != nullptr) {
      absl::StrAppend(&d->why, "; the canary session ended before its watch did, ",
                      ended == Canary::Ended::kPromoteKept
                          ? "after its judgement kept the push"
                          : "its watch having found it within the margin");
    }
    return true;
  }
  if (ended == Canary::Ended::kDrop) {
    // Nothing was pushed beyond the canary, and nothing more will be.
    if (d != nullptr) {
      absl::StrAppend(&d->why, "; the canary session ended before its watch did: "
                               "the job's other sessions were left alone");
      notify.push_back(*d);
    }
    acting.reset();
  }
  return false;
}

void AutotuneJob::RolledBack(absl::Time until) {
  rolled_back[acting->to_config()] = acting->rolled_back_on_requested() > 0
                                         ? acting->rolled_back_on_requested()
                                         : kRolledBackForGood;
  settled_need = acting->predicted_current();
  acting.reset();
  cooldown_until = until;
}

}  // namespace allocd
