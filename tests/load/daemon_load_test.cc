// Load: one real `allocd serve --backend sim` process and 32 concurrent
// `allocd client-replay` processes (both shipped traces, several jobs and
// starting configs), more memory wanted at once than the node pool has.
// Mid-run, allocctl pushes configs (a node default, one per job, and one the
// clients must NACK); at the end allocctl and /metrics must show a clean
// node: every client exited 0, no session left, nothing in use, chunks
// reused across processes, the pool never over its capacity, every ACK and
// NACK recorded and counted.
//
// Bounded time: each client replays for kClientDuration (stopping mid-trace
// when its time is up; under this much overcommit most allocations end in
// an OOM round trip), and the test fails only when they are not all done
// within the generous kClientsDeadline.
// Every process it starts is SIGKILLed and reaped on any failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/scoped_temp_dir.h"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ::testing::AllOf;
using ::testing::Ge;
using ::testing::Le;

constexpr int kClients = 32;
constexpr uint64_t kChunk = uint64_t{2} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr const char* kClientDuration = "10";  // seconds
// Far more than the clients need on a loaded 2-core machine (~15 s).
constexpr auto kClientsDeadline = 120s;
constexpr auto kToolTimeout = 30s;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// A child process with stdout and stderr in files; SIGKILLed and reaped
// when destroyed while still running.
class Process {
 public:
  Process(std::vector<std::string> args, const std::string& out_path,
          const std::string& err_path)
      : args_(std::move(args)), out_path_(out_path), err_path_(err_path) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                     O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO,
                                     out_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO,
                                     err_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (std::string& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(),
                               environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << args_[0] << ": " << strerror(rc);
      pid_ = -1;
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() { Kill(); }

  pid_t pid() const { return pid_; }
  bool running() {
    Poll();
    return pid_ > 0;
  }
  // The exit code (128 + signal when killed), or nullopt if it is still
  // running at `deadline`.
  std::optional<int> WaitUntil(Clock::time_point deadline) {
    for (;;) {
      if (Poll()) return exit_code_;
      if (pid_ < 0) return exit_code_;
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
  }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
      exit_code_ = 128 + SIGKILL;
    }
  }
  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }
  std::string command() const {
    std::string c;
    for (const std::string& a : args_) c += (c.empty() ? "" : " ") + a;
    return c;
  }

 private:
  // True when it has just been reaped.
  bool Poll() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status)
                                   : 128 + WTERMSIG(status);
    return true;
  }

  std::vector<std::string> args_;
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// protobuf's JSON: 64-bit integers are strings, zero values are left out.
uint64_t U64(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return 0;
  const nlohmann::json& v = j.at(key);
  return v.is_string() ? std::stoull(v.get<std::string>()) : v.get<uint64_t>();
}

// GET /metrics over a plain socket.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) ==
      0) {
    const std::string request = "GET " + path +
                                " HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                                "Connection: close\r\n\r\n";
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[16384];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof buffer, 0)) > 0) {
        response.append(buffer, n);
      }
    }
  }
  close(fd);
  return response;
}

// The value of the sample `name{labels...}` (every given label must match;
// others may be present), or nullopt when there is none.
std::optional<double> Metric(const std::string& text, const std::string& name,
                             const std::map<std::string, std::string>& labels =
                                 {}) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      if (line.find(k + "=\"" + v + "\"") == std::string::npos) match = false;
    }
    if (!match) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

// 38 GiB (one GPT-2 peak fits, a tenth of all peaks at once), or less where
// the hard RLIMIT_NOFILE cannot hold one FD per 2 MiB chunk plus the
// daemon's 512 for sockets.
uint64_t LoadCapacity() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  constexpr uint64_t kDaemonHeadroom = 512 + 16;
  const uint64_t chunks =
      limit.rlim_max == RLIM_INFINITY ? UINT64_MAX
      : limit.rlim_max > kDaemonHeadroom ? limit.rlim_max - kDaemonHeadroom
                                         : 0;
  return std::min<uint64_t>(38 * kGiB, chunks / 512 * kGiB);
}

struct ClientSpec {
  std::string trace;
  std::string job;
  std::string config;
};

// 28 replays of the LoRA fine-tune (7.4 GiB peak reserved under PyTorch's
// defaults) and 4 of the GPT-2 full fine-tune (37.6 GiB), with no job or
// the jobs "lora" and "gpt2", some starting with expandable segments.
std::vector<ClientSpec> Clients() {
  std::vector<ClientSpec> clients;
  for (int i = 0; i < kClients; ++i) {
    ClientSpec c;
    if (i % 8 == 0) {
      c.trace = "gpt2_full";
      c.job = "gpt2";
    } else {
      c.trace = "llama_lora";
      if (i % 3 == 0) c.job = "lora";
    }
    if (i % 5 == 1) c.config = "expandable_segments:True";
    clients.push_back(c);
  }
  return clients;
}

class DaemonLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { socket_ = dir_ + "/allocd.sock"; }

  void TearDown() override {
    if (HasFailure()) {
      if (daemon_ != nullptr) {
        std::cerr << "--- daemon log (" << daemon_->command() << "):\n"
                  << Tail(daemon_->err()) << "\n";
      }
      int shown = 0;
      for (const auto& c : clients_) {
        const std::string err = c->err();
        if (!err.empty() && shown++ < 4) {
          std::cerr << "--- " << c->command() << " stderr:\n"
                    << Tail(err, 1500) << "\n";
        }
      }
    }
    // Clients first (their sessions end), then the daemon.
    clients_.clear();
    if (daemon_ != nullptr) {
      if (daemon_->running()) kill(daemon_->pid(), SIGTERM);
      if (!daemon_->WaitUntil(Clock::now() + 10s).has_value()) {
        ADD_FAILURE() << "the daemon did not stop on SIGTERM within 10 s";
      }
      daemon_.reset();
    }
  }

  // Starts the daemon; returns the /metrics port it reports on stderr.
  int StartDaemon(uint64_t capacity) {
    daemon_ = std::make_unique<Process>(
        std::vector<std::string>{ALLOCD_BINARY, "serve", "--backend", "sim",
                                 "--socket", socket_, "--metrics-addr",
                                 "127.0.0.1:0", "--capacity",
                                 std::to_string(capacity) + "B"},
        dir_ + "/daemon.out", dir_ + "/daemon.log");
    const std::regex port_line("metrics on port ([0-9]+)");
    const auto deadline = Clock::now() + 60s;
    while (Clock::now() < deadline) {
      std::smatch m;
      const std::string log = daemon_->err();
      if (std::regex_search(log, m, port_line)) return std::stoi(m[1]);
      if (!daemon_->running()) {
        ADD_FAILURE() << "allocd serve exited:\n" << log;
        return 0;
      }
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "no \"metrics on port N\" in the daemon's log in 60 s";
    return 0;
  }

  // allocctl --socket S --json ARGS: its JSON answer (null on failure).
  nlohmann::json Allocctl(std::vector<std::string> args) {
    const std::string name = dir_ + "/allocctl." + std::to_string(++tools_);
    std::vector<std::string> argv = {ALLOCCTL_BINARY, "--socket", socket_,
                                     "--json"};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, name + ".out", name + ".err");
    const std::optional<int> rc = p.WaitUntil(Clock::now() + kToolTimeout);
    if (rc != 0) {
      ADD_FAILURE() << p.command() << ": "
                    << (rc.has_value() ? "exit " + std::to_string(*rc)
                                       : std::string("timed out"))
                    << "\n" << p.err();
      return nullptr;
    }
    nlohmann::json j = nlohmann::json::parse(p.out(), nullptr, false);
    if (j.is_discarded()) {
      ADD_FAILURE() << p.command() << " printed no JSON:\n" << p.out();
      return nullptr;
    }
    return j;
  }

  // First: removed after the processes below, whose output files are in
  // it, are gone.
  const allocd::ScopedTempDir tmp_{
      "allocd_load_", std::filesystem::temp_directory_path().string()};
  const std::string dir_ = tmp_.path();
  std::string socket_;
  std::unique_ptr<Process> daemon_;
  std::vector<std::unique_ptr<Process>> clients_;
  int tools_ = 0;
};

TEST_F(DaemonLoadTest, ThirtyTwoClientsShareAnOvercommittedPool) {
  // More than every client's peak at once (about 320 GiB) is never there:
  // the pool runs short, asks sessions for their caches, and chunks one
  // process frees go to the next.
  const uint64_t capacity = LoadCapacity();
  ASSERT_GE(capacity, 8 * kGiB)
      << "RLIMIT_NOFILE's hard limit leaves the daemon too few chunk FDs";
  const int port = StartDaemon(capacity);
  ASSERT_GT(port, 0);
  const auto start = Clock::now();

  const std::vector<ClientSpec> specs = Clients();
  for (int i = 0; i < kClients; ++i) {
    const ClientSpec& s = specs[i];
    std::vector<std::string> args = {
        ALLOCD_BINARY, "client-replay",
        std::string(ALLOCD_SOURCE_DIR) + "/traces/" + s.trace + ".pickle.gz",
        "--socket", socket_, "--duration", kClientDuration, "--json"};
    if (!s.job.empty()) args.insert(args.end(), {"--job", s.job});
    if (!s.config.empty()) args.insert(args.end(), {"--config", s.config});
    const std::string name = dir_ + "/client" + std::to_string(i);
    clients_.push_back(
        std::make_unique<Process>(args, name + ".json", name + ".err"));
  }

  // Mid-run: once a quarter of the clients hold sessions, push a node
  // default, a config for job "lora", and one that job "gpt2" must NACK
  // (a running process cannot change its backend). Sessions that register
  // later get their job's config at registration and ACK it the same way.
  auto live_sessions = [&]() -> uint64_t {
    nlohmann::json status = Allocctl({"status"});
    return status.is_null() ? 0 : U64(status, "sessions");
  };
  auto any_client_running = [&] {
    for (auto& c : clients_) {
      if (c->running()) return true;
    }
    return false;
  };
  uint64_t seen = 0;
  while (Clock::now() - start < kClientsDeadline && any_client_running() &&
         (seen = live_sessions()) < kClients / 4) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(seen, uint64_t{kClients / 4})
      << "the clients never held " << kClients / 4 << " sessions at once";
  const nlohmann::json mid_metrics_status = Allocctl({"status"});
  const std::string mid_metrics = HttpGet(port, "/metrics");
  std::set<std::string> pushed_configs;
  uint64_t pushed_to = 0;
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{"roundup_power2_divisions:4"},
        std::vector<std::string>{"expandable_segments:True", "--job", "lora"},
        std::vector<std::string>{"backend:cudaMallocAsync", "--job",
                                 "gpt2"}}) {
    std::vector<std::string> args = {"config", "set"};
    args.insert(args.end(), set.begin(), set.end());
    nlohmann::json r = Allocctl(args);
    ASSERT_FALSE(r.is_null());
    pushed_configs.insert(r["config"].value("config", ""));
    pushed_to += U64(r, "pushed_to");
  }
  // Mid-run, the sessions have series of their own in /metrics.
  EXPECT_THAT(Metric(mid_metrics, "allocd_sessions"),
              ::testing::Optional(Ge(1.0)))
      << mid_metrics;
  EXPECT_TRUE(Metric(mid_metrics, "allocd_session_held_bytes").has_value())
      << mid_metrics;

  // Every client ends on its own, exit 0, with its JSON report.
  const auto deadline = start + kClientsDeadline;
  struct Totals {
    uint64_t loops = 0, events = 0, ooms = 0, reclaims = 0, applied = 0,
             rejected = 0, peak_reserved = 0;
  } totals;
  std::set<std::string> allowed_configs = pushed_configs;
  for (const ClientSpec& s : specs) allowed_configs.insert(s.config);
  for (int i = 0; i < kClients; ++i) {
    Process& c = *clients_[i];
    const std::optional<int> rc = c.WaitUntil(deadline);
    ASSERT_TRUE(rc.has_value())
        << c.command() << " still running after "
        << std::chrono::duration_cast<std::chrono::seconds>(kClientsDeadline)
               .count()
        << " s; sessions: " << Allocctl({"sessions"}).dump(1);
    EXPECT_EQ(*rc, 0) << c.command() << "\n" << c.err();
    const nlohmann::json j = nlohmann::json::parse(c.out(), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << c.command() << ":\n" << c.out();
    EXPECT_GT(j["events"].get<uint64_t>(), 0u);
    EXPECT_EQ(j["reconnects"].get<int>(), 0) << c.command();
    EXPECT_TRUE(allowed_configs.contains(j["config"].get<std::string>()))
        << c.command() << " ends on config " << j["config"];
    totals.loops += j["loops"].get<uint64_t>();
    totals.events += j["events"].get<uint64_t>();
    totals.ooms += j["ooms_reported"].get<uint64_t>();
    totals.reclaims += j["reclaims"].get<uint64_t>();
    totals.applied += j["configs_applied"].get<uint64_t>();
    totals.rejected += j["configs_rejected"].get<uint64_t>();
    totals.peak_reserved += j["peak_reserved"].get<uint64_t>();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();

  // Every lease closed with its process: no session is left, and nothing
  // is in use. (Lease EOFs are handled as they arrive: allow a moment.)
  nlohmann::json status;
  for (int i = 0; i < 200; ++i) {
    status = Allocctl({"status"});
    ASSERT_FALSE(status.is_null());
    if (U64(status, "sessions") == 0 && U64(status, "in_use_bytes") == 0) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(U64(status, "sessions"), 0u) << status.dump(1);
  EXPECT_EQ(U64(status, "in_use_bytes"), 0u) << status.dump(1);
  EXPECT_EQ(U64(status, "capacity_bytes"), capacity);
  EXPECT_EQ(U64(status, "chunk_bytes"), kChunk);
  const uint64_t created = U64(status, "chunks_created_total");
  const uint64_t reused = U64(status, "chunks_reused_total");
  const uint64_t trimmed = U64(status, "trimmed_bytes_total");
  EXPECT_GT(reused, 0u) << status.dump(1);
  EXPECT_LE(U64(status, "in_use_bytes") + U64(status, "free_bytes"), capacity);
  // Every chunk ever made is cached now (nothing is in use) or was trimmed:
  // a full pool makes room for a chunk of one size by destroying cached
  // chunks of others. Chunks are at least kChunk.
  const uint64_t made_bytes = U64(status, "free_bytes") + trimmed;
  EXPECT_LE(created * kChunk, made_bytes) << status.dump(1);
  // Across processes: at its peak each client held its peak reserved in
  // chunks of its own; were no chunk ever passed from one session to
  // another, the pool would have made at least their sum.
  EXPECT_GT(totals.peak_reserved, made_bytes)
      << "no chunk went from one process to another\n" << status.dump(1);
  nlohmann::json sessions = Allocctl({"sessions"});
  EXPECT_TRUE(!sessions.contains("sessions") || sessions["sessions"].empty())
      << sessions.dump(1);

  // The history holds our three sets and every ACK and NACK the clients
  // sent, and /metrics counts them.
  nlohmann::json history = Allocctl({"config", "history", "--limit", "100000"});
  ASSERT_FALSE(history.is_null());
  std::map<std::string, uint64_t> events;
  for (const nlohmann::json& e : history.value("entries", nlohmann::json::array())) {
    ++events[e.value("event", "")];
  }
  EXPECT_EQ(events["set"], 3u);
  EXPECT_GE(events["ack"], 1u) << history.dump(1);
  EXPECT_EQ(events["ack"], totals.applied);
  EXPECT_EQ(events["nack"], totals.rejected);

  const std::string metrics = HttpGet(port, "/metrics");
  ASSERT_NE(metrics.find("200 OK"), std::string::npos) << metrics;
  EXPECT_EQ(Metric(metrics, "allocd_pool_bytes", {{"state", "capacity"}}),
            static_cast<double>(capacity));
  EXPECT_EQ(Metric(metrics, "allocd_pool_bytes", {{"state", "in_use"}}), 0.0);
  EXPECT_TRUE(Metric(metrics, "allocd_pool_bytes", {{"state", "free"}}));
  EXPECT_EQ(Metric(metrics, "allocd_sessions"), 0.0);
  EXPECT_EQ(Metric(metrics, "allocd_pool_chunks_total", {{"origin", "reused"}}),
            static_cast<double>(reused));
  // Rollbacks are ACKed like pushes but counted as rollbacks.
  const double acks =
      Metric(metrics, "allocd_config_pushes_total", {{"result", "ack"}})
          .value_or(-1);
  EXPECT_THAT(acks, AllOf(Ge(1.0), Le(static_cast<double>(events["ack"])),
                          Ge(static_cast<double>(events["ack"]) -
                             static_cast<double>(events["rollback"]))))
      << metrics;
  EXPECT_EQ(Metric(metrics, "allocd_config_pushes_total", {{"result", "nack"}})
                .value_or(0),
            static_cast<double>(events["nack"]));
  EXPECT_EQ(
      Metric(metrics, "allocd_config_pushes_total", {{"result", "rollback"}})
          .value_or(0),
      static_cast<double>(events["rollback"]));
  // Ended sessions leave no series behind.
  EXPECT_FALSE(Metric(metrics, "allocd_session_held_bytes").has_value())
      << metrics;
  EXPECT_FALSE(Metric(metrics, "allocd_reserved_bytes").has_value())
      << metrics;

  std::ostringstream summary;
  summary << kClients << " clients in " << seconds << " s: " << totals.loops
          << " loops, " << totals.events << " events, " << totals.ooms
          << " OOMs, " << totals.reclaims << " reclaim requests answered; "
          << "pushed to " << pushed_to << " live sessions, " << events["ack"]
          << " ACKs, " << events["nack"] << " NACKs, " << events["rollback"]
          << " rollbacks; chunks " << created << " created, " << reused
          << " reused, " << trimmed / static_cast<double>(kGiB)
          << " GiB trimmed; sum of peaks "
          << totals.peak_reserved / static_cast<double>(kGiB)
          << " GiB in a pool of " << capacity / kGiB << " GiB";
  std::cout << summary.str() << "\n";
  RecordProperty("summary", summary.str());
  (void)mid_metrics_status;
}

}  // namespace
