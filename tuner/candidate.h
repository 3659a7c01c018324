// Candidate: one way to run a job that the tuner can recommend: an allocator
// config plus, optionally, torch.cuda.set_per_process_memory_fraction (the
// only thing that lets garbage_collection_threshold act).
#ifndef ALLOCD_TUNER_CANDIDATE_H_
#define ALLOCD_TUNER_CANDIDATE_H_

#include <optional>
#include <string>

#include "allocator/config.h"

namespace allocd {

struct Candidate {
  AllocatorConfig config;
  std::optional<double> memory_fraction;

  bool operator==(const Candidate&) const = default;
};

// A canonical, unique name: FormatAllocatorConfig plus the fraction, e.g.
// "max_split_size_mb:256,garbage_collection_threshold:0.6 @ fraction 0.2".
// Equal candidates have equal keys and different ones different keys.
std::string CandidateKey(const Candidate& candidate);

// The PYTORCH_CUDA_ALLOC_CONF value alone ("" for PyTorch's defaults).
std::string CandidateConfString(const Candidate& candidate);

}  // namespace allocd

#endif  // ALLOCD_TUNER_CANDIDATE_H_
