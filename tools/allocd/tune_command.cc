#include "tools/allocd/tune_command.h"

#include <algorithm>
#include <ostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tools/allocd/common.h"
#include "tuner/html_report.h"
#include "tuner/search_space.h"
#include "tuner/text_report.h"
#include "tuner/tuner.h"

namespace allocd {
namespace {

absl::StatusOr<TuneOptions> MakeTuneOptions(const TuneCommandOptions& o) {
  TuneOptions t;
  absl::StatusOr<Objective> objective = ParseObjective(o.objective);
  if (!objective.ok()) return objective.status();
  t.objective = *objective;
  absl::StatusOr<uint64_t> total = ParseSizeFlag("--total-memory", o.total_memory);
  if (!total.ok()) return total.status();
  // Percentages are of the device, which only --total-memory describes.
  SizeContext of_device{.no_percent_reason = "there is no --total-memory to take it of"};
  if (*total > 0) of_device.percent_of = *total;
  absl::StatusOr<uint64_t> capacity = ParseSizeFlag("--capacity", o.capacity, of_device);
  if (!capacity.ok()) return capacity.status();
  absl::StatusOr<uint64_t> budget =
      ParseSizeFlag("--memory-budget", o.memory_budget, of_device);
  if (!budget.ok()) return budget.status();
  t.capacity = *capacity;
  t.total_memory = *total;
  t.memory_budget = *budget;
  if (o.budget == 0) return absl::InvalidArgumentError("--budget must be at least 1");
  t.budget = o.budget;
  t.jobs = o.jobs > 0 ? o.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.max_retries < 0) return absl::InvalidArgumentError("--max-retries must be >= 0");
  t.max_retries = o.max_retries;
  if (o.max_call_ratio < 0) return absl::InvalidArgumentError("--max-call-ratio must be >= 0");
  t.max_call_ratio = o.max_call_ratio;
  if (o.max_peak_ratio < 0) return absl::InvalidArgumentError("--max-peak-ratio must be >= 0");
  t.max_peak_ratio = o.max_peak_ratio;
  if (!(o.cap_threshold_percent >= 0 && o.cap_threshold_percent <= 100)) {
    return absl::InvalidArgumentError(
        "--cap-threshold is a percentage between 0 and 100, e.g. 5");
  }
  t.cap_threshold = o.cap_threshold_percent / 100.0;
  return t;
}

}  // namespace

int RunTune(const TuneCommandOptions& options, std::ostream& out, std::ostream& err) {
  absl::StatusOr<TuneOptions> tune_options = MakeTuneOptions(options);
  if (!tune_options.ok()) {
    err << "allocd tune: " << tune_options.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<SearchSpace> space = ApplySpaceSpec(DefaultSearchSpace(), options.space);
  if (!space.ok()) {
    err << "allocd tune: " << space.status().message() << "\n";
    return 1;
  }
  if (!options.report_dir.empty()) {
    if (absl::Status s = PrepareReportDir(options.report_dir); !s.ok()) {
      err << "allocd tune: --report: " << s.message() << "\n";
      return 1;
    }
  }
  absl::StatusOr<Trace> trace = LoadTrace(options.trace_path, options.device);
  if (!trace.ok()) {
    err << "allocd tune: " << trace.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = CheckDeviceHoldsTrace(*trace, "--total-memory",
                                             tune_options->total_memory);
      !s.ok()) {
    err << "allocd tune: " << s.message() << "\n";
    return 1;
  }

  ProgressBar bar("tuning");
  tune_options->progress = [&bar](size_t done, size_t planned) { bar.Update(done, planned); };
  absl::StatusOr<TuneReport> report = Tune(*trace, *space, *tune_options);
  bar.Update(1, 1);
  if (!report.ok()) {
    err << "allocd tune: " << report.status().message() << "\n";
    return 1;
  }

  const ReportContext context{options.trace_path, trace->events.size(), trace->device,
                              options.top};
  if (options.json) {
    out << JsonReport(*report, context).dump(2) << "\n";
  } else {
    PrintTextReport(*report, context, out);
  }
  if (!options.report_dir.empty()) {
    absl::StatusOr<HtmlReport> html = MakeHtmlReport(*trace, *report, context);
    absl::Status written =
        html.ok() ? WriteHtmlReport(options.report_dir, *html) : html.status();
    if (!written.ok()) {
      err << "allocd tune: --report: " << written.message() << "\n";
      return 1;
    }
    // Not on stdout under --json, which must stay one JSON object.
    (options.json ? err : out)
        << "\nreport written to " << options.report_dir << "/index.html\n";
  }
  return report->recommended() != nullptr ? 0 : kExitNothingFits;
}

}  // namespace allocd
