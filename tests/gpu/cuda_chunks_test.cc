// GPU memory from the daemon, end to end: a real `allocd serve --backend
// cuda` process, clients in this process and in others (cuda_test_client)
// that map its chunks with CudaDaemonBackend through the real client
// library. Every test that needs a GPU skips without one (CI has no driver);
// there, `allocd serve --backend cuda` must fail with a clear error.
//
// The binaries are the build's, or those named by $ALLOCD_BINARY,
// $ALLOCCTL_BINARY and $CUDA_TEST_CLIENT_BINARY (a copy run elsewhere).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "allocator/cuda/cuda_driver.h"
#include "allocd.grpc.pb.h"
#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "server/pool/cuda_chunk_source.h"
#include "tests/gpu/gpu_pattern.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"

extern char** environ;

namespace allocd {
namespace {

using ::testing::HasSubstr;
using gpu_test::CheckSegment;
using gpu_test::WriteSegment;
using harness::Child;
using harness::Dial;
using harness::DialAdmin;

// Output and errors on one pipe: a failing test shows why.
constexpr bool kWithStderr = true;

std::string Binary(const char* variable, const char* built) {
  const char* from_env = std::getenv(variable);
  return from_env != nullptr && *from_env != '\0' ? from_env : built;
}

// Why there is no GPU to test on, or "".
std::string NoGpu() {
  if (absl::Status s = cuda::Init(); !s.ok()) return std::string(s.message());
  absl::StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) return std::string(count.status().message());
  if (*count == 0) return "no CUDA device";
  return "";
}

#define REQUIRE_GPU()                                       \
  if (const std::string why = NoGpu(); !why.empty()) {      \
    GTEST_SKIP() << "needs a GPU: " << why;                 \
  }

// Starts `allocd serve --socket SOCKET --metrics-addr '' FLAGS` and waits
// for its socket; nullptr (and `output` says why) when it exits instead.
std::unique_ptr<Child> StartDaemon(const std::string& socket,
                                   std::string* output,
                                   std::vector<std::string> flags) {
  unlink(socket.c_str());
  std::vector<std::string> args = {Binary("ALLOCD_BINARY", ALLOCD_BINARY),
                                   "serve", "--socket", socket,
                                   "--metrics-addr", ""};
  args.insert(args.end(), flags.begin(), flags.end());
  auto daemon = std::make_unique<Child>(std::move(args), kWithStderr);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (!daemon->running()) {
      const int code = daemon->Wait();
      *output = absl::StrCat("exit ", code, ": ", daemon->Rest());
      return nullptr;
    }
    if (ConnectUnix(socket).ok()) return daemon;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  *output = "no socket within 60 s";
  return nullptr;
}

// `allocd serve --backend cuda --capacity CAPACITY`, as StartDaemon.
std::unique_ptr<Child> StartCudaDaemon(const std::string& socket,
                                       std::string* output,
                                       const std::string& capacity = "1GiB") {
  return StartDaemon(socket, output,
                     {"--backend", "cuda", "--capacity", capacity});
}

// Without a GPU: a clear error and exit 1; with one: it serves GPU chunks.
TEST(CudaServeTest, BackendCudaServesGpuChunksOrSaysWhyNot) {
  const ScopedTempDir dir("allocd_gpu_");
  const std::string socket = dir.path() + "/allocd.sock";
  std::string output;
  std::unique_ptr<Child> daemon = StartCudaDaemon(socket, &output);
  if (const std::string why = NoGpu(); !why.empty()) {
    ASSERT_EQ(daemon, nullptr) << "started without a GPU (" << why << ")";
    EXPECT_THAT(output, HasSubstr("exit 1"));
    EXPECT_THAT(output, HasSubstr("--backend cuda: no CUDA"));
    std::printf("without a GPU: %s", output.c_str());
    return;
  }
  ASSERT_NE(daemon, nullptr) << output;
  auto admin = v1::Admin::NewStub(DialAdmin(socket));
  grpc::ClientContext context;
  v1::StatusResponse status;
  ASSERT_TRUE(admin->Status(&context, {}, &status).ok());
  EXPECT_EQ(status.backend(), "cuda");
  EXPECT_GE(status.chunk_bytes(), uint64_t{2} << 20);
  EXPECT_EQ(status.chunk_bytes() % (uint64_t{2} << 20), 0u);
}

// The default (--backend auto, no --capacity): without a GPU, sim with a
// notice; with GPUs, every one the driver sees, named by its UUID, each
// pool its free memory at start minus the 1 GiB headroom.
TEST(CudaServeTest, TheDefaultServesEveryGpuByUuidOrSimWithANotice) {
  const ScopedTempDir dir("allocd_gpu_");
  const std::string socket = dir.path() + "/allocd.sock";
  std::string output;
  std::unique_ptr<Child> daemon = StartDaemon(socket, &output, {});
  ASSERT_NE(daemon, nullptr) << output;
  auto admin = v1::Admin::NewStub(DialAdmin(socket));
  grpc::ClientContext context;
  v1::StatusResponse status;
  ASSERT_TRUE(admin->Status(&context, {}, &status).ok());
  if (const std::string why = NoGpu(); !why.empty()) {
    EXPECT_EQ(status.backend(), "sim");
    ASSERT_EQ(status.devices_size(), 1);
    EXPECT_EQ(status.devices(0).gpu_uuid(), "SIM-GPU-0");
    daemon->Kill();
    EXPECT_THAT(daemon->Rest(), HasSubstr("serving SIMULATED memory"));
    return;
  }
  EXPECT_EQ(status.backend(), "cuda");
  absl::StatusOr<int> count = cuda::DeviceCount();
  ASSERT_TRUE(count.ok());
  ASSERT_EQ(status.devices_size(), *count);
  std::set<std::string> expected, served;
  for (int i = 0; i < *count; ++i) {
    absl::StatusOr<std::string> uuid = GpuUuid(i);
    ASSERT_TRUE(uuid.ok()) << uuid.status();
    expected.insert(*uuid);
  }
  for (const v1::DeviceStatus& d : status.devices()) {
    served.insert(d.gpu_uuid());
    EXPECT_THAT(d.gpu_uuid(), ::testing::StartsWith("GPU-"));
    EXPECT_GT(d.capacity_bytes(), 0u);
    std::printf("device %d: %s (%s), capacity %s\n", d.node_device(),
                d.gpu_uuid().c_str(), d.name().c_str(),
                FormatSize(d.capacity_bytes()).c_str());
  }
  EXPECT_EQ(served, expected);
}

TEST(CudaDriverTest, UuidsAreWrittenAsNvidiaSmiDoes) {
  CUuuid uuid = {};
  const unsigned char bytes[16] = {0x8f, 0x6e, 0x1d, 0x2c, 0x0b, 0x1a,
                                   0x4c, 0x3d, 0x9e, 0x8f, 0x7a, 0x6b,
                                   0x5c, 0x4d, 0x3e, 0xff};
  for (int i = 0; i < 16; ++i) uuid.bytes[i] = static_cast<char>(bytes[i]);
  EXPECT_EQ(cuda::FormatGpuUuid(uuid),
            "GPU-8f6e1d2c-0b1a-4c3d-9e8f-7a6b5c4d3eff");
}

TEST(CudaDriverTest, CallsWithoutADriverSaySo) {
  if (NoGpu().empty()) GTEST_SKIP() << "a driver and GPU are here";
  absl::StatusOr<cuda::MemInfo> info = cuda::MemGetInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(info.status().message(), HasSubstr("no CUDA"));
  absl::StatusOr<std::unique_ptr<CudaChunkSource>> source =
      CudaChunkSource::Create(0);
  EXPECT_THAT(source.status().message(), HasSubstr("no CUDA"));
}

// The chunk source alone, in this process: exported chunks import, map and
// hold data; dropping the last reference releases them.
// The pool never takes the last of the device: what its processes load and
// allocate beside it after start needs room (KeepFree).
TEST(CudaChunkSourceTest, NoChunkLeavesTheDeviceLessFreeThanItKeeps) {
  REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CudaChunkSource>> source =
      CudaChunkSource::Create(0);
  ASSERT_TRUE(source.ok()) << source.status();
  const size_t chunk = (*source)->Granularity();
  absl::StatusOr<cuda::MemInfo> memory = cuda::MemGetInfo();
  ASSERT_TRUE(memory.ok()) << memory.status();
  // Room for two chunks above what is kept (other processes on the GPU may
  // take some of it: then fewer are made, never one too many).
  const uint64_t keep = memory->free - 2 * chunk - chunk / 2;
  (*source)->KeepFree(keep);
  std::vector<ChunkMemory> chunks;
  absl::Status refused;
  for (int i = 0; i < 3 && refused.ok(); ++i) {
    absl::StatusOr<ChunkMemory> c = (*source)->CreateChunk(chunk);
    if (c.ok()) {
      chunks.push_back(std::move(*c));
    } else {
      refused = c.status();
    }
  }
  EXPECT_LE(chunks.size(), 2u);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find("kept free"), std::string::npos) << refused;
  memory = cuda::MemGetInfo();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GE(memory->free, keep);
  (*source)->KeepFree(0);  // no check: the device's own limit
  absl::StatusOr<ChunkMemory> c = (*source)->CreateChunk(chunk);
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(CudaChunkSourceTest, ChunksAreExportedGpuMemory) {
  REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CudaChunkSource>> source =
      CudaChunkSource::Create(0);
  ASSERT_TRUE(source.ok()) << source.status();
  const size_t chunk = (*source)->Granularity();
  EXPECT_EQ(chunk % (size_t{2} << 20), 0u);
  std::printf("%s\n", (*source)->Describe().c_str());
  {
    std::vector<ChunkMemory> chunks;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<ChunkMemory> c = (*source)->CreateChunk(chunk);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->offset, 0u);
      // The daemon keeps no FD per chunk: each claim exports one.
      EXPECT_FALSE(c->file->valid());
      chunks.push_back(std::move(*c));
    }
    EXPECT_EQ((*source)->live_chunks(), 3u);
    absl::StatusOr<std::unique_ptr<ChunkMapper>> mapper =
        MakeCudaChunkMapper(0);
    ASSERT_TRUE(mapper.ok()) << mapper.status();
    absl::StatusOr<uint64_t> range = (*mapper)->Reserve(3 * chunk);
    ASSERT_TRUE(range.ok()) << range.status();
    std::vector<ChunkMapping> mapped;
    for (size_t i = 0; i < chunks.size(); ++i) {
      absl::StatusOr<UniqueFd> fd = (*source)->OpenForClient(chunks[i]);
      ASSERT_TRUE(fd.ok()) << fd.status();
      absl::StatusOr<uint64_t> handle =
          (*mapper)->Map(*range + i * chunk, chunk, fd->get(), 0);
      ASSERT_TRUE(handle.ok()) << handle.status();
      mapped.push_back({*range + i * chunk, chunk, *handle});
    }
    // Each chunk was exported once and its export kept: the next claim of
    // a chunk gets a copy, not a new export.
    EXPECT_EQ((*source)->cached_exports(), 3u);
    absl::StatusOr<UniqueFd> again = (*source)->OpenForClient(chunks[0]);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->valid());
    EXPECT_EQ((*source)->cached_exports(), 3u);
    ASSERT_TRUE((*mapper)->EnableAccess(*range, 3 * chunk).ok());
    ASSERT_TRUE(WriteSegment(*range, 3 * chunk, chunk).ok());
    std::set<uint64_t> found;
    EXPECT_EQ(CheckSegment(*range, 3 * chunk, chunk, &found), "");
    EXPECT_EQ(found.size(), 3u);
    (*mapper)->Unmap(*range, 3 * chunk, mapped);
    (*mapper)->Free(*range, 3 * chunk);
  }
  EXPECT_EQ((*source)->live_chunks(), 0u);
  EXPECT_EQ((*source)->cached_exports(), 0u);  // released with their chunks
}

class CudaChunksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    socket_ = dir_.path() + "/allocd.sock";
    StartDaemon();
  }

  void StartDaemon() {
    std::string output;
    daemon_ = StartCudaDaemon(socket_, &output);
    ASSERT_NE(daemon_, nullptr) << output;
    admin_ = v1::Admin::NewStub(DialAdmin(socket_));
  }

  v1::StatusResponse Status() { return harness::PoolStatus(*admin_); }
  absl::Duration WaitForInUse(uint64_t bytes, absl::Duration limit) {
    return harness::WaitForInUse(*admin_, bytes, limit);
  }

  std::unique_ptr<DaemonClient> Client(std::string job = "gpu-test") {
    absl::StatusOr<std::unique_ptr<DaemonClient>> c = DaemonClient::Connect(
        {.socket = socket_,
         .job = job,
         .gpu_uuid = GpuUuid(0).value_or(""),
         .reconnect_wait = absl::Seconds(20)});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<CudaDaemonBackend> Backend(DaemonClient* client) {
    absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> b =
        CudaDaemonBackend::Create(client, 0);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  }

  std::unique_ptr<Child> Helper(const std::string& mode, uint64_t bytes) {
    return std::make_unique<Child>(std::vector<std::string>{
        Binary("CUDA_TEST_CLIENT_BINARY", CUDA_TEST_CLIENT_BINARY), mode,
        socket_, std::to_string(bytes)}, kWithStderr);
  }

  std::string Allocctl(const std::string& command) {
    Child allocctl({Binary("ALLOCCTL_BINARY", ALLOCCTL_BINARY), "--socket",
                    socket_, command},
                   kWithStderr);
    std::string out = allocctl.Rest();
    EXPECT_EQ(allocctl.Wait(), 0) << out;
    return out;
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_gpu_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

TEST_F(CudaChunksTest, SegmentIsContiguousGpuMemoryThatTheNextProcessReads) {
  std::unique_ptr<DaemonClient> client = Client();
  std::unique_ptr<CudaDaemonBackend> backend = Backend(client.get());
  ASSERT_NE(backend, nullptr);
  const uint64_t chunk = client->chunk_bytes();
  const uint64_t bytes = 4 * chunk;
  absl::StatusOr<uint64_t> segment = backend->AllocateSegment(bytes);
  ASSERT_TRUE(segment.ok()) << segment.status();
  // One memset and one copy each span all four chunks.
  ASSERT_TRUE(WriteSegment(*segment, bytes, chunk).ok());
  std::set<uint64_t> found;
  EXPECT_EQ(CheckSegment(*segment, bytes, chunk, &found), "");
  EXPECT_EQ(backend->held_bytes(), bytes);
  EXPECT_EQ(Status().in_use_bytes(), bytes);
  EXPECT_EQ(Status().chunks_created_total(), 4u);

  // Freed: unmapped here, back in the daemon's pool (cached free)...
  backend->FreeSegment(*segment, bytes);
  EXPECT_EQ(backend->held_bytes(), 0u);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_EQ(Status().free_bytes(), bytes);

  // ... and another process gets the same GPU memory, data and all.
  std::unique_ptr<Child> reader = Helper("read", bytes);
  EXPECT_EQ(reader->Line(), "verified 4");
  EXPECT_EQ(reader->Wait(), 0);
  v1::StatusResponse after = Status();
  EXPECT_EQ(after.chunks_created_total(), 4u);
  EXPECT_EQ(after.chunks_reused_total(), 4u);
}

// Transparent mode's path: the client makes what the pool has not cached;
// sharing a segment gives its memory to the daemon, which then hands it to
// the next process like memory it created (the driver exports no imported
// handle again: the daemon keeps the client's FD).
TEST_F(CudaChunksTest, MemoryTheClientMadeIsSharedAndThenServesTheNextProcess) {
  std::unique_ptr<DaemonClient> client = Client();
  std::unique_ptr<CudaDaemonBackend> backend = Backend(client.get());
  ASSERT_NE(backend, nullptr);
  backend->set_client_creates(true);
  const uint64_t chunk = client->chunk_bytes();
  const uint64_t bytes = 4 * chunk;
  absl::StatusOr<uint64_t> segment = backend->AllocateSegment(bytes);
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_TRUE(WriteSegment(*segment, bytes, chunk).ok());
  std::set<uint64_t> found;
  EXPECT_EQ(CheckSegment(*segment, bytes, chunk, &found), "");
  v1::StatusResponse status = Status();
  EXPECT_EQ(status.chunks_created_total(), 0u);
  EXPECT_EQ(status.chunks_client_made_total(), 4u);
  EXPECT_EQ(status.in_use_bytes(), bytes);

  absl::StatusOr<std::string> token = backend->ShareSegment(*segment);
  ASSERT_TRUE(token.ok()) << token.status();
  backend->FreeSegment(*segment, bytes);
  EXPECT_EQ(Status().free_bytes(), bytes);  // given, so cached

  std::unique_ptr<Child> reader = Helper("read", bytes);
  EXPECT_EQ(reader->Line(), "verified 4");
  EXPECT_EQ(reader->Wait(), 0);
  status = Status();
  EXPECT_EQ(status.chunks_reused_total(), 4u);
  EXPECT_EQ(status.chunks_created_total(), 0u);
}

TEST_F(CudaChunksTest, ExpandableRangeGrowsAndShrinksInPlace) {
  std::unique_ptr<DaemonClient> client = Client();
  std::unique_ptr<CudaDaemonBackend> backend = Backend(client.get());
  ASSERT_NE(backend, nullptr);
  const uint64_t chunk = client->chunk_bytes();
  absl::StatusOr<uint64_t> range = backend->ReserveAddressRange(64 * chunk);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE(backend->MapPages(*range, 2 * chunk).ok());
  ASSERT_TRUE(backend->MapPages(*range + 2 * chunk, 3 * chunk).ok());
  // The two growths are one contiguous range.
  ASSERT_TRUE(WriteSegment(*range, 5 * chunk, chunk).ok());
  std::set<uint64_t> found;
  EXPECT_EQ(CheckSegment(*range, 5 * chunk, chunk, &found), "");
  EXPECT_EQ(backend->held_bytes(), 5 * chunk);

  backend->UnmapPages(*range + 2 * chunk, 3 * chunk);
  EXPECT_EQ(backend->held_bytes(), 2 * chunk);
  found.clear();
  EXPECT_EQ(CheckSegment(*range, 2 * chunk, chunk, &found), "");
  // Grows again into the same addresses, with chunks from the pool.
  ASSERT_TRUE(backend->MapPages(*range + 2 * chunk, 2 * chunk).ok());
  EXPECT_EQ(Status().chunks_created_total(), 5u);
  backend->UnmapPages(*range, 4 * chunk);
  backend->ReleaseAddressRange(*range, 64 * chunk);
  EXPECT_EQ(backend->held_bytes(), 0u);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_EQ(Status().free_bytes(), 5 * chunk);
}

TEST_F(CudaChunksTest, DaemonKilledWithSigkillLeavesMappedMemoryReadable) {
  std::unique_ptr<DaemonClient> client = Client();
  std::unique_ptr<CudaDaemonBackend> backend = Backend(client.get());
  ASSERT_NE(backend, nullptr);
  const uint64_t chunk = client->chunk_bytes();
  absl::StatusOr<uint64_t> segment = backend->AllocateSegment(2 * chunk);
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_TRUE(WriteSegment(*segment, 2 * chunk, chunk).ok());

  daemon_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::set<uint64_t> found;
  EXPECT_EQ(CheckSegment(*segment, 2 * chunk, chunk, &found), "")
      << "after the daemon's SIGKILL";
  // Still writable too.
  ASSERT_TRUE(WriteSegment(*segment, 2 * chunk, chunk).ok());

  // A new daemon: the client reconnects, re-declares the two chunks it
  // maps (adopted on its word: CUDA chunks are not proven by FD), and gets
  // new memory; the old segment stays mapped and its data intact.
  StartDaemon();
  absl::StatusOr<uint64_t> fresh = backend->AllocateSegment(chunk);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(client->epoch(), 2u);
  ASSERT_TRUE(cuda::MemsetD8(*fresh, 0x33, chunk).ok());
  found.clear();
  EXPECT_EQ(CheckSegment(*segment, 2 * chunk, chunk, &found), "");
  EXPECT_EQ(Status().in_use_bytes(), 3 * chunk);  // adopted + new
  EXPECT_EQ(Status().adopted_bytes_total(), 2 * chunk);
  // Released, the adopted chunks leave the pool (it never had their
  // memory); the new daemon's own chunk is cached.
  backend->FreeSegment(*segment, 2 * chunk);
  EXPECT_EQ(Status().in_use_bytes(), chunk);
  backend->FreeSegment(*fresh, chunk);
  EXPECT_EQ(Status().free_bytes(), chunk);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

TEST_F(CudaChunksTest, ClientKilledWithSigkillGivesItsGpuChunksBack) {
  const uint64_t chunk = Status().chunk_bytes();
  std::unique_ptr<Child> holder = Helper("hold", 8 * chunk);
  ASSERT_THAT(holder->Line(), HasSubstr("ready"));
  EXPECT_EQ(Status().in_use_bytes(), 8 * chunk);
  EXPECT_EQ(Status().sessions(), 1u);
  // One 16 MiB chunk where the pool's classes allow, 8 of 2 MiB otherwise.
  const uint64_t created = Status().chunks_created_total();
  const std::string before = Allocctl("status");
  EXPECT_THAT(before, HasSubstr("backend cuda"));
  EXPECT_THAT(before, HasSubstr(absl::StrCat("pool: ", FormatSize(8 * chunk),
                                             " in use, ", FormatSize(0),
                                             " cached free")));

  holder->Kill();
  // The session ends: every chunk is back, cached free for the next one.
  const absl::Duration back = WaitForInUse(0, absl::Seconds(5));
  EXPECT_LT(back, absl::Seconds(1));
  EXPECT_EQ(Status().free_bytes(), 8 * chunk);
  EXPECT_EQ(Status().sessions(), 0u);
  const std::string after = Allocctl("status");
  std::printf("allocctl status after the client's SIGKILL (%s):\n%s",
              absl::FormatDuration(back).c_str(), after.c_str());
  EXPECT_THAT(after, HasSubstr(absl::StrCat(FormatSize(8 * chunk),
                                            " cached free")));
  EXPECT_THAT(after, HasSubstr("0 sessions"));

  // The killed process's GPU memory, data and all, goes to the next one.
  std::unique_ptr<Child> reader = Helper("read", 8 * chunk);
  EXPECT_EQ(reader->Line(), "verified 8");
  EXPECT_EQ(reader->Wait(), 0);
  EXPECT_EQ(Status().chunks_created_total(), created);  // nothing new
}

}  // namespace
}  // namespace allocd
