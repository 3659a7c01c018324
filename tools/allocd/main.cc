// allocd: the command line. Each subcommand lives in its own file; this one
// only parses arguments.
#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "client/client_env.h"
#include "proto/protocol.h"
#include "tools/common/cli.h"
#include "tools/allocd/check_config_command.h"
#include "tools/allocd/replay_command.h"
#include "tools/allocd/run_command.h"
#include "tools/allocd/tune_command.h"
#ifdef ALLOCD_WITH_SERVER
#include "tools/allocd/client_replay_command.h"
#include "tools/allocd/serve_command.h"
#include "server/autotune/start_config.h"
#endif

namespace {

constexpr const char* kDescription =
    "allocd: PyTorch CUDA caching-allocator replay and tuning.\n"
    "\n"
    "Replays a torch.cuda.memory._snapshot() pickle through an exact model of\n"
    "PyTorch's caching allocator, so you can see what a PYTORCH_CUDA_ALLOC_CONF\n"
    "would have cost your job without running it on a GPU.";

void AddReplay(CLI::App& app, allocd::ReplayCommandOptions& options,
               std::optional<double>& fraction) {
  CLI::App* replay = app.add_subcommand(
      "replay",
      "Replay a memory snapshot under a config and print peak reserved and\n"
      "allocated memory, device allocs/frees, retries and OOMs, as PyTorch\n"
      "would report them.");
  replay->add_option("TRACE", options.trace_path,
                     "snapshot pickle from torch.cuda.memory._snapshot() "
                     "(.pickle or .pickle.gz), recorded with "
                     "_record_memory_history(enabled='all')")
      ->required();
  replay->add_option("--config,-c", options.config,
                     "PYTORCH_CUDA_ALLOC_CONF to replay under (default: "
                     "PyTorch's defaults)");
  replay->add_option("--capacity", options.capacity,
                     "device memory the job can use: 80GB, 79.1GiB, 80Gi, "
                     "84465090560B (default: unlimited). With "
                     "--memory-fraction: the device's total memory")
      ->check(allocd::SizeSyntax());
  replay->add_option("--memory-fraction", fraction,
                     "torch.cuda.set_per_process_memory_fraction(F): caps "
                     "reserved memory at F x --capacity; only then does "
                     "garbage_collection_threshold act");
  replay->add_option("--device", options.device,
                     "which device's trace to replay (default: the only one "
                     "with events)");
  replay->add_flag("--json", options.json, "print one JSON object");
  replay->add_option("--export-snapshot", options.export_snapshot,
                     "also write the replay as a snapshot pickle (OUT.pickle; "
                     "gzipped if OUT ends in .gz) for PyTorch's memory viewer: "
                     "python -m torch.cuda._memory_viz trace_plot OUT.pickle "
                     "-o out.html, or https://pytorch.org/memory_viz");
}

void AddRun(CLI::App& app, allocd::RunCommandOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run",
      "Run a command in transparent managed mode: PyTorch's own caching\n"
      "allocator, unchanged, on GPU memory from the node's allocd daemon\n"
      "(liballocd_interpose.so preloaded). memory_stats(), snapshots,\n"
      "torch.OutOfMemoryError, CUDA graphs and torch.compile work as\n"
      "natively; without a daemon the command runs natively with a warning.\n"
      "Memory the daemon has not cached is made by the process itself and\n"
      "counted by the daemon (ALLOCD_CLIENT_CREATES=0: the daemon makes it).\n"
      "A Python script is tuned as with allocd.enable(), with no `import\n"
      "allocd`: once it imports torch, the allocd package streams its\n"
      "allocations to the daemon's autotuner and applies the configs pushed\n"
      "(allocd's sitecustomize.py first on PYTHONPATH, which runs the\n"
      "script's own after it; ALLOCD_AUTOSTART=0: off). The allocd package\n"
      "is the job's Python's, else the one this program came with.\n"
      "  allocd run --job llama -- python train.py");
  run->add_option("--socket", o.socket,
                  std::string("the daemon's socket (default: $ALLOCD_SOCKET, "
                              "else ") + allocd::kDefaultSocket + ")");
  run->add_option("--job", o.job,
                  "job label: picks the configs the daemon pushes "
                  "(default: $ALLOCD_JOB)");
  run->add_option("--read-ahead-ms", o.read_ahead_ms,
                  "read the next segments' chunks ahead from the daemon's "
                  "cache while PyTorch maps the current one, from the second "
                  "same-size cudaMalloc in a row, and keep them this long "
                  "for it (default: "
                  "$ALLOCD_READ_AHEAD_MS, else 200; 0: off). What is not "
                  "taken goes back then, or at once when another job on "
                  "the GPU is short")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--handover-ms", o.handover_ms,
                  "map the segments this job's last run held (the daemon "
                  "remembers them by --job and GPU) from the daemon's cache "
                  "while the command starts, so its cudaMallocs find them "
                  "mapped; keep those not taken this long after the last "
                  "one taken, or 60 s if it asks for none (default: "
                  "$ALLOCD_HANDOVER_MS, else 30000; 0: off). Only memory the "
                  "daemon had cached is used, and it goes back at once when "
                  "another job on the GPU is short")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--features", o.features,
                  "what the job will do with its CUDA memory, declared before "
                  "it does, comma-separated, of: " + allocd::JobFeatureNames() +
                      " (cuda_ipc: it shares CUDA tensors with other "
                      "processes); no start config or push that would break "
                      "them is chosen (default: $ALLOCD_FEATURES)");
  run->add_option("--interposer", o.interposer,
                  "liballocd_interpose.so to preload (default: found next to "
                  "this program, or in $ALLOCD_LIB_DIR)");
  run->add_option("command", o.command, "the command and its arguments")
      ->required();
  run->prefix_command();
}

void AddTune(CLI::App& app, allocd::TuneCommandOptions& o) {
  CLI::App* tune = app.add_subcommand(
      "tune",
      "Find the PYTORCH_CUDA_ALLOC_CONF (and, where it pays, the memory\n"
      "fraction) that fits a job best, by replaying its snapshot under\n"
      "candidates: a coarse sweep of every knob, then local refinement.");
  tune->add_option("TRACE", o.trace_path, "snapshot pickle (.pickle or .pickle.gz)")
      ->required();
  tune->add_option("--capacity", o.capacity,
                   "device memory the job can use, e.g. 80GB, 84465090560B, "
                   "or 95% of --total-memory (default: unlimited)")
      ->check(allocd::SizeSyntax());
  tune->add_option("--total-memory", o.total_memory,
                   "the device's total memory, the base of memory fractions "
                   "and percentages, e.g. 80GB; at least the trace's peak "
                   "(default: --capacity)")
      ->check(allocd::SizeSyntax());
  tune->add_option("--objective", o.objective,
                   "peak: least peak reserved with no OOM (default); capacity: "
                   "smallest device memory the job fits in; device-allocs: "
                   "fewest cudaMalloc/cudaFree within --memory-budget")
      ->check(CLI::IsMember({"peak", "capacity", "device-allocs"}));
  tune->add_option("--space", o.space,
                   "restrict or widen the search space, e.g. "
                   "'max_split_size_mb=64..1024,expandable_segments=True|False,"
                   "roundup_power2_divisions=1|4|[256:1,>:8]'");
  tune->add_option("--budget", o.budget, "most candidate configs to evaluate (default 200)");
  tune->add_option("--jobs,-j", o.jobs, "parallel replays (default: every core)");
  tune->add_option("--max-retries", o.max_retries,
                   "allow this many cache flushes (each syncs all streams) in a "
                   "recommendation (default 0)");
  tune->add_option("--max-call-ratio", o.max_call_ratio,
                   "at most this many times the cudaMalloc/cudaFree calls of "
                   "PyTorch's defaults (each can sync the device); 0: no limit "
                   "(default 2)");
  tune->add_option("--max-peak-ratio", o.max_peak_ratio,
                   "at most this many times the peak reserved memory of "
                   "PyTorch's defaults at --capacity; 0: no limit (default 1)");
  tune->add_option("--cap-threshold", o.cap_threshold_percent,
                   "recommend a memory fraction (a hard cap) only when it saves "
                   "this many percent more than the best config without one "
                   "(default 5)");
  tune->add_option("--memory-budget", o.memory_budget,
                   "device-allocs objective: peak reserved allowed, e.g. 20GB "
                   "or 50% of --total-memory (default: --capacity)")
      ->check(allocd::SizeSyntax());
  tune->add_option("--device", o.device, "which device's trace (default: the only one)");
  tune->add_option("--top", o.top, "rows in the ranked table (default 10)");
  tune->add_option("--report", o.report_dir,
                   "also write an HTML/SVG report into this directory: "
                   "index.html (self-contained) and timeline.svg, "
                   "fragmentation.svg, landscape.svg");
  tune->add_flag("--json", o.json, "print one JSON object");
  tune->add_flag("--force", o.force,
                 "tune a partial snapshot even when the memory live at its "
                 "first event cannot be reconstructed");
  tune->footer(allocd::ExitStatusHelp(
      "  3: no candidate config fits (no recommendation)\n"));
}

#ifdef ALLOCD_WITH_SERVER
void AddServe(CLI::App& app, allocd::ServeCommandOptions& o,
              std::vector<uid_t>& admin_uids) {
  allocd::DaemonOptions& d = o.daemon;
  CLI::App* serve = app.add_subcommand(
      "serve",
      "Run the node daemon: hands physical memory to client processes as\n"
      "2 MiB chunks over a Unix socket, shares what one frees with the next,\n"
      "pushes allocator configs, and exports Prometheus metrics. Stops\n"
      "gracefully on SIGTERM/SIGINT.");
  serve->add_option("--socket", d.socket,
                    std::string("clients' gRPC socket, mode 0660; the FD side "
                                "socket is SOCKET.fds (default ") +
                        allocd::kDefaultSocket + ")");
  serve->add_option("--admin-socket", d.admin_socket,
                    "the socket of the Admin service (allocctl), mode 0600; "
                    "the clients' socket refuses Admin calls, root's too "
                    "(default: SOCKET.admin)");
  serve->add_option("--tenancy", o.tenancy,
                    "what a tenant is (no memory, job label or session "
                    "crosses tenants): uid, each Unix user (default); pod, "
                    "each Kubernetes pod (the daemon's pod needs hostPID: "
                    "true); node, one trust domain for every process")
      ->check(CLI::IsMember({"uid", "pod", "node"}));
  serve->add_option("--cross-tenant-reuse", o.cross_tenant_reuse,
                    "how one tenant's cached memory goes to another: "
                    "recreate, destroyed and created again (the only mode: "
                    "safe against a fork child or an FD passed on); scrub "
                    "is no longer offered, and re-creates too, with a notice "
                    "at start")
      ->check(CLI::IsMember({"recreate", "scrub"}));
  serve->add_option("--admin-group", d.admin_group,
                    "a group (name or gid) whose members may administer: the "
                    "admin socket becomes theirs, mode 0660");
  serve->add_option("--metrics-addr", d.metrics_address,
                    "HOST:PORT for Prometheus /metrics (default "
                    "127.0.0.1:9464; '' disables)");
  serve->add_option("--backend", d.backend,
                    "auto: every GPU the driver sees, a pool each, else sim "
                    "with a notice (default); cuda: every GPU, or fail; sim: "
                    "memfd chunks, no GPU")
      ->check(CLI::IsMember({"auto", "sim", "cuda"}));
  serve->add_option("--sim-devices", d.sim_devices,
                    "sim devices, a pool each, named SIM-GPU-0.. (default 1)")
      ->check(CLI::Range(1, 1024));
  serve->add_option("--capacity", o.capacity,
                    "most memory each device's pool hands out, e.g. 70GiB, "
                    "or 90% of the GPU (default: a GPU's free memory at start "
                    "minus --headroom; 8GiB per sim device)")
      ->check(allocd::SizeSyntax());
  serve->add_option("--headroom", d.headroom,
                    "GPU memory the daemon leaves free for the CUDA "
                    "contexts, kernels and libraries' own buffers of the "
                    "processes on it: the default capacity is free memory at "
                    "start minus this, and no chunk is ever created that "
                    "would leave less free; e.g. 2GiB or 5%, 0 for no check "
                    "(default 1GiB)")
      ->check(allocd::SizeSyntax());
  serve->add_option("--trim-after", o.trim_after,
                    "cached chunks not reused for this long go back to the "
                    "device, so an idle node holds no GPU memory: 30s, 5m, "
                    "1h, inf (default 5m)");
  serve->add_option("--cache-high-water", o.cache_high_water,
                    "cached chunks of a GPU above this size go back to it at "
                    "once, e.g. 16GiB (default: no limit)");
  serve->add_option("--adopt-window", o.adopt_window,
                    "after a restart, new memory waits up to this long for "
                    "the clients of the daemon before to re-declare the "
                    "chunks they still hold; ends early when all are back "
                    "(default 5s)");
  serve->add_option("--config", d.config_file,
                    "JSON file of allocator configs per job and uid and "
                    "tenant quotas: "
                    "{\"default\": \"...\", \"jobs\": {\"name\": \"...\"}, "
                    "\"uid_quotas\": {\"1000\": \"20GiB\"}, "
                    "\"tenant_quotas\": {\"pod:<pod UID>\": \"40GiB\"}}");
  serve->add_option("--default-tenant-quota", d.default_tenant_quota,
                    "what the sessions of a tenant without a quota of its "
                    "own may hold together on one GPU, e.g. 40GiB or 25% of "
                    "the smallest GPU pool (default: none; on a node of one "
                    "tenant a default would only cut its one job, so set it "
                    "where several tenants share the GPUs)")
      ->check(allocd::SizeSyntax());
  serve->add_option("--state-dir", o.state_dir,
                    "where the daemon keeps what it learns across restarts "
                    "(the autotuner's learned configs); default "
                    "/var/lib/allocd on a GPU (in memory only, with a "
                    "warning, where it cannot be written), in memory only on "
                    "a sim daemon; '' keeps them in memory only");
  serve->add_option("--admin-uid", admin_uids,
                    "uids allowed to administer besides root and the "
                    "daemon's own, through a POSIX ACL on the admin socket "
                    "(repeatable)");
  allocd::AutotuneOptions& a = d.autotune;
  serve->add_option("--autotune", o.autotune_mode,
                    "off: no autotuning; recommend: replay each job's allocation "
                    "stream under candidate configs and show the better one "
                    "(allocctl autotune history), push nothing (default); apply: "
                    "push it, to one session first, rolling back on a NACK, an "
                    "OOM, or when the steps after the push reserve more than a "
                    "replay of staying on those same events and a rollback is "
                    "predicted to leave the job lower; a push kept is learned "
                    "for the job's next run (--state-dir)")
      ->check(CLI::IsMember({"off", "recommend", "apply"}));
  a.prior = allocd::PriorSetting{};  // learned, then the seed
  serve->add_option_function<std::string>(
         "--autotune-prior",
         [&a](const std::string& flag) {
           // Its kind and config: the seed is --autotune-seed-prior's.
           const allocd::PriorSetting prior = *allocd::ParsePriorSetting(flag);
           a.prior.kind = prior.kind;
           a.prior.config = prior.config;
         },
         "what a job in apply mode without a learned config starts on, "
         "decided before its first allocation: learned (default): the config "
         "at least 3 learned configs of its tenant's jobs, else of the "
         "node's, agree on, else the seed (--autotune-seed-prior); or a fixed "
         "PYTORCH_CUDA_ALLOC_CONF. Then a start "
         "config known to be harmful (max_split_size_mb <= 128 without "
         "expandable segments) is replaced too: by the prior, else by itself "
         "without max_split_size_mb and with expandable_segments:True. A "
         "job's first decision returns it to its own config when staying on "
         "it would have peaked lower. off: only a learned config is handed "
         "(no seed either), a harmful start config is pushed away at the "
         "job's first steps")
      ->check(CLI::Validator(
          [](std::string& flag) {
            absl::StatusOr<allocd::PriorSetting> prior = allocd::ParsePriorSetting(flag);
            return prior.ok() ? std::string() : std::string(prior.status().message());
          },
          "learned|off|CONFIG"));
  serve->add_option_function<std::string>(
         "--autotune-seed-prior",
         [&a](const std::string& flag) { a.prior.seed = *allocd::ParseSeedPrior(flag); },
         "with --autotune-prior learned, what a job starts on while no 3 "
         "learned configs agree (a fresh node): a job started on its own "
         "config runs it until its first decision, and the segments cut in "
         "those first steps stay. Default expandable_segments:True (the best "
         "config of every job measured); a job whose own config already "
         "holds it keeps its own, and one that declares CUDA IPC "
         "(ALLOCD_FEATURES=cuda_ipc) is not started on expandable segments; "
         "off: such jobs start on their own")
      ->check(CLI::Validator(
          [](std::string& flag) {
            absl::StatusOr<std::optional<std::string>> seed = allocd::ParseSeedPrior(flag);
            return seed.ok() ? std::string() : std::string(seed.status().message());
          },
          "off|CONFIG"));
  serve->add_option("--autotune-threads", a.threads,
                    "threads replaying windows (default 1)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--autotune-nice", a.nice,
                    "niceness added to those threads (default 10)")
      ->check(CLI::Range(0, 19));
  serve->add_option("--autotune-window-events", a.window_events,
                    "allocation events kept per job, the daemon's memory bound "
                    "(default 1048576, ~32 bytes each)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--autotune-first-pass-events", a.first_pass_min_events,
                    "a job's first decision waits for this many events (and "
                    "two steps) in its window (default 2000); set it to a "
                    "whole training step or more for jobs whose first steps "
                    "differ from the rest")
      ->check(CLI::PositiveNumber);
  serve->add_option("--autotune-min-saving", a.min_saving,
                    "propose a config only if it saves at least this fraction "
                    "of the predicted peak reserved (default 0.05)")
      ->check(CLI::Range(0.0, 1.0));
  serve->add_option("--autotune-memory", o.autotune_memory,
                    "most memory the autotuner's windows hold together; a "
                    "window past it, or past its tenant's share, keeps its "
                    "newest events only, or stops recording (logged) "
                    "(default 256MiB, inside the DaemonSet's 1Gi limit)")
      ->check(allocd::SizeSyntax());
  serve->add_option("--autotune-memory-per-tenant",
                    o.autotune_memory_per_tenant,
                    "a tenant's share of --autotune-memory (default: a "
                    "quarter of it; all of it under --tenancy node)")
      ->check(allocd::SizeSyntax());
  // Limits: no tenant takes what the others need, no peer stalls or bloats
  // the daemon. A count of 0: no bound.
  serve->add_option("--max-sessions-per-tenant",
                    d.session_limits.sessions.per_tenant,
                    "sessions (client processes, one per GPU each) one "
                    "tenant may have (default 1024)");
  serve->add_option("--max-sessions", d.session_limits.sessions.total,
                    "sessions of all tenants together (default 4096)");
  serve->add_option("--max-unleased-sessions-per-tenant",
                    d.session_limits.unleased.per_tenant,
                    "registrations of one tenant still waiting for their "
                    "lease (each waits out the lease grace); more are "
                    "refused (default 64)");
  serve->add_option("--max-unleased-sessions",
                    d.session_limits.unleased.total,
                    "the same, of all tenants together (default 256)");
  serve->add_option("--max-connections-per-tenant", d.connections.per_tenant,
                    "connections one tenant may hold to the client socket, "
                    "and to the side socket, each (default 2048)");
  serve->add_option("--max-connections", d.connections.total,
                    "the same, of all tenants together (default 8192)");
  serve->add_option_function<double>(
      "--accept-rate-per-uid",
      [&d](double rate) {
        d.accept_rate = {.per_second = rate, .burst = 4 * rate};
      },
      "connections one uid may open per second to the client socket, and "
      "to the side socket, each, past a burst of four times as many; more "
      "are closed at once (default 256; 0: no bound)")
      ->check(CLI::NonNegativeNumber);
}

void AddClientReplay(CLI::App& app, allocd::ClientReplayCommandOptions& o) {
  CLI::App* c = app.add_subcommand(
      "client-replay",
      "Replay a snapshot as a live client of `allocd serve`: segments from\n"
      "daemon chunks (mapped and written), telemetry, config pushes applied\n"
      "and ACKed, reclaim requests answered. For load tests and demos.\n"
      "SIGINT or SIGTERM stops it at the next safe point (512 events) with\n"
      "the report of what ran, exit status 0.");
  c->add_option("TRACE", o.trace_path, "snapshot pickle (.pickle or .pickle.gz)")
      ->required();
  c->add_option("--socket", o.socket,
                std::string("the daemon's socket (default ") +
                    allocd::kDefaultSocket + ")");
  c->add_option("--job", o.job, "job label: picks the config the daemon pushes");
  c->add_option("--config,-c", o.config,
                "PYTORCH_CUDA_ALLOC_CONF to start with (default: PyTorch's)");
  c->add_option("--device", o.device, "which device's trace (default: the only one)");
  c->add_option("--gpu", o.gpu_uuid,
                "the daemon's GPU to take memory from, by UUID, as a rank of "
                "a job of several runs on its own GPU (a sim daemon's are "
                "SIM-GPU-0, SIM-GPU-1, ...; default: the daemon's first)");
  c->add_option("--loop", o.loops, "replay the trace N times (default 1)")
      ->check(CLI::PositiveNumber);
  c->add_option("--duration", o.duration_seconds,
                "replay again and again for this many seconds, then stop, "
                "even in the middle of the trace (overrides --loop)")
      ->check(CLI::PositiveNumber);
  c->add_option("--speed", o.speed,
                "pace the events at the trace's own times (time_us) divided "
                "by X: 1 is the job's real rate, 2 twice as fast (default: as "
                "fast as it can, which outruns a real job's event stream)")
      ->check(CLI::Range(0.001, 1000.0));
  c->add_option("--pin", o.pinned_keys,
                "a config key the daemon's autotuner must never change "
                "(repeatable), e.g. expandable_segments");
  c->add_option("--autotune-mode", o.autotune_mode,
                "this job's autotune mode, unless an admin set one")
      ->check(CLI::IsMember({"off", "recommend", "apply"}));
  c->add_flag("--json", o.json, "print one JSON object");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, "allocd"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "allocd 0.1.0");
  app.footer(allocd::ExitStatusHelp());
  // Global flags, also accepted before the subcommand; each subcommand
  // that uses one has its own (tools/common/cli.h).
  bool global_json = false;
  std::string global_socket;
  app.add_flag("--json", global_json,
               "print one JSON object (replay, tune, check-config, "
               "client-replay)");
  app.add_option("--socket", global_socket,
                 "the daemon's socket (serve, client-replay)");

  allocd::ReplayCommandOptions replay_options;
  std::optional<double> fraction;
  AddReplay(app, replay_options, fraction);

  allocd::TuneCommandOptions tune_options;
  AddTune(app, tune_options);

  std::string conf;
  bool check_json = false;
  CLI::App* check = app.add_subcommand(
      "check-config",
      "Say whether PyTorch 2.11 accepts a PYTORCH_CUDA_ALLOC_CONF, explain\n"
      "each key, and suggest a fix for near misses. Exit 1 if rejected.");
  check->add_option("CONFIG", conf, "the config string, e.g. "
                                    "'max_split_size_mb:128,expandable_segments:True'")
      ->required();
  check->add_flag("--json", check_json, "print one JSON object");

#ifdef ALLOCD_WITH_SERVER
  allocd::ServeCommandOptions serve_options;
  std::vector<uid_t> admin_uids;
  AddServe(app, serve_options, admin_uids);
  allocd::ClientReplayCommandOptions client_replay_options;
  AddClientReplay(app, client_replay_options);
#endif

  allocd::RunCommandOptions run_options;
  AddRun(app, run_options);

  if (std::optional<int> exit_code =
          allocd::ParseCommandLine(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }

  if (app.got_subcommand("run")) {
    return allocd::RunUnderAllocd(run_options, std::cerr);
  }

#ifdef ALLOCD_WITH_SERVER
  if (app.got_subcommand("serve")) {
    serve_options.daemon.admin_uids = admin_uids;
    if (app.get_subcommand("serve")->count("--state-dir") > 0) {
      serve_options.daemon.state_dir = serve_options.state_dir;
    }
    serve_options.daemon.tenancy =
        *allocd::ParseTenancy(serve_options.tenancy);
    serve_options.daemon.autotune.default_policy.mode =
        *allocd::ParseAutotuneMode(serve_options.autotune_mode);
    return allocd::RunServe(serve_options, std::cerr);
  }
  if (app.got_subcommand("client-replay")) {
    return allocd::RunClientReplay(client_replay_options, std::cout, std::cerr);
  }
#endif

  if (app.got_subcommand("replay")) {
    replay_options.memory_fraction = fraction;
    return allocd::RunReplay(replay_options, std::cout, std::cerr);
  }
  if (app.got_subcommand("tune")) {
    return allocd::RunTune(tune_options, std::cout, std::cerr);
  }
  return allocd::RunCheckConfig(conf, check_json, std::cout);
}
