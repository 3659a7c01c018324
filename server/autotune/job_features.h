// JobFeatures: what a job's processes do with their CUDA memory that an
// allocator config must not break, as the clients report them
// (v1::JobFeatures), and a config a decision left out for them. Kept apart
// from the rule (compatibility.h) so that the autotuner's vocabulary
// (autotune_types.h) carries them without the allocator's config.
#ifndef ALLOCD_SERVER_AUTOTUNE_JOB_FEATURES_H_
#define ALLOCD_SERVER_AUTOTUNE_JOB_FEATURES_H_

#include <string>

namespace allocd {

// What a job's processes do that a config must not break. Each only ever
// turns on: a feature once used may be used again.
struct JobFeatures {
  // A CUDA tensor of the process was exported to another process (CUDA
  // IPC: torch.multiprocessing, Storage._share_cuda_, cuIpcGetMemHandle,
  // cuMemExportToShareableHandle). Who opens it is unknown to the
  // producer: a consumer of another uid or pod is assumed.
  bool cuda_ipc = false;
  // The process captured a CUDA graph (torch.cuda.graph, CUDAGraph,
  // torch.compile's cudagraph trees): allocations in private pools.
  bool cuda_graphs = false;
  // The process allocated from a torch.cuda.MemPool.
  bool mem_pool = false;
  // NCCL registers the allocator's segments with its communicators
  // (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, or a MemPool
  // registered with ProcessGroupNCCL.register_mem_pool).
  bool nccl_registration = false;

  bool operator==(const JobFeatures&) const = default;
  // Those of either.
  JobFeatures& operator|=(const JobFeatures& other);
  bool any() const { return cuda_ipc || cuda_graphs || mem_pool || nccl_registration; }
};

// The features by name, comma-separated ("cuda_ipc,cuda_graphs"; "" for
// none), as allocctl and the logs show them.
std::string FeatureNames(const JobFeatures& features);

// A config the decider left out, and why.
struct LeftOutConfig {
  std::string config;  // canonical
  std::string why;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_JOB_FEATURES_H_
