/* liballocd_client: the daemon client as a C ABI, for the Python package
 * (`import allocd`, through ctypes) and any language with a C FFI.
 *
 * Every function is thread-safe. Strings in are NUL-terminated UTF-8;
 * strings out are written into the caller's buffer (NUL-terminated,
 * truncated to fit). Functions returning int give 0 on success and -1 on
 * error, with the reason in allocd_last_error() (per thread). */
#ifndef ALLOCD_CLIENT_CAPI_ALLOCD_CLIENT_H_
#define ALLOCD_CLIENT_CAPI_ALLOCD_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#define ALLOCD_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct allocd_client allocd_client;

/* The reason the last call on this thread failed. */
ALLOCD_API const char* allocd_last_error(void);

/* Where the daemon serves clients unless told otherwise ($ALLOCD_SOCKET). */
ALLOCD_API const char* allocd_default_socket(void);

/* Registers a session with the daemon at `socket` (empty or NULL:
 * allocd_default_socket()) and opens its lease.
 * `job` and `initial_config` may be empty. `autotune` is the job's
 * autotune preferences as JSON ({"pinned_keys": [...],
 * "allow_memory_fraction": bool, "mode": "off|recommend|apply"}) or empty.
 * The process's rank in a job of several is its environment's (torchrun's
 * TORCHELASTIC_RUN_ID, RANK and WORLD_SIZE: client/client_env.h).
 * NULL when no daemon answers, the preferences do not parse, or that
 * environment holds no rank it can have. */
ALLOCD_API allocd_client* allocd_connect(const char* socket, const char* job,
                              const char* initial_config,
                              const char* description, const char* autotune);
/* allocd_connect for the GPU whose UUID is `gpu_uuid` ("GPU-..." as
 * nvidia-smi prints it): the daemon serves the session from that GPU's
 * pool, whatever CUDA_VISIBLE_DEVICES numbers it here. Empty or NULL: the
 * daemon's first device (what allocd_connect does). */
/* Starts this process on the config its tenant's job `job` learned, if
 * the daemon at `socket` (empty: the default) has one (StartOnLearnedConfig: the environment
 * PyTorch reads at its first allocation). Copies the learned config, ""
 * for none, into `out` (`size` bytes, NUL-terminated, cut to fit). Returns
 * 0; -1 when no daemon answers or it refuses (allocd_last_error). */
ALLOCD_API int allocd_start_on_learned_config(const char* socket,
                                              const char* job, char* out,
                                              size_t size);
ALLOCD_API allocd_client* allocd_connect_gpu(const char* socket,
                                             const char* job,
                                             const char* initial_config,
                                             const char* description,
                                             const char* autotune,
                                             const char* gpu_uuid);
/* Ends the session (the daemon takes back its chunks) and frees `c`; of a
 * borrowed client, frees only `c`. */
ALLOCD_API void allocd_disconnect(allocd_client* c);

ALLOCD_API uint64_t allocd_session_id(allocd_client* c);

/* Sends the published stats now and waits until they are sent. */
ALLOCD_API int allocd_flush_telemetry(allocd_client* c);

/* The allocator a session drives (allocd_poll): PyTorch's own, from
 * Python. The functions are called with `context`, on the thread that
 * called allocd_poll or allocd_mark_step. */
typedef struct allocd_target {
  /* Makes `update` the allocator's settings (a PYTORCH_CUDA_ALLOC_CONF
   * naming every key: for PyTorch's own,
   * torch.cuda.memory._set_allocator_settings(update), which leaves it with
   * exactly the pushed config); the session empties the cache after.
   * Returns 0, or nonzero when the allocator refused `update`, with the
   * reason written into `error` (at most `error_len` bytes; the library
   * ends it). */
  int (*reconfigure)(const char* update, char* error, size_t error_len,
                     void* context);
  /* Releases the cached blocks no allocation uses
   * (torch.cuda.empty_cache()). */
  void (*empty_cache)(void* context);
  /* The allocator's stats, a JSON object of torch.cuda.memory_stats()
   * names to numbers, into `buf`: its length, written only when smaller
   * than `len` (then the call is made again with a larger buffer). */
  int64_t (*stats)(char* buf, size_t len, void* context);
  void* context;
  /* Releases at least `bytes` (> 0) of the cache, keeping the rest where
   * the allocator can (a reclaim asks what a neighbour is short of: in
   * transparent mode, empty_cache() with the segments it frees kept
   * mapped and the largest of them given back until `bytes` are). NULL:
   * empty_cache serves. */
  void (*release_cached)(uint64_t bytes, void* context);
} allocd_target;

/* One round of the client's control loop (LiveSession, as every allocd
 * client runs it) on `target`: applies the configs the daemon pushed
 * (refused and NACKed when one does not parse, names another backend than
 * the process started with, or the allocator refuses it; else applied,
 * the cache emptied, and ACKed), empties the cache for each reclaim
 * request, publishes the allocator's stats, and releases the cache once
 * more after a push when what was live at the switch has gone (for a job
 * that marks no steps; allocd_mark_step for one that does). One thread
 * polls a client at a time. Returns 0. */
ALLOCD_API int allocd_poll(allocd_client* c, const allocd_target* target);
/* The job marked a step (its optimizer stepped): the second release a
 * push left pending is made on `target`, and from now on the session
 * leaves it to the marks. Any thread. Returns 0. */
ALLOCD_API int allocd_mark_step(allocd_client* c, const allocd_target* target);
/* Waits up to `timeout_ms` for a control message: 1 when one waits for
 * allocd_poll, 0 when none came. A thread that polls in rounds can block
 * here to handle a push as it arrives. */
ALLOCD_API int allocd_wait_control(allocd_client* c, uint32_t timeout_ms);
/* Ends every allocd_wait_control of `c` now, and later ones return at
 * once: a watcher that waits with no timeout to speak of (no wake-ups
 * while nothing comes) is stopped with this before allocd_disconnect.
 * Any thread. */
ALLOCD_API void allocd_stop_waiting_control(allocd_client* c);
/* The session as allocd.stats() names it, a JSON object into `buf`:
 *   {"session_id": N, "reconnects": N, "config": "...",
 *    "config_version": N, "config_reason": "...", "configs_applied": N,
 *    "configs_rejected": N, "reclaims": N, "ooms_reported": N,
 *    "events_dropped": N}
 * with the config the allocator runs (canonical; the one it started with
 * until a push is applied) and the version the daemon connected now knows
 * it by. Returns the JSON's length, -1 on error (a buffer too small). */
ALLOCD_API int64_t allocd_session_stats(allocd_client* c, char* buf,
                                        size_t len);

/* Records `n` allocator events for the daemon's autotuner, in order:
 * event i is (ops[i]: 0 alloc, 1 free_requested, 2 free_completed, 3 a
 * step mark: the job ended a step there, its size, id and stream 0;
 * sizes[i]; ids[i]; streams[i]). `dropped_before`: events the caller lost
 * just before these (a gap in its source). The telemetry thread sends them
 * in batches. More than the client's buffer holds wait for the telemetry
 * thread to send (up to half a second; not called on an allocating
 * thread, then), and only then are dropped and counted. Returns the number
 * recorded, -1 on error. */
ALLOCD_API int64_t allocd_record_events(allocd_client* c, const uint8_t* ops,
                                        const uint64_t* sizes,
                                        const uint64_t* ids,
                                        const uint64_t* streams, size_t n,
                                        uint64_t dropped_before);
/* Records the allocator's state right after the events recorded so far
 * (at a step mark): its `num_segments` segments (addresses, sizes, CUDA
 * stream handles, flags: 1 the small pool's, 2 an expandable segment's
 * mapped range) and the `num_blocks` blocks the program holds in them (the
 * ids its events name them by, addresses, sizes, the sizes asked for,
 * flags: 1 freed and held for another stream). The daemon's autotuner
 * predicts a switch from it. Returns 0; -1 on error (more than 4096
 * segments or 16384 blocks: the daemon's message limit). */
ALLOCD_API int allocd_record_state(allocd_client* c, const uint64_t* segment_addresses,
                                   const uint64_t* segment_sizes,
                                   const uint64_t* segment_streams,
                                   const uint32_t* segment_flags, size_t num_segments,
                                   const uint64_t* block_ids, const uint64_t* block_addresses,
                                   const uint64_t* block_sizes,
                                   const uint64_t* block_requested,
                                   const uint32_t* block_flags, size_t num_blocks);
/* An allocation of `requested_bytes` failed; `message` is PyTorch's text.
 * Counted in allocd_session_stats. Any thread. */
ALLOCD_API int allocd_report_oom(allocd_client* c, uint64_t requested_bytes,
                                 const char* message);

/* What the process does with its CUDA memory that an allocator config must
 * not break (allocd.proto JobFeatures; docs/compatibility.md), as bits. */
#define ALLOCD_FEATURE_CUDA_IPC 1u          /* a CUDA tensor went to another process */
#define ALLOCD_FEATURE_CUDA_GRAPHS 2u       /* a CUDA graph was captured */
#define ALLOCD_FEATURE_MEM_POOL 4u          /* a torch.cuda.MemPool was allocated from */
#define ALLOCD_FEATURE_NCCL_REGISTRATION 8u /* NCCL registers the allocator's segments */
/* The process uses `features` (ALLOCD_FEATURE_* bits) from now on: the ones
 * it did not report yet go to the daemon at once, and its autotuner leaves
 * out the configs that would break them. Any thread; cheap when nothing is
 * new. Returns 0; -1 for bits it does not know. */
ALLOCD_API int allocd_report_features(allocd_client* c, uint32_t features);

#ifdef __cplusplus
}

namespace allocd {
class DaemonClient;
/* A handle on a client that the caller keeps owning (the interposer's
 * session of a device): allocd_disconnect frees only the handle. */
allocd_client* BorrowClient(DaemonClient* client);
}  // namespace allocd
#endif

#endif /* ALLOCD_CLIENT_CAPI_ALLOCD_CLIENT_H_ */
