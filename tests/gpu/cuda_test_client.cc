// A second process for cuda_chunks_test: a client of a daemon serving
// --backend cuda, through the real client library and CudaDaemonBackend.
//   cuda_test_client hold SOCKET BYTES   map a segment, write the pattern,
//                                        print "ready", sleep
//   cuda_test_client read SOCKET BYTES   map a segment, check the pattern
//                                        (tests/gpu/gpu_pattern.h), print
//                                        "verified N" (N chunks) or what
//                                        differs; exit 0 only if verified
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"
#include "tests/gpu/gpu_pattern.h"

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc != 4) return 64;
  const std::string mode = argv[1];
  const uint64_t bytes = std::strtoull(argv[3], nullptr, 10);
  // The daemon serves the GPU this process calls device 0 (under its
  // CUDA_VISIBLE_DEVICES) by that GPU's UUID.
  auto client = allocd::DaemonClient::Connect(
      {.socket = argv[2],
       .job = "gpu-" + mode,
       .gpu_uuid = allocd::GpuUuid(0).value_or("")});
  if (!client.ok()) {
    std::printf("connect-error %s\n", std::string(client.status().message()).c_str());
    return 2;
  }
  auto backend = allocd::CudaDaemonBackend::Create(client->get(), 0);
  if (!backend.ok()) {
    std::printf("backend-error %s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<uint64_t> segment = (*backend)->AllocateSegment(bytes);
  if (!segment.ok()) {
    std::printf("allocate-error %s\n", std::string(segment.status().message()).c_str());
    return 1;
  }
  const size_t chunk = (*client)->chunk_bytes();
  if (mode == "hold") {
    if (absl::Status s = allocd::gpu_test::WriteSegment(*segment, bytes, chunk);
        !s.ok()) {
      std::printf("write-error %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("ready %llu\n",
                static_cast<unsigned long long>((*client)->session_id()));
    for (;;) pause();
  }
  if (mode == "read") {
    std::set<uint64_t> found;
    const std::string error =
        allocd::gpu_test::CheckSegment(*segment, bytes, chunk, &found);
    if (!error.empty()) {
      std::printf("mismatch %s\n", error.c_str());
      return 1;
    }
    std::printf("verified %zu\n", found.size());
    (*backend)->FreeSegment(*segment, bytes);
    return 0;
  }
  return 64;
}
