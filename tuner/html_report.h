// The tune report as pictures: a self-contained HTML page (inline SVG and
// CSS, no scripts, nothing fetched) and the same SVGs as separate files.
//
// - timeline.svg: reserved and allocated memory over the trace's events for
//   PyTorch's defaults and for the recommended config.
// - fragmentation.svg: reserved minus allocated over the events, for both.
// - landscape.svg: what the search saw: the least peak reserved memory of
//   the feasible configs it tried with each max_split_size_mb value and with
//   each roundup_power2_divisions setting, against the defaults' peak.
// - index.html: the three pictures, the lines to paste with their warnings,
//   and the text report (ranked table, guide configs, Pareto front).
//
// The curves come from replaying both configs again at the tuning capacity
// with about 2000 timeline samples, each the highs of its stretch of events.
// All text is XML-escaped, so a trace path with '<' or '&' stays text.
#ifndef ALLOCD_TUNER_HTML_REPORT_H_
#define ALLOCD_TUNER_HTML_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/trace/trace.h"
#include "tuner/text_report.h"
#include "tuner/tuner.h"

namespace allocd {

// The report's files, each a complete document.
struct HtmlReport {
  std::string index_html;  // embeds the three SVGs
  std::string timeline_svg;
  std::string fragmentation_svg;
  std::string landscape_svg;
};

// Draws the report of tuning `trace`. Errors only if a replay fails.
absl::StatusOr<HtmlReport> MakeHtmlReport(const Trace& trace,
                                          const TuneReport& report,
                                          const ReportContext& context);

// Writes index.html, timeline.svg, fragmentation.svg and landscape.svg into
// `dir`, creating it (and its parents) if needed. An error names the path.
absl::Status WriteHtmlReport(const std::string& dir, const HtmlReport& report);

// Creates `dir` if needed and checks it can be written, so a bad --report
// fails before a long tune rather than after it.
absl::Status PrepareReportDir(const std::string& dir);

}  // namespace allocd

#endif  // ALLOCD_TUNER_HTML_REPORT_H_
