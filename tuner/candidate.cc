#include "tuner/candidate.h"

#include "absl/strings/str_format.h"

namespace allocd {

std::string CandidateConfString(const Candidate& candidate) {
  return FormatAllocatorConfig(candidate.config);
}

std::string CandidateKey(const Candidate& candidate) {
  std::string key = FormatAllocatorConfig(candidate.config);
  if (candidate.memory_fraction) {
    absl::StrAppendFormat(&key, " @ fraction %.6g", *candidate.memory_fraction);
  }
  return key;
}

}  // namespace allocd
