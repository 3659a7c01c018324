// Reports of a TuneReport for people (a ranked table, the recommended line,
// savings, warnings) and for machines (JSON).
#ifndef ALLOCD_TUNER_TEXT_REPORT_H_
#define ALLOCD_TUNER_TEXT_REPORT_H_

#include <cstdint>
#include <iosfwd>
#include <optional>
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

// An amount of the objective's unit: bytes, or device calls.
std::string ScoreAmount(const TuneReport& report, double amount);

// What `e` saves against PyTorch's defaults, in the objective's unit:
// "saves 2.93 GiB (39.6%) of peak reserved memory against PyTorch's
// defaults".
std::string SavingText(const TuneReport& report, const Evaluation& e);

// What can go wrong with `e`, in one line: a hard cap and the OOMs it
// brings, or none; its device calls against the defaults'; cache flushes;
// no CUDA IPC with expandable segments.
std::string Risk(const TuneReport& report, const Evaluation& e);

// The push a node running allocd can make: the robust answer (a memory
// fraction cannot reach processes that already run), with the peak reserved
// memory its replay predicts. nullopt when no config without a fraction
// fits (or only an estimated one).
struct AllocctlPush {
  std::string config;
  int64_t predicted_peak_reserved;
  std::string command;  // the allocctl line to paste
};
std::optional<AllocctlPush> AllocctlPushOf(const TuneReport& report);

// The text that introduces the allocctl line, and the line; or why there is
// none.
std::string AllocctlAdvice(const TuneReport& report);

void PrintTextReport(const TuneReport& report, const ReportContext& context,
                     std::ostream& out);

nlohmann::json JsonReport(const TuneReport& report,
                          const ReportContext& context);

}  // namespace allocd

#endif  // ALLOCD_TUNER_TEXT_REPORT_H_
