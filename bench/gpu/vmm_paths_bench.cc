// Where a segment's time goes, by the driver calls alone: the ways of
// getting a working set of 2 GiB segments that transparent managed mode
// could take, in one process, no daemon, rounds interleaved.
//
//   vmm_paths_bench [--gib 40] [--rounds 3] [--sleep-ms 300] [--warm-up]
//                   [--out FILE.json]
//
// Ways, per 2 GiB segment:
// - native: cuMemAlloc (what PyTorch's cudaMalloc pays);
// - local_2x1g: cuMemCreate of two exportable 1 GiB chunks, reserve, map,
//   cuMemSetAccess: a client creating the daemon's chunk classes itself;
// - local_2x1g_2threads: the same, each chunk created on its own thread
//   (whether a daemon creating a grant's chunks in parallel gains);
// - local_1x2g: the same with one 2 GiB chunk;
// - create_export_2x1g: cuMemCreate of two 1 GiB chunks and their export as
//   FDs, nothing mapped: the daemon's part of a cold acquire;
// - import_2x1g: import two 1 GiB chunks from FDs (created and exported
//   before the clock starts), reserve, map, cuMemSetAccess: the client's
//   part of a warm acquire (the chunks cached in the daemon).
// With --warm-up, each round starts with an untimed 2 MiB cuMemAlloc and
// cuMemFree, as a PyTorch process allocates before a timed loop: the first
// allocation after another round freed its GiBs is the slow one.
// Prints one JSON object (and writes it to --out): for each way and round,
// the round's total, the median segment and every segment, in us.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "allocator/cuda/cuda_driver.h"
#include "nlohmann/json.hpp"

namespace allocd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kSegment = 2 * kGiB;

// One segment as a way made it, to undo after the round.
struct Segment {
  CUdeviceptr native = 0;
  CUdeviceptr range = 0;
  std::vector<CUmemGenericAllocationHandle> chunks;
  std::vector<int> fds;
};

enum class Way {
  kNative,
  kLocal2x1G,
  kLocal2x1GTwoThreads,
  kLocal1x2G,
  kCreateExport2x1G,
  kImport2x1G
};

struct WayName {
  Way way;
  const char* name;
};
constexpr WayName kWays[] = {{Way::kNative, "native"},
                             {Way::kLocal2x1G, "local_2x1g"},
                             {Way::kLocal2x1GTwoThreads, "local_2x1g_2threads"},
                             {Way::kLocal1x2G, "local_1x2g"},
                             {Way::kCreateExport2x1G, "create_export_2x1g"},
                             {Way::kImport2x1G, "import_2x1g"}};

void Check(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "vmm_paths_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Check(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}

// Reserves a segment's range and maps `chunks` (each `chunk_bytes`) into it
// with read-write access, as CudaDaemonBackend does.
void MapSegment(Segment& s, size_t chunk_bytes, CUdevice device) {
  s.range = Check(cuda::AddressReserve(kSegment));
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Check(cuda::MemMap(s.range + i * chunk_bytes, chunk_bytes, s.chunks[i]));
  }
  Check(cuda::SetReadWriteAccess(s.range, kSegment, device));
}

void Undo(Segment& s, size_t chunk_bytes) {
  if (s.native != 0) Check(cuda::MemFree(s.native));
  if (s.range != 0) {
    for (size_t i = 0; i < s.chunks.size(); ++i) {
      Check(cuda::MemUnmap(s.range + i * chunk_bytes, chunk_bytes));
    }
    Check(cuda::AddressFree(s.range, kSegment));
  }
  for (CUmemGenericAllocationHandle h : s.chunks) Check(cuda::MemRelease(h));
  for (int fd : s.fds) close(fd);
}

// The exported 1 GiB chunks import_2x1g maps: made and exported outside
// the clock, released (their FDs kept) so only the FDs hold them.
std::vector<int> ExportedChunks(int count, const CUmemAllocationProp& prop) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle h = Check(cuda::MemCreate(kGiB, prop));
    fds.push_back(Check(cuda::ExportToFd(h)));
    Check(cuda::MemRelease(h));
  }
  return fds;
}

nlohmann::json Round(Way way, int segments, bool warm_up, CUcontext context,
                     CUdevice device, const CUmemAllocationProp& prop) {
  if (warm_up) Check(cuda::MemFree(Check(cuda::MemAlloc(size_t{2} << 20))));
  std::vector<int> exported;
  if (way == Way::kImport2x1G) exported = ExportedChunks(2 * segments, prop);
  std::vector<Segment> made(segments);
  std::vector<double> each_us;
  const auto start = Clock::now();
  for (int i = 0; i < segments; ++i) {
    Segment& s = made[i];
    const auto t0 = Clock::now();
    switch (way) {
      case Way::kNative:
        s.native = Check(cuda::MemAlloc(kSegment));
        break;
      case Way::kLocal2x1G:
      case Way::kCreateExport2x1G:
        for (int c = 0; c < 2; ++c) s.chunks.push_back(Check(cuda::MemCreate(kGiB, prop)));
        if (way == Way::kLocal2x1G) {
          MapSegment(s, kGiB, device);
        } else {
          for (CUmemGenericAllocationHandle h : s.chunks) {
            s.fds.push_back(Check(cuda::ExportToFd(h)));
          }
        }
        break;
      case Way::kLocal2x1GTwoThreads: {
        s.chunks.resize(2);
        std::thread second([&] {
          Check(cuda::SetCurrentContext(context));
          s.chunks[1] = Check(cuda::MemCreate(kGiB, prop));
        });
        s.chunks[0] = Check(cuda::MemCreate(kGiB, prop));
        second.join();
        MapSegment(s, kGiB, device);
        break;
      }
      case Way::kLocal1x2G:
        s.chunks.push_back(Check(cuda::MemCreate(kSegment, prop)));
        MapSegment(s, kSegment, device);
        break;
      case Way::kImport2x1G:
        for (int c = 0; c < 2; ++c) {
          s.chunks.push_back(Check(cuda::ImportFromFd(exported[2 * i + c])));
        }
        MapSegment(s, kGiB, device);
        break;
    }
    each_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double total_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  Check(cuda::Synchronize());
  for (Segment& s : made) Undo(s, way == Way::kLocal1x2G ? kSegment : kGiB);
  for (int fd : exported) close(fd);
  std::vector<double> sorted = each_us;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json round = {{"total_ms", total_ms},
                          {"median_us", sorted[sorted.size() / 2]}};
  for (double us : each_us) round["each_us"].push_back(static_cast<int>(us));
  return round;
}

int Main(int argc, char** argv) {
  int gib = 40, rounds = 3, sleep_ms = 300;
  bool warm_up = false;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "vmm_paths_bench [--gib N] [--rounds N] [--sleep-ms N] [--warm-up]\n"
          "                [--out FILE]\n"
          "Times the driver calls of each way to get N GiB as 2 GiB segments\n"
          "(native cuMemAlloc; local cuMemCreate of 2 x 1 GiB, on one or two\n"
          "threads, or 1 x 2 GiB, mapped; create and export without mapping;\n"
          "import, map), rounds interleaved, sleeping between ways; with\n"
          "--warm-up, an untimed 2 MiB allocation first. Needs a GPU.\n");
      return 0;
    }
    if (arg == "--warm-up") {
      warm_up = true;
      continue;
    }
    int* number = arg == "--gib"        ? &gib
                  : arg == "--rounds"   ? &rounds
                  : arg == "--sleep-ms" ? &sleep_ms
                                        : nullptr;
    if (number != nullptr && has_value && absl::SimpleAtoi(argv[++i], number) &&
        *number >= 0) {
      continue;
    }
    if (arg == "--out" && has_value) {
      out = argv[++i];
      continue;
    }
    std::fprintf(stderr, "vmm_paths_bench: bad argument %s (--help)\n", arg.c_str());
    return 2;
  }
  const int segments = gib / 2;
  if (segments < 1 || rounds < 1) {
    std::fprintf(stderr, "vmm_paths_bench: --gib must be 2 or more, --rounds 1 or more\n");
    return 2;
  }
  cuda::PrimaryContext context = Check(cuda::PrimaryContext::Open(0));
  const CUmemAllocationProp prop =
      cuda::DeviceMemoryProp(context.device(), /*exportable=*/true);
  nlohmann::json result = {{"benchmark", "vmm_paths_bench"},
                           {"device", Check(cuda::DeviceName(context.device()))},
                           {"gib", gib},
                           {"sleep_ms", sleep_ms},
                           {"warm_up", warm_up}};
  for (int r = 0; r < rounds; ++r) {
    for (const WayName& w : kWays) {
      result["ways"][w.name].push_back(Round(w.way, segments, warm_up, context.context(),
                                                   context.device(), prop));
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
  }
  const std::string text = result.dump(1);
  std::printf("%s\n", text.c_str());
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) { return allocd::Main(argc, argv); }
