#include "tools/allocd/replay_command.h"

#include <optional>
#include <ostream>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "allocator/config_check.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_writer.h"
#include "nlohmann/json.hpp"
#include "tools/allocd/common.h"
#include "tools/allocd/partial_report.h"

namespace allocd {
namespace {

struct Setup {
  AllocatorConfig config;
  ReplayOptions replay;
};

absl::StatusOr<Setup> MakeSetup(const ReplayCommandOptions& options) {
  Setup setup;
  absl::StatusOr<AllocatorConfig> config = ParseAllocatorConfig(options.config);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--config '%s' is not a valid PYTORCH_CUDA_ALLOC_CONF: %s "
        "(try: allocd check-config '%s')",
        options.config, ConfigRejection(options.config, config.status()),
        options.config));
  }
  setup.config = *config;
  absl::StatusOr<uint64_t> capacity = ParseSizeFlag(
      "--capacity", options.capacity,
      {.no_percent_reason =
           "a snapshot does not record its GPU's memory, so replay has no "
           "device to take it of"});
  if (!capacity.ok()) return capacity.status();
  setup.replay.capacity = *capacity;
  setup.replay.total_memory = *capacity;
  if (options.memory_fraction) {
    const double f = *options.memory_fraction;
    if (!(f > 0.0 && f <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--memory-fraction %g must be in (0, 1]", f));
    }
    if (options.capacity.empty()) {
      return absl::InvalidArgumentError(
          "--memory-fraction needs --capacity: the device's total memory, "
          "which the fraction is taken of");
    }
    setup.replay.memory_fraction = f;
  }
  return setup;
}

double Ratio(int64_t a, int64_t b) {
  return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
}

void PrintJson(const Trace& trace, const Setup& setup, const ReplayResult& r,
               std::ostream& out) {
  nlohmann::json j = {
      {"config", FormatAllocatorConfig(setup.config)},
      {"capacity", setup.replay.capacity},
      {"memory_fraction", setup.replay.memory_fraction
                              ? nlohmann::json(*setup.replay.memory_fraction)
                              : nlohmann::json(nullptr)},
      {"device", trace.device},
      {"peak_reserved", r.peak_reserved},
      {"peak_allocated", r.peak_allocated},
      {"peak_requested", r.peak_requested},
      {"reserved_allocated_ratio", Ratio(r.peak_reserved, r.peak_allocated)},
      {"num_device_alloc", r.num_device_alloc},
      {"num_device_free", r.num_device_free},
      {"num_alloc_retries", r.num_alloc_retries},
      {"num_ooms", r.num_ooms},
      {"num_sync_all_streams", r.num_sync_all_streams},
      {"first_oom_event", r.first_oom_event ? nlohmann::json(*r.first_oom_event)
                                            : nlohmann::json(nullptr)},
      {"events", r.events},
      {"replay_seconds", r.seconds},
      {"estimated", r.estimated},
      {"partial", PartialTraceJson(trace)},
  };
  out << j.dump(2) << "\n";
}

void PrintHuman(const ReplayCommandOptions& options, const Trace& trace,
                const Setup& setup, const ReplayResult& r, std::ostream& out) {
  const std::string config = FormatAllocatorConfig(setup.config);
  out << absl::StrFormat("trace              %s (device %d, %d events)\n",
                         options.trace_path, trace.device, trace.events.size());
  out << absl::StrFormat("config             %s\n",
                         config.empty() ? "(PyTorch defaults)" : config);
  out << absl::StrFormat(
      "capacity           %s\n",
      setup.replay.capacity == 0 ? "unlimited"
                                 : FormatSize(setup.replay.capacity));
  if (setup.replay.memory_fraction) {
    out << absl::StrFormat(
        "memory fraction    %g (limit %s)\n", *setup.replay.memory_fraction,
        FormatSize(static_cast<uint64_t>(*setup.replay.memory_fraction *
                                         static_cast<double>(setup.replay.capacity))));
  }
  absl::StatusOr<AllocatorConfig> recorded =
      ParseAllocatorConfig(trace.recorded_config);
  out << PartialTraceText(
      trace, !recorded.ok() || FormatAllocatorConfig(*recorded) != config);
  out << absl::StrFormat("peak reserved      %s (%d bytes)\n",
                         FormatSize(r.peak_reserved), r.peak_reserved);
  out << absl::StrFormat("peak allocated     %s (%d bytes)\n",
                         FormatSize(r.peak_allocated), r.peak_allocated);
  out << absl::StrFormat("reserved/allocated %.3f\n",
                         Ratio(r.peak_reserved, r.peak_allocated));
  out << absl::StrFormat("device allocs      %d\n", r.num_device_alloc);
  out << absl::StrFormat("device frees       %d\n", r.num_device_free);
  out << absl::StrFormat("alloc retries      %d (cache flushes with a sync of all streams: %d)\n",
                         r.num_alloc_retries, r.num_sync_all_streams);
  if (r.first_oom_event) {
    out << absl::StrFormat("OOMs               %d (first at event %d of %d)\n",
                           r.num_ooms, *r.first_oom_event, trace.events.size());
  } else {
    out << "OOMs               0\n";
  }
  out << absl::StrFormat("replay             %.3f s (%.1f M events/s)\n",
                         r.seconds,
                         r.seconds > 0 ? r.events / r.seconds / 1e6 : 0.0);
  if (r.estimated) {
    out << "note               backend:cudaMallocAsync uses the CUDA driver's "
           "pool, not PyTorch's rules:\n"
           "                   these numbers are a model's estimate\n";
  }
}

}  // namespace

int RunReplay(const ReplayCommandOptions& options, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<Setup> setup = MakeSetup(options);
  if (!setup.ok()) {
    err << "allocd replay: " << setup.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<Trace> trace = LoadTrace(options.trace_path, options.device);
  if (!trace.ok()) {
    err << "allocd replay: " << trace.status().message() << "\n";
    return 1;
  }
  std::optional<SnapshotRecorder> recorder;
  if (!options.export_snapshot.empty()) {
    if (setup->config.backend == AllocatorBackend::kCudaMallocAsync) {
      err << "allocd replay: --export-snapshot needs the native allocator: "
             "backend:cudaMallocAsync is replayed as an estimate, without "
             "blocks or segments\n";
      return 1;
    }
    setup->replay.observer = &recorder.emplace(*trace, setup->config);
  }
  absl::StatusOr<ReplayResult> result =
      Replay(*trace, setup->config, setup->replay);
  if (!result.ok()) {
    err << "allocd replay: " << result.status().message() << "\n";
    return 1;
  }
  if (recorder) {
    if (absl::Status s =
            WriteSnapshotFile(options.export_snapshot, recorder->Pickle());
        !s.ok()) {
      err << "allocd replay: --export-snapshot: " << s.message() << "\n";
      return 1;
    }
  }
  if (options.json) {
    PrintJson(*trace, *setup, *result, out);
  } else {
    PrintHuman(options, *trace, *setup, *result, out);
  }
  if (recorder) {
    // Not on stdout under --json, which must stay one JSON object.
    (options.json ? err : out) << absl::StrFormat(
        "snapshot written to %s; open it in PyTorch's memory viewer:\n"
        "  python -m torch.cuda._memory_viz trace_plot %s -o out.html\n"
        "  or drag it into https://pytorch.org/memory_viz\n",
        options.export_snapshot, options.export_snapshot);
  }
  return 0;
}

}  // namespace allocd
