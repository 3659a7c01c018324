#include "server/autotune/compatibility.h"

namespace allocd {

std::optional<std::string> ConfigIncompatibility(const JobFeatures& features,
                                                 const AllocatorConfig& from,
                                                 const AllocatorConfig& to, bool live) {
  const bool turns_on_expandable = !from.expandable_segments && to.expandable_segments;
  if (features.cuda_ipc && turns_on_expandable) {
    return "the job shares CUDA tensors with other processes, and PyTorch exports a tensor in an "
           "expandable segment as file descriptors its consumer must take with pidfd_getfd, which "
           "a consumer of another uid or pod cannot";
  }
  if (features.nccl_registration && live && turns_on_expandable) {
    return "NCCL registers the job's segments, which PyTorch decides once per process and only "
           "without expandable segments (it calls the two incompatible)";
  }
  return std::nullopt;
}

}  // namespace allocd
