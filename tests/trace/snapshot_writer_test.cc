// The pickle writer (CPython's encodings, read back by our unpickler) and
// replays written as snapshots: PyTorch's keys, the engine's addresses and
// segments, cache flushes, OOMs, and round trips through the reader.
#include "allocator/trace/snapshot_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/sim_backend.h"
#include "allocator/trace/observed_backend.h"
#include "allocator/trace/pickle.h"
#include "allocator/trace/pickle_writer.h"
#include "allocator/trace/replay.h"
#include "allocator/trace/snapshot_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
const std::string kLlama =
    std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz";

// A decoded pickle as JSON, for assertions: dicts with str keys become
// objects (in key order, which nlohmann sorts), lists and tuples arrays.
nlohmann::json ToJson(const PickleDocument& doc, PickleValue v) {
  switch (v.kind()) {
    case PickleKind::kNone:
      return nullptr;
    case PickleKind::kBool:
      return doc.bool_value(v);
    case PickleKind::kInt:
      return doc.int_value(v);
    case PickleKind::kStr:
      return std::string(doc.str_value(v));
    case PickleKind::kList:
    case PickleKind::kTuple: {
      nlohmann::json array = nlohmann::json::array();
      for (PickleValue item : doc.items(v)) array.push_back(ToJson(doc, item));
      return array;
    }
    case PickleKind::kDict: {
      nlohmann::json object = nlohmann::json::object();
      for (const PickleDocument::Entry& e : doc.entries(v)) {
        object[std::string(doc.str_value(e.key))] = ToJson(doc, e.value);
      }
      return object;
    }
    default:
      ADD_FAILURE() << "unexpected " << PickleKindName(v.kind());
      return nullptr;
  }
}

nlohmann::json Decode(const std::string& pickle) {
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  EXPECT_TRUE(doc.ok()) << doc.status();
  return doc.ok() ? ToJson(*doc, doc->root()) : nullptr;
}

// ---------------------------------------------------------------------------
// PickleWriter.

std::string PickledInt(int64_t v) {
  std::string p = PickleWriter().Int(v).Finish();
  // Without the PROTO header and STOP, as the expectations below.
  return p.substr(2, p.size() - 3);
}

TEST(PickleWriterTest, IntsTakeCPythonsEncoding) {
  // pickle.dumps(v, 2)[2:-1] in CPython 3.11.
  EXPECT_EQ(PickledInt(0), std::string("K\x00", 2));
  EXPECT_EQ(PickledInt(255), "K\xff");
  EXPECT_EQ(PickledInt(256), std::string("M\x00\x01", 3));
  EXPECT_EQ(PickledInt(65536), std::string("J\x00\x00\x01\x00", 5));
  EXPECT_EQ(PickledInt(-1), "J\xff\xff\xff\xff");
  EXPECT_EQ(PickledInt(INT64_C(2147483648)),
            std::string("\x8a\x05\x00\x00\x00\x80\x00", 7));
  EXPECT_EQ(PickledInt(INT64_C(-2147483649)), "\x8a\x05\xff\xff\xff\x7f\xff");
  EXPECT_EQ(PickledInt(INT64_C(-1099511627776)),
            std::string("\x8a\x06\x00\x00\x00\x00\x00\xff", 8));
  EXPECT_EQ(PickledInt(INT64_C(139637976727552)),
            std::string("\x8a\x06\x00\x00\x00\x00\x00\x7f", 8));
  EXPECT_EQ(PickledInt(INT64_MIN),
            std::string("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80", 10));
  const std::string max_uint = PickleWriter().Uint(UINT64_MAX).Finish();
  EXPECT_EQ(max_uint.substr(2, max_uint.size() - 3),
            std::string("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11));
}

TEST(PickleWriterTest, ScalarsAndContainersReadBack) {
  PickleWriter w;
  w.BeginDict();
  w.Str("none").None();
  w.Str("yes").Bool(true);
  w.Str("no").Bool(false);
  w.Str("big").Int(INT64_C(-5000000000));
  w.Str("utf8").Str("caf\xc3\xa9");
  w.Str("nested").BeginList().BeginList().EndList().BeginDict().EndDict();
  w.Int(7).EndList();
  w.EndDict();
  const nlohmann::json j = Decode(w.Finish());
  EXPECT_EQ(j, nlohmann::json::parse(R"({"none": null, "yes": true, "no": false,
      "big": -5000000000, "utf8": "caf\u00e9", "nested": [[], {}, 7]})"));
}

TEST(PickleWriterTest, RepeatedStrsAreMemoized) {
  PickleWriter w;
  w.BeginList();
  for (int i = 0; i < 3; ++i) w.Str("free_requested");
  w.EndList();
  const std::string pickle = w.Finish();
  // Once in full, then BINGET 0 twice.
  EXPECT_EQ(pickle.find("free_requested"), pickle.rfind("free_requested"));
  EXPECT_THAT(pickle, HasSubstr(std::string("h\x00h\x00", 4)));
  EXPECT_EQ(Decode(pickle), nlohmann::json({"free_requested", "free_requested",
                                            "free_requested"}));
}

TEST(PickleWriterTest, LongContainersGoInBatchesOfAThousand) {
  PickleWriter list;
  list.BeginList();
  for (int i = 0; i < 2500; ++i) list.None();
  list.EndList();
  EXPECT_EQ(list.Finish(), absl::StrCat("\x80\x02](", std::string(1000, 'N'),
                                        "e(", std::string(1000, 'N'), "e(",
                                        std::string(500, 'N'), "e."));

  PickleWriter dict;
  dict.BeginDict();
  for (int i = 0; i < 1500; ++i) dict.Int(i).Int(-i);
  dict.EndDict();
  const std::string pickle = dict.Finish();
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->size(doc->root()), 1500u);
  int64_t i = 0;
  for (const PickleDocument::Entry& e : doc->entries(doc->root())) {
    EXPECT_EQ(doc->int_value(e.key), i);
    EXPECT_EQ(doc->int_value(e.value), -i);
    ++i;
  }
}

// ---------------------------------------------------------------------------
// SnapshotRecorder.

struct Recorded {
  ReplayResult result;
  nlohmann::json snapshot;
  std::string pickle;
};

Recorded Record(const Trace& trace, const ReplayOptions& options = {},
                const AllocatorConfig& config = {}) {
  SnapshotRecorder recorder(trace, config);
  ReplayOptions observed = options;
  observed.observer = &recorder;
  absl::StatusOr<ReplayResult> result = Replay(trace, config, observed);
  EXPECT_TRUE(result.ok()) << result.status();
  Recorded r{result.ok() ? *result : ReplayResult{}, nullptr,
             recorder.Pickle()};
  r.snapshot = Decode(r.pickle);
  return r;
}

std::vector<std::string> Actions(const nlohmann::json& events) {
  std::vector<std::string> actions;
  for (const nlohmann::json& e : events) actions.push_back(e["action"]);
  return actions;
}

TEST(SnapshotRecorderTest, EventsCarryTheEnginesAddressesAndPyTorchsKeys) {
  TraceBuilder b;
  const uint32_t a = b.Alloc(1000);
  b.Alloc(3000);
  b.Free(a);
  Trace trace = b.Build();
  trace.streams = {0x5a};  // a CUDA stream handle
  const Recorded r = Record(trace);
  const nlohmann::json& events = r.snapshot["device_traces"][0];
  EXPECT_THAT(Actions(events), ElementsAre("segment_alloc", "alloc", "alloc",
                                           "free_requested", "free_completed"));
  const uint64_t segment = events[0]["addr"];
  EXPECT_EQ(events[0]["size"], 2 * kMiB);
  EXPECT_EQ(events[1]["addr"], segment);
  EXPECT_EQ(events[1]["size"], 1000);
  EXPECT_EQ(events[2]["addr"], segment + 1024);  // after a's rounded block
  EXPECT_EQ(events[2]["size"], 3000);
  EXPECT_EQ(events[4]["addr"], segment);
  EXPECT_EQ(events[4]["size"], 1000);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["stream"], 0x5a);
    EXPECT_EQ(events[i]["frames"], nlohmann::json::array());
    // The trace event's index: the free_requested is event 2.
    EXPECT_EQ(events[i]["time_us"], i == 0 ? 0 : i - 1);
  }

  ASSERT_EQ(r.snapshot["segments"].size(), 1u);
  const nlohmann::json& seg = r.snapshot["segments"][0];
  EXPECT_EQ(seg["address"], segment);
  EXPECT_EQ(seg["total_size"], 2 * kMiB);
  EXPECT_EQ(seg["allocated_size"], 3072);
  EXPECT_EQ(seg["active_size"], 3072);
  EXPECT_EQ(seg["requested_size"], 3000);
  EXPECT_EQ(seg["stream"], 0x5a);
  EXPECT_EQ(seg["device"], 0);
  EXPECT_EQ(seg["segment_type"], "small");
  EXPECT_EQ(seg["is_expandable"], false);
  ASSERT_EQ(seg["blocks"].size(), 3u);  // free, c, free
  EXPECT_EQ(seg["blocks"][0]["state"], "inactive");
  EXPECT_EQ(seg["blocks"][1]["state"], "active_allocated");
  EXPECT_EQ(seg["blocks"][1]["address"], segment + 1024);
  EXPECT_EQ(seg["blocks"][1]["size"], 3072);
  EXPECT_EQ(seg["blocks"][1]["requested_size"], 3000);
  EXPECT_EQ(seg["blocks"][2]["state"], "inactive");
}

TEST(SnapshotRecorderTest, PendingFreesAreActivePendingFree) {
  TraceBuilder b;
  b.Request(b.Alloc(1000));
  const Recorded r = Record(b.Build());
  EXPECT_EQ(r.snapshot["segments"][0]["blocks"][0]["state"],
            "active_pending_free");
  EXPECT_EQ(r.snapshot["segments"][0]["allocated_size"], 0);
  EXPECT_EQ(r.snapshot["segments"][0]["active_size"], 1024);
}

TEST(SnapshotRecorderTest, ACacheFlushCompletesPendingFreesFirst) {
  // a's free waits on another stream; c finds no room, so the allocator
  // synchronises (completing a's free), releases a's segment and retries.
  TraceBuilder b;
  const uint32_t a = b.Alloc(20 * kMiB);
  b.Request(a);
  b.Alloc(20 * kMiB);
  b.Alloc(20 * kMiB);
  b.Complete(a);
  ReplayOptions options;
  options.capacity = 40 * kMiB;
  const Recorded r = Record(b.Build(), options);
  EXPECT_EQ(r.result.num_alloc_retries, 1);
  EXPECT_EQ(r.result.num_ooms, 0);
  const nlohmann::json& events = r.snapshot["device_traces"][0];
  EXPECT_THAT(Actions(events),
              ElementsAre("segment_alloc", "alloc", "free_requested",
                          "segment_alloc", "alloc", "free_completed",
                          "segment_free", "segment_alloc", "alloc"));
  EXPECT_EQ(events[5]["addr"], events[1]["addr"]);
  EXPECT_EQ(events[6]["addr"], events[0]["addr"]);
  EXPECT_EQ(events[5]["time_us"], 3);  // the flushing alloc's event
}

TEST(SnapshotRecorderTest, OutOfMemoryIsAnOomEvent) {
  TraceBuilder b;
  b.Free(b.Alloc(30 * kMiB));
  b.Free(b.Alloc(50 * kMiB));  // fails, and its frees are skipped
  ReplayOptions options;
  options.capacity = 40 * kMiB;
  const Recorded r = Record(b.Build(), options);
  EXPECT_EQ(r.result.num_ooms, 1);
  const nlohmann::json& events = r.snapshot["device_traces"][0];
  EXPECT_THAT(Actions(events),
              ElementsAre("segment_alloc", "alloc", "free_requested",
                          "free_completed", "segment_free", "oom"));
  EXPECT_EQ(events[5]["size"], 50 * kMiB);
  EXPECT_EQ(events[5]["device_free"], 40 * kMiB);
  EXPECT_FALSE(events[5].contains("addr"));
}

TEST(SnapshotRecorderTest, ExpandableSegmentsMapAndUnmapPages) {
  // Stream 1's tensor needs the pages stream 0's segment caches: the
  // allocator flushes, unmapping them, and maps its own.
  TraceBuilder b;
  b.Free(b.Alloc(30 * kMiB, 0));
  b.Alloc(50 * kMiB, 1);
  ReplayOptions options;
  options.capacity = 70 * kMiB;
  AllocatorConfig config;
  config.expandable_segments = true;
  const Recorded r = Record(b.Build(), options, config);
  const nlohmann::json& events = r.snapshot["device_traces"][0];
  std::vector<std::string> actions = Actions(events);
  EXPECT_EQ(std::count(actions.begin(), actions.end(), "segment_map") +
                std::count(actions.begin(), actions.end(), "segment_unmap"),
            r.result.num_device_alloc + r.result.num_device_free);
  EXPECT_EQ(std::count(actions.begin(), actions.end(), "segment_alloc"), 0);
  EXPECT_THAT(actions, ElementsAre("segment_map", "alloc", "free_requested",
                                   "free_completed", "segment_unmap",
                                   "segment_map", "alloc"));
  EXPECT_EQ(events[4]["stream"], 0);
  EXPECT_EQ(events[5]["stream"], 1);
  for (const nlohmann::json& seg : r.snapshot["segments"]) {
    EXPECT_EQ(seg["is_expandable"], true);
  }
}

// A live process's recording (liballocd_torch's _record_memory_history):
// the recorder is fed call by call and may start on an engine in use.
class LiveRecording {
 public:
  LiveRecording() : sim_(64 * kMiB), observed_(sim_), engine_({}, &observed_) {
    trace_.streams = {0x5a};
  }
  // The engine's teardown frees its segments after the recorder is gone.
  ~LiveRecording() { observed_.Detach(); }

  void Start(size_t max_events = 0) {
    recorder_.emplace(trace_, AllocatorConfig{});
    recorder_->KeepNewest(max_events);
    observed_.Attach(&*recorder_);
  }
  Allocation Alloc(uint64_t size, uint32_t id) {
    const TraceEvent e{TraceOp::kAlloc, 0, id, size};
    if (recorder_) recorder_->OnEvent(++time_, e);
    absl::StatusOr<Allocation> a = engine_.Malloc(size, 0);
    EXPECT_TRUE(a.ok()) << a.status();
    if (recorder_) recorder_->OnBlock(e, *a);
    return *a;
  }
  void Free(const Allocation& a, uint64_t size, uint32_t id) {
    EXPECT_TRUE(engine_.Free(a).ok());
    for (TraceOp op : {TraceOp::kFreeRequested, TraceOp::kFreeCompleted}) {
      const TraceEvent e{op, 0, id, size};
      recorder_->OnEvent(++time_, e);
      recorder_->OnBlock(e, a);
    }
  }
  void EmptyCache() { engine_.EmptyCache(); }
  nlohmann::json Snapshot() {
    recorder_->OnEnd(engine_);
    return Decode(recorder_->Pickle());
  }

 private:
  Trace trace_;
  SimBackend sim_;
  ObservedBackend observed_;
  CachingAllocator engine_;
  std::optional<SnapshotRecorder> recorder_;
  uint64_t time_ = 0;
};

TEST(SnapshotRecorderTest, RecordingMayStartOnAnAllocatorInUse) {
  LiveRecording live;
  const Allocation before = live.Alloc(1000, 7);  // not recorded
  live.Start();
  live.Free(before, 1000, 7);
  live.EmptyCache();  // frees a segment the recorder never saw allocated
  const nlohmann::json snapshot = live.Snapshot();
  const nlohmann::json& events = snapshot["device_traces"][0];
  EXPECT_THAT(Actions(events),
              ElementsAre("free_requested", "free_completed", "segment_free"));
  EXPECT_EQ(events[0]["addr"], before.address);
  EXPECT_EQ(events[0]["size"], 1000);
  EXPECT_EQ(events[1]["addr"], before.address);
  EXPECT_EQ(events[1]["size"], 1000);
  EXPECT_EQ(events[2]["addr"], before.address);  // the segment's start
  EXPECT_EQ(events[2]["size"], 2 * kMiB);
  EXPECT_EQ(events[2]["stream"], 0x5a);
  EXPECT_EQ(snapshot["segments"].size(), 0u);
}

TEST(SnapshotRecorderTest, KeepsTheNewestEventsOnly) {
  LiveRecording live;
  live.Start(/*max_events=*/3);
  for (uint32_t id = 0; id < 20; ++id) {
    live.Free(live.Alloc(1000 + id, id), 1000 + id, id);
  }
  const nlohmann::json events = live.Snapshot()["device_traces"][0];
  EXPECT_THAT(Actions(events),
              ElementsAre("alloc", "free_requested", "free_completed"));
  EXPECT_EQ(events[0]["size"], 1019);
}

TEST(SnapshotRecorderTest, RecordingChangesNothingInTheReplay) {
  absl::StatusOr<Trace> trace = ReadSnapshotFile(kLlama);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ReplayOptions options;
  options.capacity = 8 * (kMiB << 10);
  options.total_memory = options.capacity;
  options.memory_fraction = 0.6;
  absl::StatusOr<ReplayResult> plain = Replay(*trace, {}, options);
  ASSERT_TRUE(plain.ok());
  const Recorded r = Record(*trace, options);
  EXPECT_EQ(r.result.peak_reserved, plain->peak_reserved);
  EXPECT_EQ(r.result.num_device_alloc, plain->num_device_alloc);
  EXPECT_EQ(r.result.num_alloc_retries, plain->num_alloc_retries);
  EXPECT_EQ(r.result.num_ooms, plain->num_ooms);
}

TEST(SnapshotRecorderTest, RealTraceRoundTripsThroughTheReader) {
  absl::StatusOr<Trace> trace = ReadSnapshotFile(kLlama);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const AllocatorConfig config = *ParseAllocatorConfig("max_split_size_mb:256");
  const Recorded r = Record(*trace, {}, config);
  ASSERT_EQ(r.result.num_ooms, 0);
  ASSERT_EQ(r.result.num_alloc_retries, 0);

  absl::StatusOr<Trace> back = ParseSnapshot(r.pickle);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->events, trace->events);
  EXPECT_EQ(back->streams, trace->streams);
  EXPECT_EQ(back->num_ids, trace->num_ids);
  EXPECT_EQ(back->device, trace->device);
  EXPECT_EQ(back->recorded_config, "max_split_size_mb:256");
  EXPECT_EQ(back->recorded_segments.size(),
            static_cast<size_t>(r.result.num_device_alloc));
  EXPECT_EQ(back->omitted, OmittedEvents{});

  // Every event is there, and the end state adds up to what the replay
  // reports.
  const nlohmann::json& events = r.snapshot["device_traces"][trace->device];
  EXPECT_EQ(events.size(), trace->events.size() + r.result.num_device_alloc);
  int64_t reserved = 0;
  size_t blocks = 0;
  for (const nlohmann::json& seg : r.snapshot["segments"]) {
    reserved += seg["total_size"].get<int64_t>();
    blocks += seg["blocks"].size();
  }
  EXPECT_EQ(reserved, r.result.stats.reserved_bytes.all().current);
  EXPECT_GT(blocks, r.snapshot["segments"].size() - 1);

  // And the read-back trace replays to the same numbers.
  absl::StatusOr<ReplayResult> again = Replay(*back, config);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->peak_reserved, r.result.peak_reserved);
}

// Every address in a snapshot: events' and segments' and blocks'.
std::vector<uint64_t> Addresses(const nlohmann::json& snapshot) {
  std::vector<uint64_t> out;
  for (const nlohmann::json& device : snapshot["device_traces"]) {
    for (const nlohmann::json& e : device) {
      if (e.contains("addr")) out.push_back(e["addr"].get<uint64_t>());
    }
  }
  for (const nlohmann::json& seg : snapshot["segments"]) {
    out.push_back(seg["address"].get<uint64_t>());
    for (const nlohmann::json& b : seg["blocks"]) {
      out.push_back(b["address"].get<uint64_t>());
    }
  }
  return out;
}

// PyTorch's memory viewer reads addresses as JavaScript numbers: exact only
// below 2^53. An expandable segment reserves 9/8 of the device: on an
// unlimited device that once wrapped the addresses past 2^63.
TEST(SnapshotRecorderTest, AddressesStayBelow2To53InEveryMode) {
  TraceBuilder b;
  for (int i = 0; i < 4; ++i) {
    const uint32_t big = b.Alloc(30 * kMiB, /*stream=*/0);
    const uint32_t other = b.Alloc(3 * kMiB, /*stream=*/1);
    const uint32_t small = b.Alloc(1000, /*stream=*/1);
    b.Free(big).Free(other).Free(small);
  }
  Trace trace = b.Build();
  trace.streams = {0, 0x5a};
  for (const char* conf :
       {"", "expandable_segments:True", "max_split_size_mb:256",
        "expandable_segments:True,roundup_power2_divisions:4"}) {
    for (const uint64_t capacity : {uint64_t{0}, uint64_t{80} << 30}) {
      ReplayOptions options;
      options.capacity = capacity;
      const Recorded r = Record(trace, options, *ParseAllocatorConfig(conf));
      const std::vector<uint64_t> addresses = Addresses(r.snapshot);
      ASSERT_FALSE(addresses.empty());
      for (const uint64_t address : addresses) {
        EXPECT_LT(address, uint64_t{1} << 53)
            << "'" << conf << "' capacity " << capacity;
      }
      absl::StatusOr<Trace> back = ParseSnapshot(r.pickle);
      ASSERT_TRUE(back.ok()) << conf << ": " << back.status();
      EXPECT_EQ(back->events.size(), trace.events.size()) << conf;
    }
  }
}

// Export, read back, replay: the same numbers in every mode, and the
// read-back trace is a whole one (nothing missing at its first event).
TEST(SnapshotRecorderTest, ExportReadReplayIsTheSameInEveryMode) {
  absl::StatusOr<Trace> trace = ReadSnapshotFile(kLlama);
  ASSERT_TRUE(trace.ok()) << trace.status();
  struct Mode {
    const char* conf;
    uint64_t capacity;
    std::optional<double> fraction;
  };
  for (const Mode& mode : {
           Mode{"", 0, std::nullopt},
           Mode{"expandable_segments:True", 0, std::nullopt},
           Mode{"expandable_segments:True", uint64_t{80} << 30, std::nullopt},
           Mode{"max_split_size_mb:256,roundup_power2_divisions:4", 0,
                std::nullopt},
           Mode{"garbage_collection_threshold:0.6", uint64_t{80} << 30, 0.1},
       }) {
    const AllocatorConfig config = *ParseAllocatorConfig(mode.conf);
    ReplayOptions options;
    options.capacity = mode.capacity;
    options.memory_fraction = mode.fraction;
    const Recorded r = Record(*trace, options, config);
    ASSERT_EQ(r.result.num_ooms, 0) << mode.conf;
    absl::StatusOr<Trace> back = ParseSnapshot(r.pickle);
    ASSERT_TRUE(back.ok()) << mode.conf << ": " << back.status();
    EXPECT_FALSE(back->partial.partial()) << mode.conf;
    EXPECT_EQ(back->events, trace->events) << mode.conf;
    absl::StatusOr<ReplayResult> again = Replay(*back, config, options);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->peak_reserved, r.result.peak_reserved) << mode.conf;
    EXPECT_EQ(again->peak_allocated, r.result.peak_allocated) << mode.conf;
    EXPECT_EQ(again->num_device_alloc, r.result.num_device_alloc) << mode.conf;
    EXPECT_EQ(again->num_device_free, r.result.num_device_free) << mode.conf;
  }
}

TEST(SnapshotRecorderTest, CudaMallocAsyncCannotBeObserved) {
  TraceBuilder b;
  b.Alloc(1000);
  SnapshotRecorder recorder(b.Build(), {});
  ReplayOptions options;
  options.observer = &recorder;
  AllocatorConfig config;
  config.backend = AllocatorBackend::kCudaMallocAsync;
  EXPECT_EQ(Replay(b.Build(), config, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// WriteSnapshotFile.

TEST(WriteSnapshotFileTest, PlainAndGzippedFilesReadBack) {
  TraceBuilder b;
  b.Free(b.Alloc(1000));
  const Trace trace = b.Build();
  const std::string pickle = Record(trace).pickle;
  absl::StatusOr<Trace> expected = ParseSnapshot(pickle);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->events.size(), 3u);
  const std::string dir = testing::TempDir();
  for (const std::string name : {"snapshot.pickle", "snapshot.pickle.gz"}) {
    const std::string path = dir + "/" + name;
    ASSERT_TRUE(WriteSnapshotFile(path, pickle).ok()) << path;
    absl::StatusOr<Trace> back = ReadSnapshotFile(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->events, expected->events) << path;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    const int first = std::fgetc(f);
    std::fclose(f);
    // A plain pickle starts with PROTO; gzip with its magic 0x1f.
    EXPECT_EQ(first, name.ends_with(".gz") ? 0x1f : 0x80) << path;
    std::remove(path.c_str());
  }
}

TEST(WriteSnapshotFileTest, AnUnwritablePathIsAnErrorThatNamesIt) {
  const absl::Status s =
      WriteSnapshotFile("/nonexistent/dir/out.pickle", PickleWriter().Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/dir/out.pickle"));
}

}  // namespace
}  // namespace allocd
