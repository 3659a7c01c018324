// A client under load for restart_test: acquires and releases chunks of the
// daemon in a loop (real memfd chunks of mixed size classes, mapped, each
// stamped with this pid and its id and checked before it goes back), across
// a daemon restart.
//   churn_client SOCKET MAX_CHUNKS SEED
// Prints "ready PID" once connected. On SIGUSR1 it stops after the current
// call, checks every chunk it holds and prints
//   "holding SESSION BYTES ID,ID,..."
// then waits to be killed. A stamp another process overwrote (a chunk
// handed out twice) prints "corrupt ..." and exits 3.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/daemon_client.h"

namespace {

std::atomic<bool> pause_requested{false};

struct Held {
  uint64_t epoch;
  uint64_t id;
  // Its size class: chunks of 2 MiB and 16 MiB mixed.
  uint64_t bytes;
  char* memory;
};

std::string Stamp(uint64_t id) {
  return absl::StrCat("pid ", getpid(), " chunk ", id);
}

void Check(const Held& h) {
  const std::string stamp = Stamp(h.id);
  if (std::memcmp(h.memory, stamp.data(), stamp.size()) != 0 ||
      std::memcmp(h.memory + h.bytes - stamp.size(), stamp.data(),
                  stamp.size()) != 0) {
    std::printf("corrupt chunk %llu: stamped \"%s\", reads \"%.*s\"\n",
                static_cast<unsigned long long>(h.id), stamp.c_str(),
                static_cast<int>(stamp.size()), h.memory);
    std::exit(3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc != 4) return 64;
  signal(SIGUSR1, [](int) { pause_requested = true; });
  const size_t max_chunks = std::strtoull(argv[2], nullptr, 10);
  std::mt19937 rng(static_cast<unsigned>(std::strtoul(argv[3], nullptr, 10)));
  auto client = allocd::DaemonClient::Connect(
      {.socket = argv[1], .job = "churn", .reconnect_wait = absl::Seconds(30)});
  if (!client.ok()) {
    std::printf("connect-error %s\n", std::string(client.status().message()).c_str());
    return 2;
  }
  std::printf("ready %d\n", getpid());
  std::vector<Held> held;
  const uint64_t chunk_bytes = (*client)->chunk_bytes();
  while (!pause_requested) {
    if (held.empty() || (held.size() < max_chunks && rng() % 2 == 0)) {
      // Up to 18 MiB: a 16 MiB chunk and 2 MiB ones.
      auto got = (*client)->Acquire((1 + rng() % 9) * chunk_bytes);
      if (!got.ok()) {
        if (absl::IsResourceExhausted(got.status())) continue;
        std::printf("acquire-error %s\n",
                    std::string(got.status().message()).c_str());
        return 1;
      }
      for (size_t i = 0; i < got->ids.size(); ++i) {
        const uint64_t bytes = got->sizes[i];
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       got->fds[i].get(), static_cast<off_t>(got->offsets[i]));
        if (p == MAP_FAILED) return 4;
        Held h{.epoch = got->epoch,
               .id = got->ids[i],
               .bytes = bytes,
               .memory = static_cast<char*>(p)};
        const std::string stamp = Stamp(h.id);
        std::memcpy(h.memory, stamp.data(), stamp.size());
        std::memcpy(h.memory + bytes - stamp.size(), stamp.data(), stamp.size());
        held.push_back(h);
      }
    } else {
      const size_t victim = rng() % held.size();
      const Held h = held[victim];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(victim));
      Check(h);
      munmap(h.memory, h.bytes);
      if (absl::Status s = (*client)->Release(h.epoch, {h.id}); !s.ok()) {
        std::printf("release-error %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
    usleep(500);
  }
  std::string ids;
  uint64_t held_bytes = 0;
  for (const Held& h : held) {
    Check(h);
    absl::StrAppend(&ids, ids.empty() ? "" : ",", h.id);
    held_bytes += h.bytes;
  }
  std::printf("holding %llu %llu %s\n",
              static_cast<unsigned long long>((*client)->session_id()),
              static_cast<unsigned long long>(held_bytes),
              ids.c_str());
  for (;;) pause();
}
