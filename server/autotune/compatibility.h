// Compatibility: whether PyTorch 2.11 can run an allocator config alongside
// what a job's processes do with their CUDA memory (docs/compatibility.md
// names the PyTorch source behind each rule).
//
// A client reports its features as it starts using them (JobFeatures; they
// can appear after registration), and a job's are the union of its
// sessions'. The autotuner leaves out every candidate config that
// ConfigIncompatibility refuses for them, and says why in the decision.
#ifndef ALLOCD_SERVER_AUTOTUNE_COMPATIBILITY_H_
#define ALLOCD_SERVER_AUTOTUNE_COMPATIBILITY_H_

#include <optional>
#include <string>

#include "allocator/config.h"
#include "server/autotune/job_features.h"

namespace allocd {

// Why a process running `from` that does `features` must not be switched
// to `to` (`live`: by a push to the running process; else `to` is what a
// new process of the job starts with), or nullopt when PyTorch 2.11 runs
// it with them. Only a change can break a job: `to` == `from` never does.
//
// - cuda_ipc: expandable_segments off -> on is refused. A block in an
//   expandable segment is exported as file descriptors that its consumer
//   must take with pidfd_getfd (CUDAExpandableSegment::share/fromShared),
//   which a consumer of another uid, or in another PID namespace (pod),
//   cannot: its torch.multiprocessing receive fails. Off is always fine
//   (cudaIpcGetMemHandle, what PyTorch recommends for shared tensors).
// - nccl_registration, live: expandable_segments off -> on is refused.
//   PyTorch decides once per process whether NCCL registers every segment
//   (shouldAllCommunicatorsRegisterAllTensors, off under expandable
//   segments as "not compatible"); turned on after that, the hooks keep
//   registering and deregistering segments as if it were off.
// - cuda_graphs, mem_pool: nothing is refused. Private pools never use
//   expandable segments (alloc_block), and the other keys only shape how
//   later blocks are cut; what a push must not do is empty the cache
//   inside a capture (synchronize_and_free_events asserts no capture is
//   underway), which the client prevents by applying pushes between
//   captures.
std::optional<std::string> ConfigIncompatibility(const JobFeatures& features,
                                                 const AllocatorConfig& from,
                                                 const AllocatorConfig& to, bool live);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_COMPATIBILITY_H_
