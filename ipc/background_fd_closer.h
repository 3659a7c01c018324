// BackgroundFdCloser: closes file descriptors on a thread of its own.
//
// Closing the last descriptor of an exported CUDA allocation makes the
// NVIDIA driver tear the export down, which takes about half a millisecond
// (bench/gpu/cuda_chunk_bench, step_close_fd, on an H100) — longer than
// mapping the chunk. Neither the daemon's side channel, which serves every
// process on the node from one thread, nor an allocation in a training step
// should wait for it.
//
// At most `max_pending` descriptors wait at any time; beyond that Close()
// closes inline, so a burst cannot run a process out of descriptors.
// Thread-safe.
#ifndef ALLOCD_IPC_BACKGROUND_FD_CLOSER_H_
#define ALLOCD_IPC_BACKGROUND_FD_CLOSER_H_

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ipc/unix_socket.h"

namespace allocd {

class BackgroundFdCloser {
 public:
  explicit BackgroundFdCloser(size_t max_pending = 1024);
  // Closes whatever is still pending, then stops the thread.
  ~BackgroundFdCloser();
  BackgroundFdCloser(const BackgroundFdCloser&) = delete;
  BackgroundFdCloser& operator=(const BackgroundFdCloser&) = delete;

  // Closes `fd` soon, on the closer's thread (inline when `max_pending`
  // descriptors already wait). An invalid `fd` is ignored.
  void Close(UniqueFd fd);

  // Returns once every descriptor handed to Close() before the call is
  // closed.
  void Flush();

 private:
  void Loop();

  const size_t max_pending_;
  absl::Mutex mu_;
  std::vector<UniqueFd> pending_ ABSL_GUARDED_BY(mu_);
  // Descriptors handed over and closed so far: Flush() waits for the one
  // to catch up with the other.
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t closed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace allocd

#endif  // ALLOCD_IPC_BACKGROUND_FD_CLOSER_H_
