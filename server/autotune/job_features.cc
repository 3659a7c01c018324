#include "server/autotune/job_features.h"

#include <vector>

#include "absl/strings/str_join.h"

namespace allocd {

JobFeatures& JobFeatures::operator|=(const JobFeatures& other) {
  cuda_ipc = cuda_ipc || other.cuda_ipc;
  cuda_graphs = cuda_graphs || other.cuda_graphs;
  mem_pool = mem_pool || other.mem_pool;
  nccl_registration = nccl_registration || other.nccl_registration;
  return *this;
}

std::string FeatureNames(const JobFeatures& features) {
  std::vector<const char*> names;
  if (features.cuda_ipc) names.push_back("cuda_ipc");
  if (features.cuda_graphs) names.push_back("cuda_graphs");
  if (features.mem_pool) names.push_back("mem_pool");
  if (features.nccl_registration) names.push_back("nccl_registration");
  return absl::StrJoin(names, ",");
}

}  // namespace allocd
