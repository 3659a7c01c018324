// Reports of a TuneReport for people (a ranked table, the recommended line,
// savings, warnings) and for machines (JSON).
#ifndef ALLOCD_TUNER_TEXT_REPORT_H_
#define ALLOCD_TUNER_TEXT_REPORT_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tuner/tuner.h"

namespace allocd {

struct ReportContext {
  std::string trace_path;
  uint64_t trace_events = 0;
  int device = 0;
  int top = 10;  // rows of the ranked table
};

// What a user must know before pasting the recommendation: IPC and
// expandable segments, what a memory fraction does, retries it costs, ...
std::vector<std::string> Warnings(const TuneReport& report,
                                  const Evaluation& recommended);

// The lines to paste: the export and, if any, the Python fraction call.
std::vector<std::string> RecommendationLines(const Evaluation& recommended);

void PrintTextReport(const TuneReport& report, const ReportContext& context,
                     std::ostream& out);

nlohmann::json JsonReport(const TuneReport& report,
                          const ReportContext& context);

}  // namespace allocd

#endif  // ALLOCD_TUNER_TEXT_REPORT_H_
