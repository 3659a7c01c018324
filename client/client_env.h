// ClientEnv: the environment a client process is configured by, in one
// place: the variables' names, their defaults, and how they are read.
// `allocd run` and the Python package write them for the program they
// start; the interposer reads them when PyTorch first asks for memory.
// A new variable is a name below, a field, and its line in
// FromEnvironment().
#ifndef ALLOCD_CLIENT_CLIENT_ENV_H_
#define ALLOCD_CLIENT_CLIENT_ENV_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocd.pb.h"
#include "proto/protocol.h"

namespace allocd {

// The variables' names.
namespace env {
// The daemon's socket (default kDefaultSocket).
inline constexpr char kSocket[] = "ALLOCD_SOCKET";
// The job label that picks the configs the daemon pushes.
inline constexpr char kJob[] = "ALLOCD_JOB";
// The job's autotune preferences as JSON (ParseAutotunePreferences).
inline constexpr char kAutotune[] = "ALLOCD_AUTOTUNE";
// "1" (set by `allocd run`): the Python package starts in the program, and
// marks its optimizer steps; "0": the program starts it itself.
inline constexpr char kAutostart[] = "ALLOCD_AUTOSTART";
// The managed mode allocd.enable() picks: transparent or engine.
inline constexpr char kMode[] = "ALLOCD_MODE";
// How long grants read ahead for the next cudaMallocs of a size are kept
// (GrantReadAhead), in milliseconds; 0: none.
inline constexpr char kReadAheadMs[] = "ALLOCD_READ_AHEAD_MS";
// How long the segments of the job's last session, handed over at connect,
// are kept after the last one taken (WorkingSetHandover), in milliseconds;
// 0: none.
inline constexpr char kHandoverMs[] = "ALLOCD_HANDOVER_MS";
// "1": chunks the daemon has not cached are made in this process; "0": the
// daemon creates every chunk.
inline constexpr char kClientCreates[] = "ALLOCD_CLIENT_CREATES";
// The job's own config and the learned one it was started on instead
// (StartOnLearnedConfig writes both).
inline constexpr char kInitialAllocConf[] = "ALLOCD_INITIAL_ALLOC_CONF";
inline constexpr char kLearnedAllocConf[] = "ALLOCD_LEARNED_ALLOC_CONF";
// Why the daemon started the job on ALLOCD_LEARNED_ALLOC_CONF: "learned",
// "prior" or "replaced" (LearnedConfigResponse.source).
inline constexpr char kStartConfigSource[] = "ALLOCD_START_CONFIG_SOURCE";
// "1": the interposer prints one line per call on stderr.
inline constexpr char kInterposeVerbose[] = "ALLOCD_INTERPOSE_VERBOSE";
// Where allocd's libraries are, before the places next to the program.
inline constexpr char kLibDir[] = "ALLOCD_LIB_DIR";
// torchrun's, for each rank it starts: the run all its ranks share, the
// rank and the number of ranks. A run id of "none" (torchrun's default
// without --rdzv-id or --standalone) is the same for every such run, so it
// is told apart by the rendezvous address its ranks share.
inline constexpr char kTorchRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kRank[] = "RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
// PyTorch's allocator config, which the process runs.
inline constexpr char kPytorchCudaAllocConf[] = "PYTORCH_CUDA_ALLOC_CONF";
inline constexpr char kPytorchAllocConf[] = "PYTORCH_ALLOC_CONF";
// PyTorch's (ProcessGroupNCCL): set, NCCL registers every segment of the
// caching allocator with its communicators.
inline constexpr char kTorchNcclRegisterHook[] = "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK";
// What the job declares it will do with its CUDA memory, as JobFeatures'
// field names separated by commas ("cuda_ipc"): the daemon then never
// starts it on, or pushes, a config that would break that, before the
// client sees it done (docs/compatibility.md).
inline constexpr char kFeatures[] = "ALLOCD_FEATURES";
}  // namespace env

// What the process's environment says it will do: the features
// ALLOCD_FEATURES declares, and NCCL's registration
// (NcclRegistersSegments). InvalidArgument when ALLOCD_FEATURES names a
// feature JobFeatures does not have.
absl::StatusOr<v1::JobFeatures> DeclaredFeatures();
// The features ALLOCD_FEATURES may name (JobFeatures' fields), as
// "cuda_ipc, cuda_graphs, ...".
std::string JobFeatureNames();

// Whether TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK is on, as PyTorch's
// getCvarBool reads it: the process's registration says so
// (JobFeatures.nccl_registration) before it makes a process group.
bool NcclRegistersSegments();

// The run id a rank reports for torchrun's `run_id` and rendezvous address
// `master_addr`:`master_port`: "" for none; "none" qualified by the
// address ("none/ADDR:PORT"), which two runs on one node cannot share at
// once. Bytes the daemon does not take in a run id ([A-Za-z0-9_.:/-])
// become '_', and it is cut to 128 bytes.
std::string JobRunId(const std::string& run_id, const std::string& master_addr,
                     const std::string& master_port);

// `socket`, or kDefaultSocket when it is empty: what the C ABI's callers
// pass for "the default", and an empty ALLOCD_SOCKET.
std::string SocketOrDefault(const std::string& socket);

struct ClientEnv {
  std::string socket = kDefaultSocket;
  std::string job;
  // JSON, as ParseAutotunePreferences takes it; "" is no preference.
  std::string autotune;
  bool autostart = false;
  // On an H100 the read-ahead took a 40 GiB working set's first round from
  // 2.7x to 1.7x native's cudaMalloc time on a cold pool (the process making
  // the chunks) and from 2.2x to 1.6x warm (medians of 3,
  // bench/gpu/results/transparent, seventh session); what it holds is
  // budget or cached chunks, given back after this long or at once when
  // another job is short.
  absl::Duration read_ahead = absl::Milliseconds(200);
  absl::Duration handover = absl::Milliseconds(30000);
  bool client_creates = true;
  // The config the job starts with as its own (where a rollback returns),
  // and the learned one it started on instead: empty unless `allocd run`
  // started it on that and the program has not changed
  // PYTORCH_CUDA_ALLOC_CONF since.
  std::string initial_config;
  std::string started_on_learned;
  // The process's place in a job of several (RegisterRequest.rank): its
  // run id (JobRunId), RANK and WORLD_SIZE; world_size 0 when WORLD_SIZE
  // is unset. The daemon's autotuner decides a run's ranks together, and
  // ranks without a run id by their shared label.
  std::string run_id;
  uint32_t rank = 0;
  uint32_t world_size = 0;

  // The process's environment, each variable unset taking the default
  // above. InvalidArgument naming the variable when one holds no value it
  // can have.
  static absl::StatusOr<ClientEnv> FromEnvironment();
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CLIENT_ENV_H_
