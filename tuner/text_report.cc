#include "tuner/text_report.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

std::string Percent(double value, double base) {
  if (base == 0) return "-";
  return absl::StrFormat("%+.1f%%", 100.0 * (value - base) / base);
}

double Ratio(int64_t a, int64_t b) {
  return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
}

std::string ConfigLabel(const Evaluation& e) {
  std::string label = CandidateConfString(e.candidate);
  if (label.empty()) label = "(PyTorch defaults)";
  if (e.candidate.memory_fraction) {
    absl::StrAppendFormat(&label, " + fraction %g", *e.candidate.memory_fraction);
  }
  return label;
}

// The objective's number, for the table's first numeric column.
std::string ScoreText(const TuneReport& report, const Evaluation& e) {
  switch (report.objective) {
    case Objective::kCapacity:
      return e.min_capacity ? FormatSize(*e.min_capacity) : "never fits";
    case Objective::kDeviceAllocs:
      return absl::StrCat(e.replay.num_device_alloc + e.replay.num_device_free);
    case Objective::kPeak:
      break;
  }
  return FormatSize(e.replay.peak_reserved);
}

const char* ScoreHeader(Objective objective) {
  switch (objective) {
    case Objective::kCapacity: return "min capacity";
    case Objective::kDeviceAllocs: return "dev calls";
    case Objective::kPeak: break;
  }
  return "peak reserved";
}

// Columns: rank, [objective score], peak reserved, change of the score
// against the defaults, reserved/allocated, device calls, retries, OOMs,
// config last (it can be long).
void PrintHeader(const TuneReport& report, std::ostream& out) {
  if (report.objective != Objective::kPeak) {
    out << absl::StrFormat("%-5s %13s ", "rank", ScoreHeader(report.objective));
  } else {
    out << absl::StrFormat("%-5s ", "rank");
  }
  out << absl::StrFormat("%13s %9s %5s %9s %7s %4s  %s\n", "peak reserved", "vs dflt",
                         "r/a", "dev calls", "retries", "OOMs", "config");
}

void PrintRow(const TuneReport& report, const std::string& rank,
              const Evaluation& e, std::ostream& out) {
  const double base = report.Score(report.baseline);
  const ReplaySummary& r = e.replay;
  const ReplaySummary& costs =
      report.objective == Objective::kCapacity && e.min_capacity ? e.at_min_capacity : r;
  if (report.objective != Objective::kPeak) {
    out << absl::StrFormat("%-5s %13s ", rank, ScoreText(report, e));
  } else {
    out << absl::StrFormat("%-5s ", rank);
  }
  out << absl::StrFormat("%13s %9s %5.2f %9d %7d %4d  %s\n", FormatSize(r.peak_reserved),
                         Percent(report.Score(e), base), Ratio(r.peak_reserved, r.peak_allocated),
                         costs.num_device_alloc + costs.num_device_free,
                         costs.num_alloc_retries, r.num_ooms, ConfigLabel(e));
}

nlohmann::json SummaryJson(const ReplaySummary& r) {
  return {{"peak_reserved", r.peak_reserved},
          {"peak_allocated", r.peak_allocated},
          {"num_device_alloc", r.num_device_alloc},
          {"num_device_free", r.num_device_free},
          {"num_alloc_retries", r.num_alloc_retries},
          {"num_sync_all_streams", r.num_sync_all_streams},
          {"num_ooms", r.num_ooms},
          {"estimated", r.estimated}};
}

nlohmann::json EvaluationJson(const TuneReport& report, const Evaluation& e) {
  nlohmann::json j = SummaryJson(e.replay);
  j["config"] = CandidateConfString(e.candidate);
  j["memory_fraction"] = e.candidate.memory_fraction
                             ? nlohmann::json(*e.candidate.memory_fraction)
                             : nlohmann::json(nullptr);
  j["feasible"] = report.Feasible(e);
  if (e.min_capacity) {
    j["min_capacity"] = *e.min_capacity;
    j["at_min_capacity"] = SummaryJson(e.at_min_capacity);
  }
  return j;
}

nlohmann::json SavingJson(const TuneReport& report, const Evaluation& e) {
  const double base = report.Score(report.baseline);
  const double score = report.Score(e);
  return {{"unit", report.objective == Objective::kDeviceAllocs ? "device_calls" : "bytes"},
          {"default", base},
          {"value", score},
          {"saved", base - score},
          {"percent", base > 0 ? 100.0 * (base - score) / base : 0.0}};
}

}  // namespace

std::vector<std::string> RecommendationLines(const Evaluation& e) {
  std::vector<std::string> lines = {
      absl::StrCat("export PYTORCH_CUDA_ALLOC_CONF=", CandidateConfString(e.candidate))};
  if (e.candidate.memory_fraction) {
    lines.push_back(absl::StrFormat(
        "torch.cuda.set_per_process_memory_fraction(%g)  # in Python, before "
        "the first CUDA tensor",
        *e.candidate.memory_fraction));
  }
  return lines;
}

std::vector<std::string> Warnings(const TuneReport& report, const Evaluation& e) {
  std::vector<std::string> w;
  const AllocatorConfig& c = e.candidate.config;
  if (c.expandable_segments) {
    w.push_back(
        "expandable_segments:True: PyTorch cannot share these tensors between "
        "processes over CUDA IPC (torch.multiprocessing, DataLoader workers "
        "that return CUDA tensors); turn it off around such code with "
        "torch.cuda.memory._set_allocator_settings('expandable_segments:False').");
  }
  if (e.candidate.memory_fraction) {
    w.push_back(absl::StrFormat(
        "the memory fraction %g is a hard cap: a later, larger batch than the "
        "trace's raises OutOfMemoryError instead of growing the cache. It is "
        "what lets garbage_collection_threshold act.",
        *e.candidate.memory_fraction));
  } else if (c.garbage_collection_threshold > 0) {
    w.push_back(
        "garbage_collection_threshold does nothing without "
        "torch.cuda.set_per_process_memory_fraction.");
  }
  const ReplaySummary& r =
      report.objective == Objective::kCapacity && e.min_capacity ? e.at_min_capacity
                                                                 : e.replay;
  if (r.num_alloc_retries > 0) {
    w.push_back(absl::StrFormat(
        "this needs %d cache flushes, each synchronising every stream (%d "
        "syncs): expect slower steps where they happen.",
        r.num_alloc_retries, r.num_sync_all_streams));
  }
  if (c.max_split_size != std::numeric_limits<size_t>::max()) {
    w.push_back(
        "max_split_size_mb keeps large blocks whole: it helps jobs whose big "
        "tensors change size, and costs memory on jobs whose do not.");
  }
  if (report.options.capacity == 0) {
    w.push_back(
        "no --capacity given: the replay had unlimited memory, so the cache "
        "flushes PyTorch makes on a full device are not modelled.");
  }
  return w;
}

std::string ScoreAmount(const TuneReport& report, double amount) {
  if (report.objective == Objective::kDeviceAllocs) {
    return absl::StrFormat("%d device calls", static_cast<int64_t>(amount));
  }
  return FormatSize(static_cast<uint64_t>(std::max(0.0, amount)));
}

std::string SavingText(const TuneReport& report, const Evaluation& e) {
  const double base = report.Score(report.baseline);
  const double score = report.Score(e);
  if (report.objective == Objective::kDeviceAllocs) {
    return absl::StrFormat("%d device allocs+frees instead of %d with PyTorch's defaults",
                           static_cast<int64_t>(score), static_cast<int64_t>(base));
  }
  if (!(base > score)) return "saves nothing: PyTorch's defaults fit this job as well";
  return absl::StrFormat(
      "saves %s (%.1f%%) of %s against PyTorch's defaults", ScoreAmount(report, base - score),
      100.0 * (base - score) / base,
      report.objective == Objective::kCapacity ? "the memory the job needs"
                                               : "peak reserved memory");
}

std::string Risk(const TuneReport& report, const Evaluation& e) {
  const ReplaySummary& r = e.replay;
  std::string risk;
  if (e.candidate.memory_fraction) {
    const uint64_t total = report.options.total_memory != 0 ? report.options.total_memory
                                                            : report.options.capacity;
    risk = absl::StrFormat(
        "a hard cap at %g of the device's memory%s, over a trace that peaked at %s "
        "allocated: a larger batch or sequence than the trace's raises "
        "OutOfMemoryError instead of growing the cache",
        *e.candidate.memory_fraction,
        report.objective == Objective::kCapacity || total == 0
            ? ""
            : absl::StrCat(" (", FormatSize(static_cast<uint64_t>(
                                     *e.candidate.memory_fraction * static_cast<double>(total))),
                           ")"),
        FormatSize(r.peak_allocated));
  } else {
    risk = "no hard cap: the cache grows when a batch needs more, as with PyTorch's defaults";
  }
  const int64_t calls = r.num_device_alloc + r.num_device_free;
  const int64_t base_calls =
      report.baseline.replay.num_device_alloc + report.baseline.replay.num_device_free;
  absl::StrAppendFormat(&risk, "; %d device calls (%.2fx the defaults')", calls,
                        Ratio(calls, std::max<int64_t>(1, base_calls)));
  if (r.num_alloc_retries > 0) {
    absl::StrAppendFormat(&risk, ", %d cache flushes", r.num_alloc_retries);
  }
  if (e.candidate.config.expandable_segments) risk += "; no CUDA IPC of its tensors";
  return risk;
}

std::optional<AllocctlPush> AllocctlPushOf(const TuneReport& report) {
  const Evaluation* robust = report.robust();
  if (robust == nullptr || robust->replay.estimated) return std::nullopt;
  AllocctlPush push{CandidateConfString(robust->candidate), robust->replay.peak_reserved, ""};
  push.command = absl::StrFormat(
      "allocctl config set '%s' --job JOB --predicted-peak-reserved %d", push.config,
      push.predicted_peak_reserved);
  return push;
}

std::string AllocctlAdvice(const TuneReport& report) {
  const std::optional<AllocctlPush> push = AllocctlPushOf(report);
  if (!push) {
    return "a node running allocd cannot push this answer: every config that fits "
           "needs a memory fraction, which a process takes only when it starts";
  }
  const Evaluation* best = report.recommended();
  const bool is_recommended = best != nullptr && !best->candidate.memory_fraction;
  // The prediction travels with the push, so a dashboard can set it against
  // the peak the job then really reaches.
  return absl::StrCat(
      "on a node running allocd, push ",
      is_recommended ? "it"
                     : "the robust answer (a memory fraction cannot be pushed to "
                       "running processes)",
      " to the job's processes, with its predicted peak:\n  ", push->command);
}

void PrintTextReport(const TuneReport& report, const ReportContext& context,
                     std::ostream& out) {
  out << absl::StrFormat(
      "allocd tune: %s (device %d, %d events), objective %s, capacity %s\n",
      context.trace_path, context.device, context.trace_events,
      ObjectiveName(report.objective),
      report.options.capacity == 0 ? "unlimited" : FormatSize(report.options.capacity));
  out << absl::StrFormat(
      "searched %d of %d configs in the space (%d replays) in %.1f s on %d "
      "threads: %.1f evaluations/s\n\n",
      report.evaluations, report.grid_size, report.replays, report.seconds,
      report.options.jobs,
      report.seconds > 0 ? report.evaluations / report.seconds : 0.0);

  PrintHeader(report, out);
  // Configs with the same replay are shown once, the simplest first.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, size_t> classes;
  std::vector<size_t> shown;
  std::vector<size_t> equivalents;
  for (size_t i = 0; i < report.ranked.size(); ++i) {
    const ReplaySummary& r = report.ranked[i].replay;
    const auto key = std::make_tuple(r.peak_reserved, r.num_device_alloc, r.num_device_free,
                                     r.num_alloc_retries, report.Feasible(report.ranked[i]));
    auto [it, fresh] = classes.emplace(key, shown.size());
    if (fresh) {
      shown.push_back(i);
      equivalents.push_back(0);
    } else {
      ++equivalents[it->second];
    }
  }
  for (size_t row = 0; row < std::min<size_t>(shown.size(), context.top); ++row) {
    const Evaluation& e = report.ranked[shown[row]];
    PrintRow(report, report.Feasible(e) ? absl::StrCat(row + 1) : "x", e, out);
    if (equivalents[row] > 0) {
      out << absl::StrFormat("%*s(and %d more configs with the same replay)\n",
                             report.objective == Objective::kPeak ? 67 : 81, "",
                             equivalents[row]);
    }
  }
  PrintRow(report, "dflt", report.baseline, out);

  out << "\nconfigs from fine-tuning guides:\n";
  for (const ReferenceConfig& ref : report.references) {
    if (!ref.evaluation) {
      out << absl::StrFormat("      rejected by PyTorch 2.11: %s\n        %s\n", ref.conf,
                             ref.error);
    } else if (ref.evaluation->replay.estimated) {
      out << absl::StrFormat("%-5s %13s (an estimate: the CUDA driver's pool)  %s\n", "",
                             FormatSize(ref.evaluation->replay.peak_reserved), ref.conf);
    } else {
      PrintRow(report, "", *ref.evaluation, out);
    }
  }

  const Evaluation* best = report.recommended();
  if (best == nullptr) {
    out << "\nNo candidate runs without an OOM at this capacity within the "
           "guards (at most "
        << report.options.max_retries << " cache flushes, "
        << absl::StrFormat("%gx the defaults' device calls, %gx their peak",
                           report.options.max_call_ratio, report.options.max_peak_ratio)
        << "); loosen them with --max-retries, --max-call-ratio or "
           "--max-peak-ratio.\n";
    return;
  }
  out << "\nrecommended:\n";
  for (const std::string& line : RecommendationLines(*best)) out << "  " << line << "\n";
  out << "  " << SavingText(report, *best) << "\n";
  const double score = report.Score(*best);
  const Evaluation* best_guide = nullptr;
  for (const ReferenceConfig& ref : report.references) {
    if (ref.evaluation && !ref.evaluation->replay.estimated && report.Feasible(*ref.evaluation) &&
        (best_guide == nullptr || report.Score(*ref.evaluation) < report.Score(*best_guide))) {
      best_guide = &*ref.evaluation;
    }
  }
  if (best_guide != nullptr && report.Score(*best_guide) > score) {
    out << absl::StrFormat("  and %s against the best guide config (%s)\n",
                           ScoreAmount(report, report.Score(*best_guide) - score),
                           ConfigLabel(*best_guide));
  }

  const Evaluation* robust = report.robust();
  const Evaluation* capped = report.capped();
  if (robust != nullptr && capped != nullptr) {
    out << "\ntwo answers:\n";
    for (const Evaluation* answer : {robust, capped}) {
      out << absl::StrFormat("  %s%s: %s\n    %s\n    risk: %s\n",
                             answer == robust ? "robust (no hard cap)" : "most saving (hard cap)",
                             answer == best ? ", recommended" : "", ConfigLabel(*answer),
                             SavingText(report, *answer), Risk(report, *answer));
    }
    out << absl::StrFormat(
        "  the cap saves %.1f%% more than the robust answer; it is recommended "
        "only from %g%% (--cap-threshold)\n",
        100.0 * report.CapGain(), 100.0 * report.options.cap_threshold);
  }

  const std::vector<std::string> warnings = Warnings(report, *best);
  if (!warnings.empty()) {
    out << "\nbefore you paste it:\n";
    for (const std::string& w : warnings) out << "  - " << w << "\n";
  }
  out << "\nPareto front (peak reserved vs device allocs+frees):\n";
  for (size_t i : report.pareto) {
    const Evaluation& e = report.ranked[i];
    out << absl::StrFormat("  %10s %7d  %s\n", FormatSize(e.replay.peak_reserved),
                           e.replay.num_device_alloc + e.replay.num_device_free,
                           ConfigLabel(e));
  }
  // Last, so that it is what a user copies after reading the rest.
  out << "\n" << AllocctlAdvice(report) << "\n";
}

nlohmann::json JsonReport(const TuneReport& report, const ReportContext& context) {
  nlohmann::json j;
  j["trace"] = context.trace_path;
  j["device"] = context.device;
  j["events"] = context.trace_events;
  j["objective"] = ObjectiveName(report.objective);
  j["capacity"] = report.options.capacity;
  j["evaluations"] = report.evaluations;
  j["replays"] = report.replays;
  j["seconds"] = report.seconds;
  j["grid_size"] = report.grid_size;
  j["default"] = EvaluationJson(report, report.baseline);
  const auto answer_json = [&](const Evaluation* e) {
    if (e == nullptr) return nlohmann::json(nullptr);
    nlohmann::json a = EvaluationJson(report, *e);
    a["lines"] = RecommendationLines(*e);
    a["warnings"] = Warnings(report, *e);
    a["saving"] = SavingJson(report, *e);
    a["risk"] = Risk(report, *e);
    return a;
  };
  const Evaluation* best = report.recommended();
  j["recommended"] = answer_json(best);
  if (best != nullptr) {
    j["recommended"]["answer"] = best == report.capped() ? "capped" : "robust";
  }
  j["answers"] = {{"robust", answer_json(report.robust())},
                  {"capped", answer_json(report.capped())},
                  {"cap_gain", report.CapGain()},
                  {"cap_threshold", report.options.cap_threshold}};
  if (const std::optional<AllocctlPush> push = AllocctlPushOf(report)) {
    j["allocctl"] = {{"config", push->config},
                     {"predicted_peak_reserved", push->predicted_peak_reserved},
                     {"command", push->command}};
  } else {
    j["allocctl"] = nullptr;
  }
  j["candidates"] = nlohmann::json::array();
  for (const Evaluation& e : report.ranked) j["candidates"].push_back(EvaluationJson(report, e));
  j["pareto"] = nlohmann::json::array();
  for (size_t i : report.pareto) j["pareto"].push_back(EvaluationJson(report, report.ranked[i]));
  j["references"] = nlohmann::json::array();
  for (const ReferenceConfig& ref : report.references) {
    nlohmann::json r = ref.evaluation ? EvaluationJson(report, *ref.evaluation)
                                      : nlohmann::json{{"config", ref.conf}};
    r["config"] = ref.conf;
    if (!ref.error.empty()) r["error"] = ref.error;
    j["references"].push_back(r);
  }
  return j;
}

}  // namespace allocd
