// Is a replay's drift from a real run in PyTorch's rules or in the segment
// addresses? Replays a snapshot under a config three ways: at the
// simulator's addresses (what `allocd replay` does), at the addresses the
// recorded run's driver gave every segment, and at those of its 2 MiB
// small-pool segments only. Run it on a snapshot recorded under the same
// config (and fraction) as the run whose numbers you compare: if the replay
// at the recorded addresses gives PyTorch's memory_stats() and asked for no
// segment the run did not make ("unmatched 0"), the rules are exact and the
// drift is the address model.
//   build/release/bench/fidelity_probe SNAPSHOT [CONFIG] [FRACTION TOTAL_BYTES]
// e.g. fidelity_probe gc.pickle.gz garbage_collection_threshold:0.6 0.2 85017493504
#include <cstdio>
#include <cstdlib>
#include <string>

#include "allocator/config.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "tests/trace/recorded_address_backend.h"

int main(int argc, char** argv) {
  using namespace allocd;
  if (argc != 2 && argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: %s SNAPSHOT [CONFIG] [FRACTION TOTAL_BYTES]\n", argv[0]);
    return 2;
  }
  absl::StatusOr<Trace> trace = ReadSnapshotFile(argv[1]);
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<AllocatorConfig> config =
      ParseAllocatorConfig(argc >= 3 ? argv[2] : trace->recorded_config);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  ReplayOptions options;
  size_t total = 0;
  if (argc == 5) {
    options.memory_fraction = std::strtod(argv[3], nullptr);
    total = std::strtoull(argv[4], nullptr, 10);
  }
  std::printf("%zu recorded segments; config '%s'\n", trace->recorded_segments.size(),
              FormatAllocatorConfig(*config).c_str());
  std::printf("%-28s %9s %9s %7s %16s %10s\n", "addresses", "allocs", "frees", "retries",
              "peak reserved", "unmatched");
  for (const size_t only_size : {size_t{1}, size_t{0}, size_t{2} << 20}) {
    // only_size 1 matches no segment: every address is the simulator's.
    RecordedAddressBackend backend(*trace, total, total, only_size);
    options.device = total != 0 ? &backend : nullptr;
    RecordedAddressBackend unlimited(*trace, ~size_t{0} >> 1, 0, only_size);
    if (total == 0) options.device = &unlimited;
    absl::StatusOr<ReplayResult> r = Replay(*trace, *config, options);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    const RecordedAddressBackend& used = total != 0 ? backend : unlimited;
    std::printf("%-28s %9ld %9ld %7ld %16ld %10s\n",
                only_size == 1   ? "simulated"
                : only_size == 0 ? "recorded, every segment"
                                 : "recorded, 2 MiB segments",
                static_cast<long>(r->num_device_alloc), static_cast<long>(r->num_device_free),
                static_cast<long>(r->num_alloc_retries), static_cast<long>(r->peak_reserved),
                only_size == 1 ? "-" : std::to_string(used.unmatched()).c_str());
  }
  return 0;
}
