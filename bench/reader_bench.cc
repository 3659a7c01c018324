// Snapshot reading speed on the shipped real traces, in MB/s of decompressed
// pickle: the unpickler alone, the whole reader on the raw pickle, and the
// whole reader on the .pickle.gz file (gunzip included).
//
//   build/release/bench/reader_bench --benchmark_counters_tabular=true
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/trace/pickle.h"
#include "allocator/trace/snapshot_reader.h"
#include "benchmark/benchmark.h"
#include "zlib.h"

namespace allocd {
namespace {

constexpr const char* kTraces[] = {"llama_lora", "gpt2_full"};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The shipped trace `index` of kTraces, compressed as shipped and
// decompressed; both read once.
struct TraceFiles {
  std::string gz;
  std::string pickle;
};

const TraceFiles& Files(int64_t index) {
  static TraceFiles* files = [] {
    auto* all = new TraceFiles[std::size(kTraces)];
    for (size_t i = 0; i < std::size(kTraces); ++i) {
      const std::string path = std::string(ALLOCD_SOURCE_DIR) + "/traces/" +
                               kTraces[i] + ".pickle.gz";
      all[i].gz = ReadFile(path);
      gzFile f = gzopen(path.c_str(), "rb");
      char buffer[1 << 16];
      int n;
      while (f != nullptr && (n = gzread(f, buffer, sizeof(buffer))) > 0) {
        all[i].pickle.append(buffer, n);
      }
      if (f != nullptr) gzclose(f);
    }
    return all;
  }();
  return files[index];
}

// Reports MB/s of pickle, of the .gz file, and trace events/s (0: none).
void Report(benchmark::State& state, const TraceFiles& files, size_t events) {
  state.SetLabel(kTraces[state.range(0)]);
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * files.pickle.size()));
  if (events > 0) {
    state.counters["events/s"] =
        benchmark::Counter(static_cast<double>(events),
                           benchmark::Counter::kIsIterationInvariantRate);
  }
  state.counters["gz_MB"] =
      benchmark::Counter(static_cast<double>(files.gz.size()) / 1e6,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ParsePickle(benchmark::State& state) {
  const TraceFiles& files = Files(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<PickleDocument> doc = ParsePickle(files.pickle);
    if (!doc.ok())
      state.SkipWithError(std::string(doc.status().message()).c_str());
    benchmark::DoNotOptimize(doc);
  }
  Report(state, files, 0);
}

// ParseSnapshot on `use_gz ? gz : pickle` bytes.
void ParseSnapshotBench(benchmark::State& state, bool use_gz) {
  const TraceFiles& files = Files(state.range(0));
  const std::string& bytes = use_gz ? files.gz : files.pickle;
  size_t events = 0;
  for (auto _ : state) {
    absl::StatusOr<Trace> trace = ParseSnapshot(bytes);
    if (!trace.ok()) {
      state.SkipWithError(std::string(trace.status().message()).c_str());
      break;
    }
    events = trace->events.size();
    benchmark::DoNotOptimize(trace);
  }
  Report(state, files, events);
}

void BM_ParseSnapshotRaw(benchmark::State& state) {
  ParseSnapshotBench(state, false);
}
void BM_ParseSnapshotGz(benchmark::State& state) {
  ParseSnapshotBench(state, true);
}

BENCHMARK(BM_ParsePickle)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseSnapshotRaw)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseSnapshotGz)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace allocd

BENCHMARK_MAIN();
