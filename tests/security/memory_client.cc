// A job's process for memory_remanence_test, run as a tenant's uid: a
// client of the daemon (the real client library) that maps every chunk it
// gets and keeps it mapped until it exits, released or not, so the test
// sees what a tenant can read of another's memory, and whether it can
// still reach memory it gave back.
//   memory_client SOCKET JOB
// reads one command per line on stdin, answers one line on stdout:
//   acquire BYTES      Acquire; "acquired CHUNKS reused REUSED"
//   ahead BYTES COUNT  the read-ahead (AcquireAhead); "ahead CHUNKS"
//   handover           reads ahead the working set handed at registration,
//                      as transparent mode does; "handed SEGMENTS CHUNKS"
//   write TEXT         TEXT at the start and end of every chunk mapped
//   count TEXT         "count K of N": chunks mapped that start with TEXT
//   release            gives back every chunk it holds (mappings kept)
//   publish            sends the sizes it holds as its working set
//   fork               forks a child that inherits every mapping and holds
//                      it (up to 60 s) after this process exits;
//                      "forked PID ADDR..." (hex addresses of the chunks)
//   exit               exits at once, nothing torn down
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/daemon_client.h"

namespace allocd {
namespace {

struct Mapped {
  char* at = nullptr;
  uint64_t bytes = 0;
};

class Job {
 public:
  explicit Job(std::unique_ptr<DaemonClient> client)
      : client_(std::move(client)) {}

  std::string Run(const std::vector<std::string>& words) {
    const std::string& verb = words[0];
    uint64_t n = 0, m = 0;
    if (verb == "acquire" && words.size() == 2 && absl::SimpleAtoi(words[1], &n)) {
      absl::StatusOr<ReceivedChunks> chunks = client_->Acquire(n);
      if (!chunks.ok()) return "error " + std::string(chunks.status().message());
      const size_t count = chunks->ids.size();
      const uint32_t reused = chunks->reused;
      Take(*std::move(chunks));
      return "acquired " + std::to_string(count) + " reused " +
             std::to_string(reused);
    }
    if (verb == "ahead" && words.size() == 3 && absl::SimpleAtoi(words[1], &n) &&
        absl::SimpleAtoi(words[2], &m)) {
      size_t count = 0;
      for (ReceivedChunks& grant :
           client_->AcquireAhead(n, n, static_cast<uint32_t>(m))) {
        count += grant.ids.size();
        Take(std::move(grant));
      }
      return "ahead " + std::to_string(count);
    }
    if (verb == "handover") {
      size_t count = 0;
      for (uint64_t bytes : client_->handed_working_set()) {
        for (ReceivedChunks& grant : client_->AcquireAhead(bytes, bytes, 1)) {
          count += grant.ids.size();
          Take(std::move(grant));
        }
      }
      return "handed " +
             std::to_string(client_->handed_working_set().size()) + " " +
             std::to_string(count);
    }
    if (verb == "write" && words.size() == 2) {
      for (const Mapped& m : mapped_) {
        std::memcpy(m.at, words[1].data(), words[1].size());
        std::memcpy(m.at + m.bytes - words[1].size(), words[1].data(),
                    words[1].size());
      }
      return "written";
    }
    if (verb == "count" && words.size() == 2) {
      size_t with = 0;
      for (const Mapped& m : mapped_) {
        with += std::memcmp(m.at, words[1].data(), words[1].size()) == 0;
      }
      return "count " + std::to_string(with) + " of " +
             std::to_string(mapped_.size());
    }
    if (verb == "release") {
      for (const auto& [epoch, ids] : held_) {
        if (absl::Status s = client_->Release(epoch, ids); !s.ok()) {
          return "error " + std::string(s.message());
        }
      }
      held_.clear();
      return "released";
    }
    if (verb == "publish") {
      client_->PublishWorkingSet(sizes_);
      absl::Status s = client_->FlushTelemetry();
      return s.ok() ? "published" : "error " + std::string(s.message());
    }
    if (verb == "fork") {
      const pid_t child = fork();
      if (child == 0) {
        close(0);
        close(1);
        alarm(60);
        for (;;) pause();
      }
      std::string answer = "forked " + std::to_string(child);
      for (const Mapped& m : mapped_) {
        answer += " " + absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(m.at)));
      }
      return answer;
    }
    if (verb == "exit") _exit(0);
    return "error unknown command";
  }

 private:
  void Take(ReceivedChunks chunks) {
    for (size_t i = 0; i < chunks.ids.size(); ++i) {
      void* p = mmap(nullptr, chunks.sizes[i], PROT_READ | PROT_WRITE,
                     MAP_SHARED, chunks.fds[i].get(),
                     static_cast<off_t>(chunks.offsets[i]));
      if (p == MAP_FAILED) _exit(3);
      mapped_.push_back({static_cast<char*>(p), chunks.sizes[i]});
      sizes_.push_back(chunks.sizes[i]);
    }
    held_.emplace_back(chunks.epoch, chunks.ids);
  }

  std::unique_ptr<DaemonClient> client_;
  std::vector<Mapped> mapped_;
  std::vector<uint64_t> sizes_;
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> held_;
};

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 3) return 64;
  auto client =
      allocd::DaemonClient::Connect({.socket = argv[1], .job = argv[2]});
  if (!client.ok()) {
    std::printf("error %s\n", std::string(client.status().message()).c_str());
    return 2;
  }
  allocd::Job job(*std::move(client));
  std::printf("ready\n");
  for (std::string line; std::getline(std::cin, line);) {
    std::vector<std::string> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    std::printf("%s\n", job.Run(words).c_str());
  }
  return 0;
}
