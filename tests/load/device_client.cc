// A client of one device of a multi-device daemon, for multi_device_test.
// It registers with a GPU UUID, tags every chunk it gets with that UUID
// (the first bytes of the chunk) and checks the tag of every chunk it gets
// back from the cache: a chunk bearing another device's tag was handed
// across devices ("foreign"). Each chunk's identity (memfd inode, offset)
// is printed so the test can check that no chunk went to two devices.
//
//   device_client ddp SOCKET UUID BYTES DIR
//     acquire BYTES, print "held SESSION IDS"; when DIR/release exists,
//     release them all, print "released"; when DIR/reacquire exists,
//     acquire BYTES again, print "reacquired REUSED FOREIGN IDS"; when
//     DIR/exit exists, exit 0.
//   device_client load SOCKET UUID SECONDS MAX_BYTES SEED
//     for SECONDS: acquire random sizes up to MAX_BYTES, hold up to three
//     grants, release the oldest; then print
//     "done ACQUIRES REFUSED REUSED FOREIGN IDS".
// IDS: space-separated INODE:OFFSET of every chunk received. Exit 2 when it
// cannot connect, 4 when the daemon serves it from another device.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "client/daemon_client.h"

namespace {

using allocd::DaemonClient;
using allocd::ReceivedChunks;

constexpr size_t kTagBytes = 64;

struct Checked {
  uint32_t reused = 0;
  uint64_t foreign = 0;
};

// Checks and writes the tag of every chunk; adds their identities to `ids`.
Checked TagChunks(const ReceivedChunks& chunks, const std::string& uuid,
                  std::set<std::string>& ids) {
  char tag[kTagBytes] = {};
  std::strncpy(tag, uuid.c_str(), kTagBytes - 1);
  Checked out{.reused = chunks.reused};
  for (size_t i = 0; i < chunks.ids.size(); ++i) {
    struct stat st {};
    if (fstat(chunks.fds[i].get(), &st) != 0) std::exit(3);
    ids.insert(std::to_string(st.st_ino) + ":" +
               std::to_string(chunks.offsets[i]));
    void* p = mmap(nullptr, kTagBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   chunks.fds[i].get(), static_cast<off_t>(chunks.offsets[i]));
    if (p == MAP_FAILED) std::exit(3);
    char* bytes = static_cast<char*>(p);
    const bool untouched = bytes[0] == 0;
    if (!untouched && std::memcmp(bytes, tag, kTagBytes) != 0) ++out.foreign;
    std::memcpy(bytes, tag, kTagBytes);
    munmap(p, kTagBytes);
  }
  return out;
}

std::string Join(const std::set<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += " " + id;
  return out;
}

void WaitForFile(const std::string& path) {
  while (access(path.c_str(), F_OK) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::unique_ptr<DaemonClient> Connect(const char* socket,
                                      const std::string& uuid) {
  auto client = DaemonClient::Connect(
      {.socket = socket, .job = "multi-device", .gpu_uuid = uuid,
       .event_capacity = 0});
  if (!client.ok()) {
    std::printf("connect-error %s\n",
                std::string(client.status().message()).c_str());
    std::exit(2);
  }
  if ((*client)->gpu_uuid() != uuid) {
    std::printf("wrong-device %s\n", (*client)->gpu_uuid().c_str());
    std::exit(4);
  }
  return std::move(*client);
}

int Ddp(char** argv) {
  const std::string uuid = argv[3];
  const uint64_t bytes = std::strtoull(argv[4], nullptr, 10);
  const std::string dir = argv[5];
  std::unique_ptr<DaemonClient> client = Connect(argv[2], uuid);
  std::set<std::string> ids;
  absl::StatusOr<ReceivedChunks> held = client->Acquire(bytes);
  if (!held.ok()) return 1;
  TagChunks(*held, uuid, ids);
  std::printf("held %llu%s\n",
              static_cast<unsigned long long>(client->session_id()),
              Join(ids).c_str());
  WaitForFile(dir + "/release");
  if (!client->Release(held->epoch, held->ids).ok()) return 1;
  std::printf("released\n");
  WaitForFile(dir + "/reacquire");
  std::set<std::string> again;
  absl::StatusOr<ReceivedChunks> back = client->Acquire(bytes);
  if (!back.ok()) return 1;
  const Checked checked = TagChunks(*back, uuid, again);
  std::printf("reacquired %u %llu%s\n", checked.reused,
              static_cast<unsigned long long>(checked.foreign),
              Join(again).c_str());
  WaitForFile(dir + "/exit");
  return 0;
}

int Load(char** argv) {
  const std::string uuid = argv[3];
  const auto duration = std::chrono::seconds(std::atoi(argv[4]));
  const uint64_t max_bytes = std::strtoull(argv[5], nullptr, 10);
  std::mt19937_64 random(std::strtoull(argv[6], nullptr, 10));
  std::unique_ptr<DaemonClient> client = Connect(argv[2], uuid);
  std::set<std::string> ids;
  std::deque<ReceivedChunks> held;
  uint64_t acquires = 0, refused = 0, reused = 0, foreign = 0;
  const auto end = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < end) {
    const uint64_t bytes = 1 + random() % max_bytes;
    absl::StatusOr<ReceivedChunks> got = client->Acquire(bytes);
    if (got.ok()) {
      ++acquires;
      const Checked checked = TagChunks(*got, uuid, ids);
      reused += checked.reused;
      foreign += checked.foreign;
      held.push_back(*std::move(got));
    } else if (absl::IsResourceExhausted(got.status())) {
      ++refused;
    } else {
      std::printf("acquire-error %s\n",
                  std::string(got.status().message()).c_str());
      return 1;
    }
    if (held.size() > 2 || (!got.ok() && !held.empty())) {
      if (!client->Release(held.front().epoch, held.front().ids).ok()) {
        return 1;
      }
      held.pop_front();
    }
  }
  std::printf("done %llu %llu %llu %llu%s\n",
              static_cast<unsigned long long>(acquires),
              static_cast<unsigned long long>(refused),
              static_cast<unsigned long long>(reused),
              static_cast<unsigned long long>(foreign), Join(ids).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ddp" && argc == 6) return Ddp(argv);
  if (mode == "load" && argc == 7) return Load(argv);
  std::fprintf(stderr, "usage: see tests/load/device_client.cc\n");
  return 64;
}
