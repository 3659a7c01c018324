// Snapshot -> Trace: events, ids, streams, segments, devices, gzip, errors,
// and the real traces shipped in traces/.
#include "allocator/trace/snapshot_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/trace/trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kSourceDir = ALLOCD_SOURCE_DIR;

// ---------------------------------------------------------------------------
// Building snapshot pickles in C++ (protocol 2, no memo).

using Scalar = std::variant<int64_t, std::string>;
using Dict = std::vector<std::pair<std::string, Scalar>>;

class PickleWriter {
 public:
  PickleWriter() : out_("\x80\x02") {}

  PickleWriter& Int(int64_t v) {
    // LONG1 with 8 bytes covers every int64_t.
    out_ += "\x8a\x08";
    for (int i = 0; i < 8; ++i) {
      out_ += static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
    }
    return *this;
  }
  PickleWriter& Str(const std::string& s) {
    out_ += 'X';
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>(s.size() >> (8 * i));
    out_ += s;
    return *this;
  }
  PickleWriter& Value(const Scalar& v) {
    return std::holds_alternative<int64_t>(v) ? Int(std::get<int64_t>(v))
                                              : Str(std::get<std::string>(v));
  }
  PickleWriter& FlatDict(const Dict& dict) {
    BeginDict();
    for (const auto& [key, value] : dict) Str(key).Value(value);
    return EndDict();
  }
  PickleWriter& BeginDict() { return Raw("}("); }
  PickleWriter& EndDict() { return Raw("u"); }
  PickleWriter& BeginList() { return Raw("]("); }
  PickleWriter& EndList() { return Raw("e"); }
  PickleWriter& Raw(std::string_view opcodes) {
    out_ += opcodes;
    return *this;
  }
  std::string Finish() { return out_ + "."; }

 private:
  std::string out_;
};

Dict Event(const std::string& action, int64_t addr, int64_t size,
           int64_t stream = 0, int64_t time_us = 17) {
  return {{"action", action},
          {"addr", addr},
          {"size", size},
          {"stream", stream},
          {"time_us", time_us},
          {"compile_context", std::string("N/A")},
          {"user_metadata", std::string("")}};
}

// A snapshot dict with these device traces and, unless nullopt, this
// PYTORCH_CUDA_ALLOC_CONF.
std::string Snapshot(const std::vector<std::vector<Dict>>& devices,
                     std::optional<std::string> conf = std::nullopt) {
  PickleWriter w;
  w.BeginDict().Str("segments").Raw("]").Str("device_traces").BeginList();
  for (const std::vector<Dict>& events : devices) {
    w.BeginList();
    for (const Dict& e : events) w.FlatDict(e);
    w.EndList();
  }
  w.EndList();
  if (conf) {
    w.Str("allocator_settings")
        .FlatDict({{"PYTORCH_CUDA_ALLOC_CONF", *conf},
                   {"max_split_size", int64_t{-1}}});
  }
  return w.EndDict().Finish();
}

std::string Gzip(const std::string& data) {
  z_stream zs = {};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8,
                         Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string ErrorOf(const std::string& bytes, int device = -1) {
  absl::StatusOr<Trace> trace = ParseSnapshot(bytes, {device});
  if (trace.ok()) return "parsed";
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(trace.status().message());
}

constexpr TraceOp kAlloc = TraceOp::kAlloc;
constexpr TraceOp kFreeRequested = TraceOp::kFreeRequested;
constexpr TraceOp kFreeCompleted = TraceOp::kFreeCompleted;

// ---------------------------------------------------------------------------
// Events.

TEST(SnapshotReaderTest, AllocsGetDenseIdsAndFreesFollowTheAddress) {
  const std::string snapshot = Snapshot({{
      Event("segment_alloc", 0x1000, 4096),
      Event("alloc", 0x1000, 100),
      Event("alloc", 0x1200, 200),
      Event("free_requested", 0x1000, 100),
      Event("free_completed", 0x1000, 100),
      Event("alloc", 0x1000, 300),  // The address again: a new id.
      Event("segment_alloc", 0x9000, 8192),
      Event("free_requested", 0x1200, 200),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(
      trace->events,
      ElementsAre(TraceEvent{kAlloc, 0, 0, 100}, TraceEvent{kAlloc, 0, 1, 200},
                  TraceEvent{kFreeRequested, 0, 0, 100},
                  TraceEvent{kFreeCompleted, 0, 0, 100},
                  TraceEvent{kAlloc, 0, 2, 300},
                  TraceEvent{kFreeRequested, 0, 1, 200}));
  EXPECT_EQ(trace->num_ids, 3u);
  ASSERT_EQ(trace->recorded_segments.size(), 2u);
  EXPECT_EQ(trace->recorded_segments[0].address, 0x1000u);
  EXPECT_EQ(trace->recorded_segments[0].size, 4096u);
  EXPECT_EQ(trace->recorded_segments[0].before_event, 0u);
  EXPECT_EQ(trace->recorded_segments[1].address, 0x9000u);
  EXPECT_EQ(trace->recorded_segments[1].before_event, 5u);
  EXPECT_EQ(trace->device, 0);
  EXPECT_EQ(trace->omitted, OmittedEvents{});
}

TEST(SnapshotReaderTest, StreamsAreSortedHandles) {
  const std::string snapshot = Snapshot({{
      Event("alloc", 0x100, 1, 0x70),
      Event("alloc", 0x200, 2, 0x30),
      Event("alloc", 0x300, 3, 0),
      Event("alloc", 0x400, 4, 0x70),
      // A free takes its alloc's stream, whatever its own says.
      Event("free_requested", 0x200, 2, 0x70),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->streams, ElementsAre(0u, 0x30u, 0x70u));
  EXPECT_THAT(
      trace->events,
      ElementsAre(TraceEvent{kAlloc, 2, 0, 1}, TraceEvent{kAlloc, 1, 1, 2},
                  TraceEvent{kAlloc, 0, 2, 3}, TraceEvent{kAlloc, 2, 3, 4},
                  TraceEvent{kFreeRequested, 1, 1, 2}));
}

TEST(SnapshotReaderTest, OtherActionsAreCountedNotReplayed) {
  const std::string snapshot = Snapshot({{
      Event("alloc", 0x100, 1),
      Event("segment_free", 0x5000, 4096),
      Event("segment_map", 0x6000, 2 << 20),
      Event("segment_map", 0x8000, 2 << 20),
      Event("segment_unmap", 0x6000, 2 << 20),
      Event("snapshot", 0, 0),
      Event("oom", 1 << 20, 1 << 30),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->events.size(), 1u);
  OmittedEvents expected;
  expected.segment_free = 1;
  expected.segment_map = 2;
  expected.segment_unmap = 1;
  expected.snapshot = 1;
  expected.oom = 1;
  EXPECT_EQ(trace->omitted, expected);
}

// Recording that began after some blocks were allocated: their frees have
// no alloc to pair with, and are dropped and counted.
TEST(SnapshotReaderTest, FreesOfUnknownAddressesAreSkipped) {
  const std::string snapshot = Snapshot({{
      Event("free_requested", 0x100, 10),
      Event("alloc", 0x200, 20),
      Event("free_completed", 0x100, 10),
      Event("free_requested", 0x200, 20),
      Event("free_completed", 0x200, 20),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->events, ElementsAre(TraceEvent{kAlloc, 0, 0, 20},
                                         TraceEvent{kFreeRequested, 0, 0, 20},
                                         TraceEvent{kFreeCompleted, 0, 0, 20}));
  EXPECT_EQ(trace->omitted.unmatched_frees, 2u);
}

// Each replayed event keeps the time of the snapshot event that made it,
// also when events before it were dropped: a replay paced by them runs at
// the recorded rate.
TEST(SnapshotReaderTest, EventTimesFollowTheEventsTheyMade) {
  const std::string snapshot = Snapshot({{
      Event("free_requested", 0x100, 10, 0, 1000),
      Event("alloc", 0x200, 20, 0, 1010),
      Event("segment_alloc", 0x300, 2 << 20, 0, 1015),
      Event("free_completed", 0x100, 10, 0, 1020),
      Event("free_requested", 0x200, 20, 0, 1500),
      Event("free_completed", 0x200, 20, 0, 2600),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 3u);
  EXPECT_THAT(trace->event_times_us, ElementsAre(1010, 1500, 2600));
}

// One event without a time leaves nothing to pace by.
TEST(SnapshotReaderTest, ATraceWithAnUntimedEventHasNoTimes) {
  Dict untimed = Event("free_requested", 0x200, 20);
  untimed.erase(std::remove_if(untimed.begin(), untimed.end(),
                               [](const auto& field) {
                                 return field.first == "time_us";
                               }),
                untimed.end());
  const std::string snapshot = Snapshot({{
      Event("alloc", 0x200, 20),
      untimed,
      Event("free_completed", 0x200, 20),
  }});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->events.size(), 3u);
  EXPECT_TRUE(trace->event_times_us.empty());
}

// PyTorch never hands out an address again before its free_completed, so
// such a trace lost events: an error, not a guess.
TEST(SnapshotReaderTest, InconsistentFreesAreErrors) {
  EXPECT_EQ(
      ErrorOf(Snapshot({{Event("alloc", 0x100, 1), Event("alloc", 0x100, 2)}})),
      "snapshot: device_traces[0][1]: alloc at 0x100, which holds a live "
      "block since alloc #0 (its free_completed is missing)");
  EXPECT_EQ(ErrorOf(Snapshot(
                {{Event("alloc", 0x100, 1), Event("free_requested", 0x100, 1),
                  Event("alloc", 0x100, 2)}})),
            "snapshot: device_traces[0][2]: alloc at 0x100, which holds a live "
            "block since alloc #0 (its free_completed is missing)");
  EXPECT_EQ(ErrorOf(Snapshot(
                {{Event("alloc", 0x100, 1), Event("free_requested", 0x100, 1),
                  Event("free_requested", 0x100, 1)}})),
            "snapshot: device_traces[0][2]: second free_requested of 0x100 "
            "(alloc #0)");
  EXPECT_EQ(ErrorOf(Snapshot({{Event("alloc", 0x100, 1),
                               Event("free_completed", 0x100, 1)}})),
            "snapshot: device_traces[0][1]: free_completed without "
            "free_requested of 0x100 (alloc #0)");
}

TEST(SnapshotReaderTest, ErrorsNameTheEventAndTheField) {
  Dict no_size = Event("alloc", 0x100, 1);
  no_size.erase(no_size.begin() + 2);
  EXPECT_EQ(ErrorOf(Snapshot({{Event("alloc", 0x200, 1), no_size}})),
            "snapshot: device_traces[0][1]: missing 'size'");
  Dict text_addr = Event("free_requested", 0, 1);
  text_addr[1].second = std::string("0x100");
  EXPECT_EQ(ErrorOf(Snapshot({{text_addr}})),
            "snapshot: device_traces[0][0]: 'addr' is str, expected int");
  EXPECT_EQ(ErrorOf(Snapshot({{Event("alloc", 0x100, -5)}})),
            "snapshot: device_traces[0][0]: 'size' is -5, expected a "
            "non-negative int");
  EXPECT_EQ(ErrorOf(Snapshot({{Event("alloc", 0x100, 1, -1)}})),
            "snapshot: device_traces[0][0]: 'stream' is -1, expected a "
            "non-negative int");
  EXPECT_EQ(ErrorOf(Snapshot({{Event("realloc", 0x100, 1)}})),
            "snapshot: device_traces[0][0]: unknown action 'realloc'");
  Dict no_action = Event("alloc", 0x100, 1);
  no_action.erase(no_action.begin());
  EXPECT_EQ(ErrorOf(Snapshot({{no_action}})),
            "snapshot: device_traces[0][0]: missing 'action'");
  // 2^64 does not fit.
  const std::string big_addr =
      PickleWriter()
          .BeginDict()
          .Str("device_traces")
          .BeginList()
          .BeginList()
          .BeginDict()
          .Str("action")
          .Str("alloc")
          .Str("addr")
          .Raw(std::string("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01", 11))
          .EndDict()
          .EndList()
          .EndList()
          .EndDict()
          .Finish();
  EXPECT_EQ(ErrorOf(big_addr),
            "snapshot: device_traces[0][0]: 'addr' does not fit in 64 bits");
  EXPECT_EQ(ErrorOf(PickleWriter().BeginList().EndList().Finish()),
            "snapshot: the pickle holds a list, not the dict of "
            "torch.cuda.memory._snapshot()");
  EXPECT_EQ(ErrorOf(PickleWriter().BeginDict().EndDict().Finish()),
            "snapshot: no 'device_traces': not a torch.cuda.memory._snapshot() "
            "pickle");
  EXPECT_EQ(ErrorOf(PickleWriter()
                        .BeginDict()
                        .Str("device_traces")
                        .BeginList()
                        .Int(3)
                        .EndList()
                        .EndDict()
                        .Finish()),
            "snapshot: device_traces[0] is int, expected list");
  EXPECT_EQ(ErrorOf(PickleWriter()
                        .BeginDict()
                        .Str("device_traces")
                        .BeginList()
                        .BeginList()
                        .Int(3)
                        .EndList()
                        .EndList()
                        .EndDict()
                        .Finish()),
            "snapshot: device_traces[0][0]: is int, expected dict");
}

TEST(SnapshotReaderTest, RecordedConfigComesFromAllocatorSettings) {
  absl::StatusOr<Trace> trace = ParseSnapshot(
      Snapshot({{Event("alloc", 0x100, 1)}}, "expandable_segments:True"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->recorded_config, "expandable_segments:True");
  // Snapshots of PyTorch before allocator_settings existed.
  trace = ParseSnapshot(Snapshot({{Event("alloc", 0x100, 1)}}));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->recorded_config, "");
}

// ---------------------------------------------------------------------------
// Devices.

TEST(SnapshotReaderTest, ChoosesTheOnlyDeviceWithEvents) {
  const std::string snapshot = Snapshot({{}, {Event("alloc", 0x100, 1)}, {}});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->device, 1);
  EXPECT_EQ(trace->events.size(), 1u);
  // An explicit device may be empty.
  trace = ParseSnapshot(snapshot, {2});
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->device, 2);
  EXPECT_TRUE(trace->events.empty());
  EXPECT_EQ(ErrorOf(snapshot, 3),
            "snapshot: device 3 is out of range: device_traces has devices "
            "0..2");
  EXPECT_EQ(ErrorOf(snapshot, -2),
            "snapshot: device -2 is out of range: device_traces has devices "
            "0..2");
  EXPECT_EQ(ErrorOf(Snapshot({}), 0),
            "snapshot: device 0 is out of range: device_traces is empty");
  EXPECT_THAT(ErrorOf(Snapshot({{}, {}})),
              HasSubstr("snapshot: no device has trace events (call "
                        "torch.cuda.memory._record_memory_history()"));
}

// PyTorch writes addresses as unsigned 64-bit ints: one at or above 2^63
// (a LONG1 of 9 bytes, the last 0) is an address like any other.
TEST(SnapshotReaderTest, AddressesAbove2To63AreRead) {
  // 0xfffe000000000000 and 0x8000000000000000, little-endian, then the
  // sign byte.
  const std::string high(
      "\x8a\x09\x00\x00\x00\x00\x00\x00\xfe\xff\x00", 11);
  const std::string top_bit(
      "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00", 11);
  PickleWriter w;
  w.BeginDict().Str("device_traces").BeginList().BeginList();
  for (const auto& [action, addr] :
       {std::pair<std::string, std::string>{"segment_alloc", top_bit},
        {"alloc", high},
        {"free_requested", high},
        {"free_completed", high}}) {
    w.BeginDict()
        .Str("action").Str(action)
        .Str("addr").Raw(addr)
        .Str("size").Int(action == "segment_alloc" ? 2 << 20 : 100)
        .Str("stream").Int(0)
        .EndDict();
  }
  const std::string snapshot = w.EndList().EndList().EndDict().Finish();
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->events, ElementsAre(TraceEvent{kAlloc, 0, 0, 100},
                                         TraceEvent{kFreeRequested, 0, 0, 100},
                                         TraceEvent{kFreeCompleted, 0, 0, 100}));
  ASSERT_EQ(trace->recorded_segments.size(), 1u);
  EXPECT_EQ(trace->recorded_segments[0].address, uint64_t{1} << 63);
}

// The other devices with events are named: a replay covers one.
TEST(SnapshotReaderTest, OtherDevicesWithEventsAreNamed) {
  const std::string snapshot = Snapshot(
      {{Event("alloc", 0x100, 1)}, {}, {Event("alloc", 0x100, 1)}});
  absl::StatusOr<Trace> trace = ParseSnapshot(snapshot, {2});
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->partial.other_devices, ElementsAre(0));
  trace = ParseSnapshot(Snapshot({{Event("alloc", 0x100, 1)}}));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_TRUE(trace->partial.other_devices.empty());
}

// tests/trace/testdata/two_devices.pickle: written by Python's pickle (see
// make_two_devices.py), with stack frames and a shared memo.
TEST(SnapshotReaderTest, TwoDeviceSnapshotFromPython) {
  const std::string path =
      kSourceDir + "/tests/trace/testdata/two_devices.pickle";
  EXPECT_THAT(ReadSnapshotFile(path).status().message(),
              HasSubstr("snapshot: devices 0, 1 have trace events: choose one "
                        "of them"));

  absl::StatusOr<Trace> d0 = ReadSnapshotFile(path, {0});
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->device, 0);
  EXPECT_THAT(d0->events, ElementsAre(TraceEvent{kAlloc, 0, 0, 500},
                                      TraceEvent{kAlloc, 0, 1, 1000},
                                      TraceEvent{kFreeRequested, 0, 1, 1000},
                                      TraceEvent{kFreeCompleted, 0, 1, 1000}));
  EXPECT_THAT(d0->streams, ElementsAre(0u));
  ASSERT_EQ(d0->recorded_segments.size(), 1u);
  EXPECT_EQ(d0->recorded_segments[0].address, 0x7F0000000000u);
  EXPECT_EQ(d0->recorded_segments[0].size, 2097152u);
  EXPECT_EQ(d0->omitted.oom, 1u);
  EXPECT_EQ(d0->recorded_config,
            "expandable_segments:False,max_split_size_mb:128");

  absl::StatusOr<Trace> d1 = ReadSnapshotFile(path, {1});
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->device, 1);
  // Handles 7 and 3: indices 1 and 0.
  EXPECT_THAT(d1->streams, ElementsAre(3u, 7u));
  EXPECT_THAT(d1->events, ElementsAre(TraceEvent{kAlloc, 1, 0, 4096},
                                      TraceEvent{kAlloc, 0, 1, 8192},
                                      TraceEvent{kFreeRequested, 1, 0, 4096},
                                      TraceEvent{kAlloc, 1, 2, 100},
                                      TraceEvent{kFreeCompleted, 1, 0, 4096}));
  EXPECT_EQ(d1->num_ids, 3u);
  ASSERT_EQ(d1->recorded_segments.size(), 1u);
  EXPECT_EQ(d1->recorded_segments[0].address, 0x7F1000000000u);
  EXPECT_EQ(d1->omitted.segment_free, 1u);
}

// ---------------------------------------------------------------------------
// Files and gzip.

TEST(SnapshotReaderTest, ReadsGzipLikeThePlainPickle) {
  const std::string snapshot = Snapshot(
      {{Event("alloc", 0x100, 1), Event("free_requested", 0x100, 1)}}, "");
  absl::StatusOr<Trace> plain = ParseSnapshot(snapshot);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Trace> gz = ParseSnapshot(Gzip(snapshot));
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(gz->events, plain->events);
  // Two members (`cat a.gz b.gz`) and zero padding, as Python's gzip reads.
  const size_t half = snapshot.size() / 2;
  gz = ParseSnapshot(Gzip(snapshot.substr(0, half)) +
                     Gzip(snapshot.substr(half)) + std::string(7, '\0'));
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(gz->events, plain->events);
}

TEST(SnapshotReaderTest, CorruptGzipIsAnError) {
  const std::string gz =
      Gzip(Snapshot({{Event("alloc", 0x100, 1)}}, "max_split_size_mb:20"));
  EXPECT_THAT(ErrorOf(gz.substr(0, gz.size() - 10)),
              HasSubstr("gzip: the stream is truncated"));
  std::string flipped = gz;
  flipped[gz.size() / 2] ^= 0x55;
  EXPECT_THAT(ErrorOf(flipped), HasSubstr("gzip: corrupt data"));
  std::string bad_crc = gz;
  bad_crc[gz.size() - 6] ^= 0x01;
  EXPECT_THAT(ErrorOf(bad_crc), HasSubstr("incorrect data check"));
  EXPECT_THAT(ErrorOf(gz + "garbage"), HasSubstr("gzip: corrupt data"));
  // Every truncation is an error, never a crash.
  for (size_t n = 2; n < gz.size(); ++n) {
    EXPECT_FALSE(ParseSnapshot(gz.substr(0, n)).ok()) << n;
  }
}

TEST(SnapshotReaderTest, MissingFileIsNotFound) {
  absl::StatusOr<Trace> trace = ReadSnapshotFile("/nonexistent/x.pickle");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(trace.status().message(),
              HasSubstr("cannot open /nonexistent/x.pickle"));
}

TEST(SnapshotReaderTest, FileErrorsNameTheFile) {
  const std::string path = testing::TempDir() + "/not_a_snapshot.pickle";
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fputs("cos\nsystem\n.", f);
  fclose(f);
  EXPECT_EQ(ReadSnapshotFile(path).status().message(),
            path +
                ": pickle: opcode GLOBAL 'os system' at offset 0 is not "
                "allowed: snapshots contain plain data only");
}

// ---------------------------------------------------------------------------
// The real traces in traces/.

struct RealTrace {
  const char* file;
  uint64_t allocs;
  uint64_t free_requested;
  uint64_t free_completed;
  uint64_t segment_allocs;
  RecordedSegment first_segment;
  // Sum of the alloc sizes.
  uint64_t allocated_bytes;
};

// Counted once with CPython:
//   d = pickle.load(gzip.open(path)); tr = d['device_traces'][0]
//   collections.Counter(e['action'] for e in tr)
//   [(e['addr'], e['size']) for e in tr if e['action'] == 'segment_alloc'][0]
//   sum(e['size'] for e in tr if e['action'] == 'alloc')
// Every event has stream 0; no address is freed without its alloc.
constexpr RealTrace kRealTraces[] = {
    {"llama_lora.pickle.gz",
     93347,
     93345,
     93345,
     289,
     {140636523069440, 132120576, 0},
     1222259351075},
    {"gpt2_full.pickle.gz",
     56629,
     56626,
     56626,
     379,
     {140320138330112, 207618048, 0},
     1226308904695},
};

TEST(SnapshotReaderTest, RealTraces) {
  for (const RealTrace& real : kRealTraces) {
    SCOPED_TRACE(real.file);
    absl::StatusOr<Trace> trace =
        ReadSnapshotFile(kSourceDir + "/traces/" + real.file);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(trace->device, 0);
    EXPECT_THAT(trace->streams, ElementsAre(0u));
    EXPECT_EQ(trace->recorded_config, "");
    EXPECT_EQ(trace->omitted, OmittedEvents{});
    EXPECT_EQ(trace->num_ids, real.allocs);
    ASSERT_EQ(trace->recorded_segments.size(), real.segment_allocs);
    EXPECT_EQ(trace->recorded_segments[0].address, real.first_segment.address);
    EXPECT_EQ(trace->recorded_segments[0].size, real.first_segment.size);
    EXPECT_EQ(trace->recorded_segments[0].before_event, 0u);

    // Per id: exactly one alloc, then at most one free_requested, then at
    // most one free_completed, all with the alloc's size and stream.
    std::vector<int> stage(trace->num_ids, 0);
    std::vector<uint64_t> size(trace->num_ids, 0);
    uint64_t counts[3] = {0, 0, 0};
    uint64_t allocated_bytes = 0;
    for (const TraceEvent& e : trace->events) {
      ASSERT_LT(e.id, trace->num_ids);
      ASSERT_EQ(e.stream, 0);
      const int op = static_cast<int>(e.op);
      ++counts[op];
      ASSERT_EQ(stage[e.id], op) << "id " << e.id;
      stage[e.id] = op + 1;
      if (e.op == kAlloc) {
        size[e.id] = e.size;
        allocated_bytes += e.size;
      }
      ASSERT_EQ(e.size, size[e.id]);
    }
    EXPECT_EQ(counts[0], real.allocs);
    EXPECT_EQ(counts[1], real.free_requested);
    EXPECT_EQ(counts[2], real.free_completed);
    EXPECT_EQ(allocated_bytes, real.allocated_bytes);
    for (size_t i = 1; i < trace->recorded_segments.size(); ++i) {
      EXPECT_LE(trace->recorded_segments[i - 1].before_event,
                trace->recorded_segments[i].before_event);
    }
  }
}

}  // namespace
}  // namespace allocd
