// What a chunk costs to cross tenants on a GPU (node_pool.h, "Tenants"):
// scrubbed in place (CudaChunkSource::Scrub: map in the daemon, one
// cuMemsetD8Async per chunk on its own stream, one wait, unmap) against
// destroyed and created again (cuMemRelease, cuMemCreate, and the export
// the next claim of a new chunk pays).
//
//   scrub_bench [--device N] [--total-gib G] [--rounds R] [--out FILE.json]
//
// For each chunk class (2 MiB, 16 MiB, 128 MiB, 1 GiB) it creates G GiB
// (default 4) of chunks, fills them with a pattern, and times per round:
// - scrub_batch: Scrub of every chunk in one call (what an Acquire of G GiB
//   of another tenant's chunks pays);
// - scrub_each: Scrub of one chunk at a time (a 1-chunk Acquire each);
// - recreate: per chunk, drop (cuMemRelease) + CreateChunk;
// - recreate_export: the same + OpenForClient (cuMemExportToShareableHandle,
//   kept by the source) and the close of the claim's copy: what a new chunk
//   costs before it reaches a client, which a scrubbed one, its export
//   kept, does not pay again.
// Every figure is ms per GiB, min and median over the rounds. After each
// scrub every byte of every chunk is read back (verified_zero: false, and
// exit status 1, if one is not zero).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "allocator/cuda/cuda_driver.h"
#include "nlohmann/json.hpp"
#include "server/pool/cuda_chunk_source.h"

namespace allocd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

double Ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - since)
      .count();
}

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "scrub_bench: %s: %s\n", what,
               std::string(s.message()).c_str());
  std::exit(2);
}

// Runs `body` on chunk `memory` (`bytes`) mapped in this process.
template <typename Body>
void WithMapped(const ChunkMemory& memory, uint64_t bytes, int device,
                Body body) {
  absl::StatusOr<CUdeviceptr> at = cuda::AddressReserve(bytes);
  Check(at.status(), "cuMemAddressReserve");
  Check(cuda::MemMap(*at, bytes, memory.handle), "cuMemMap");
  absl::StatusOr<CUdevice> dev = cuda::GetDevice(device);
  Check(dev.status(), "cuDeviceGet");
  Check(cuda::SetReadWriteAccess(*at, bytes, *dev), "cuMemSetAccess");
  body(*at);
  Check(cuda::MemUnmap(*at, bytes), "cuMemUnmap");
  Check(cuda::AddressFree(*at, bytes), "cuMemAddressFree");
}

void Fill(const std::vector<ChunkMemory>& chunks, uint64_t bytes, int device) {
  for (const ChunkMemory& memory : chunks) {
    WithMapped(memory, bytes, device, [&](CUdeviceptr at) {
      Check(cuda::MemsetD8(at, 0xA5, bytes), "cuMemsetD8");
      // Asynchronous to the host on device memory: done before the unmap.
      Check(cuda::Synchronize(), "cuCtxSynchronize");
    });
  }
}

bool AllZero(const std::vector<ChunkMemory>& chunks, uint64_t bytes,
             int device) {
  const uint64_t piece = std::min<uint64_t>(bytes, 64 * kMiB);
  std::vector<unsigned char> host(piece);
  bool zero = true;
  for (const ChunkMemory& memory : chunks) {
    WithMapped(memory, bytes, device, [&](CUdeviceptr at) {
      for (uint64_t off = 0; off < bytes && zero; off += piece) {
        Check(cuda::MemcpyDtoH(host.data(), at + off, piece), "cuMemcpyDtoH");
        zero = std::all_of(host.begin(), host.end(),
                           [](unsigned char c) { return c == 0; });
      }
    });
  }
  return zero;
}

std::vector<ChunkToScrub> ToScrub(const std::vector<ChunkMemory>& chunks,
                                  uint64_t bytes) {
  std::vector<ChunkToScrub> all;
  for (const ChunkMemory& memory : chunks) {
    all.push_back({.memory = &memory, .bytes = bytes});
  }
  return all;
}

nlohmann::json Summary(std::vector<double> ms_per_gib) {
  std::sort(ms_per_gib.begin(), ms_per_gib.end());
  return {{"min", ms_per_gib.front()},
          {"median", ms_per_gib[ms_per_gib.size() / 2]}};
}

int Main(int argc, char** argv) {
  int device = 0;
  uint64_t total_gib = 4;
  int rounds = 5;
  std::string out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--device") device = std::atoi(argv[i + 1]);
    else if (flag == "--total-gib") total_gib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--out") out = argv[i + 1];
  }
  absl::StatusOr<std::unique_ptr<CudaChunkSource>> made =
      CudaChunkSource::Create(device);
  Check(made.status(), "CudaChunkSource::Create");
  CudaChunkSource& source = **made;
  nlohmann::json result = {{"device", source.Describe()},
                           {"total_gib", total_gib},
                           {"rounds", rounds}};
  bool verified = true;
  const double gib = static_cast<double>(total_gib);
  for (uint64_t bytes : {2 * kMiB, 16 * kMiB, 128 * kMiB, kGiB}) {
    const uint64_t count = total_gib * kGiB / bytes;
    std::vector<ChunkMemory> chunks;
    for (uint64_t i = 0; i < count; ++i) {
      absl::StatusOr<ChunkMemory> memory = source.CreateChunk(bytes);
      Check(memory.status(), "CreateChunk");
      chunks.push_back(*std::move(memory));
      // As a claimed chunk: its export kept by the source.
      absl::StatusOr<UniqueFd> fd = source.OpenForClient(chunks.back());
      Check(fd.status(), "OpenForClient");
    }
    std::vector<double> batch, each, recreate, recreate_export;
    for (int round = 0; round < rounds; ++round) {
      Fill(chunks, bytes, device);
      auto t = std::chrono::steady_clock::now();
      Check(source.Scrub(ToScrub(chunks, bytes)), "Scrub");
      batch.push_back(Ms(t) / gib);
      verified = AllZero(chunks, bytes, device) && verified;

      Fill(chunks, bytes, device);
      t = std::chrono::steady_clock::now();
      for (const ChunkMemory& memory : chunks) {
        Check(source.Scrub({{.memory = &memory, .bytes = bytes}}), "Scrub");
      }
      each.push_back(Ms(t) / gib);
      verified = AllZero(chunks, bytes, device) && verified;

      t = std::chrono::steady_clock::now();
      for (ChunkMemory& memory : chunks) {
        memory = ChunkMemory{};  // cuMemRelease (and the kept export)
        absl::StatusOr<ChunkMemory> again = source.CreateChunk(bytes);
        Check(again.status(), "CreateChunk");
        memory = *std::move(again);
      }
      recreate.push_back(Ms(t) / gib);

      t = std::chrono::steady_clock::now();
      for (ChunkMemory& memory : chunks) {
        memory = ChunkMemory{};
        absl::StatusOr<ChunkMemory> again = source.CreateChunk(bytes);
        Check(again.status(), "CreateChunk");
        memory = *std::move(again);
        absl::StatusOr<UniqueFd> fd = source.OpenForClient(memory);
        Check(fd.status(), "OpenForClient");
      }
      recreate_export.push_back(Ms(t) / gib);
    }
    result["classes"].push_back(
        {{"chunk_bytes", bytes},
         {"chunks", count},
         {"scrub_batch_ms_per_gib", Summary(batch)},
         {"scrub_each_ms_per_gib", Summary(each)},
         {"recreate_ms_per_gib", Summary(recreate)},
         {"recreate_export_ms_per_gib", Summary(recreate_export)}});
  }
  result["verified_zero"] = verified;
  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return verified ? 0 : 1;
}

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) { return allocd::Main(argc, argv); }
