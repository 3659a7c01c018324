/* liballocd_torch.so: PyTorch's CUDA caching allocator (allocd's engine, rule
 * for rule) on GPU memory from the node daemon, as the C ABI that
 * torch.cuda.memory.CUDAPluggableAllocator loads. `allocd.enable()` in the
 * Python package does all of this; the functions are for it and for tests.
 *
 *   allocd_torch_configure()            before PyTorch's first CUDA tensor
 *   allocd_torch_malloc / _free         CUDAPluggableAllocator(path, ...)
 *   allocd_torch_empty_cache            set_reset_fn: torch.cuda.empty_cache()
 *   allocd_torch_set_memory_fraction    set_memory_fraction_fn
 *   allocd_torch_record_stream          set_record_stream_fn
 *
 * Streams as in PyTorch: a block freed on one stream is reused only by
 * requests on that stream; a block that record_stream() tied to other
 * streams returns to the cache once CUDA events recorded on those streams
 * at its free have completed. The daemon's config pushes, reclaim requests
 * and the stats it shows are handled inside malloc and free (safe points).
 *
 * Thread-safe (one lock, as PyTorch's allocator per device). An allocation
 * that cannot be served throws PyTorch's c10::OutOfMemoryError with its
 * "CUDA out of memory. Tried to allocate ..." message (Python sees
 * torch.OutOfMemoryError; std::runtime_error when PyTorch's c10 is not in the
 * process: torch_errors.h says how); the OOM is reported to the daemon first.
 *
 * The functions below malloc/free are what allocd.enable(mode="engine")
 * routes PyTorch's Python memory functions to (memory_stats,
 * reset_peak_memory_stats, _record_memory_history, _snapshot, ...). */
#ifndef ALLOCD_CLIENT_TORCH_ALLOCD_TORCH_H_
#define ALLOCD_CLIENT_TORCH_ALLOCD_TORCH_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ALLOCD_TORCH_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Connects to the daemon at `socket` (empty: the default, proto/protocol.h's
 * kDefaultSocket) as job `job` (may be empty), with the
 * allocator config `config` (a PYTORCH_CUDA_ALLOC_CONF; empty: PyTorch's
 * defaults) on CUDA device `device` (the daemon's device, as this process
 * numbers it), with the job's autotune preferences `autotune` (JSON, as
 * allocd_connect() takes them; may be empty). The allocator's
 * malloc/free/free_completed stream goes to the daemon's autotuner. 0 on success; -1 with the reason in
 * allocd_torch_last_error() (no daemon, a daemon without --backend cuda, a
 * bad config, a second call). */
ALLOCD_TORCH_API int allocd_torch_configure(const char* socket, const char* job,
                                            const char* config, int device,
                                            const char* autotune);
ALLOCD_TORCH_API const char* allocd_torch_last_error(void);

ALLOCD_TORCH_API void* allocd_torch_malloc(ssize_t size, int device,
                                           void* stream);
ALLOCD_TORCH_API void allocd_torch_free(void* ptr, ssize_t size, int device,
                                        void* stream);
ALLOCD_TORCH_API void allocd_torch_empty_cache(void);
ALLOCD_TORCH_API void allocd_torch_set_memory_fraction(double fraction,
                                                       int device);
ALLOCD_TORCH_API void allocd_torch_record_stream(void* ptr, void* stream);

/* torch.cuda.memory_stats()-style counters plus the session
 * ({"session_id", "config", "config_version", "configs_applied", ...}: the
 * names allocd.stats() gives in every mode) as a
 * JSON object into `buf`, NUL-terminated. Returns its length; it is written
 * only when that is smaller than `len`; -1 before configure. */
ALLOCD_TORCH_API int64_t allocd_torch_stats_json(char* buf, size_t len);

/* Only the engine's counters, named as torch.cuda.memory_stats() names them
 * ("allocated_bytes.all.peak", "num_ooms", ...), as a JSON object. Same
 * return convention as allocd_torch_stats_json. */
ALLOCD_TORCH_API int64_t allocd_torch_memory_stats_json(char* buf, size_t len);

/* torch.cuda.reset_peak_memory_stats / reset_accumulated_memory_stats on
 * the engine. 0; -1 before configure. */
ALLOCD_TORCH_API int allocd_torch_reset_peak_stats(void);
ALLOCD_TORCH_API int allocd_torch_reset_accumulated_stats(void);

/* The managed CUDA device, as this process numbers it; -1 before
 * configure. */
ALLOCD_TORCH_API int allocd_torch_device(void);

/* torch.cuda.memory._record_memory_history on the engine: `enabled` starts
 * recording its events (alloc, free_requested, free_completed,
 * segment_alloc/free, segment_map/unmap, oom), keeping the newest
 * `max_entries` (larger than 2^32: all); `clear` drops those recorded so
 * far; `enabled` 0 stops and drops them. No stack frames are recorded.
 * 0; -1 before configure. */
ALLOCD_TORCH_API int allocd_torch_record_history(int enabled,
                                                 uint64_t max_entries,
                                                 int clear);

/* torch.cuda.memory._snapshot() as a pickle (segments and blocks now, the
 * recorded history in device_traces): its size, written into `buf` only
 * when smaller than `len`; -1 before configure. */
ALLOCD_TORCH_API int64_t allocd_torch_snapshot_pickle(char* buf, size_t len);

/* 1 when an OOM is thrown as c10::OutOfMemoryError in this process (PyTorch
 * is loaded), else 0. */
ALLOCD_TORCH_API int allocd_torch_oom_is_torch_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ALLOCD_CLIENT_TORCH_ALLOCD_TORCH_H_ */
