#include "server/autotune/autotuner.h"

#include "absl/strings/str_cat.h"

namespace allocd {

absl::StatusOr<AutotuneMode> ParseAutotuneMode(absl::string_view name) {
  if (name == "off") return AutotuneMode::kOff;
  if (name == "recommend") return AutotuneMode::kRecommend;
  if (name == "apply") return AutotuneMode::kApply;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown autotune mode \"", name, "\": use off, recommend or apply"));
}

const char* AutotuneModeName(AutotuneMode mode) {
  switch (mode) {
    case AutotuneMode::kOff: return "off";
    case AutotuneMode::kRecommend: return "recommend";
    case AutotuneMode::kApply: return "apply";
  }
  return "?";
}

// Skeleton: the implementation lands in the following commits.
class Autotuner::Impl {};

Autotuner::Autotuner(AutotuneOptions, AutotuneActions*) : impl_(std::make_unique<Impl>()) {}
Autotuner::~Autotuner() = default;
void Autotuner::SessionStarted(SessionIdValue, const std::string&, const std::string&, uint64_t) {}
void Autotuner::SessionEnded(SessionIdValue) {}
void Autotuner::Events(SessionIdValue, const std::vector<EvidenceEvent>&, uint64_t) {}
void Autotuner::Stats(SessionIdValue, const std::map<std::string, int64_t>&, uint64_t) {}
void Autotuner::Oom(SessionIdValue, uint64_t) {}
void Autotuner::Acked(SessionIdValue, uint64_t, bool, const std::string&) {}
absl::StatusOr<uint64_t> Autotuner::RunNow(const std::string& job) {
  return absl::NotFoundError(absl::StrCat("no session of job ", job));
}
void Autotuner::SetPolicy(const std::string&, JobPolicy) {}
std::vector<AutotuneJobStatus> Autotuner::Status() const { return {}; }
std::vector<AutotuneDecision> Autotuner::History(const std::string&, size_t) const { return {}; }
void Autotuner::WaitIdle() {}

}  // namespace allocd
