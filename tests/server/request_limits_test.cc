#include "server/request_limits.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

v1::RegisterRequest Hello() {
  v1::RegisterRequest r;
  r.set_protocol_version(kProtocolVersion);
  r.set_job("llama");
  return r;
}

TEST(RequestLimitsTest, ARegistrationSpeaksTheProtocolWithinBounds) {
  EXPECT_TRUE(CheckRegisterRequest(Hello()).ok());
  v1::RegisterRequest r = Hello();
  r.set_protocol_version(kProtocolVersion + 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckRegisterRequest(r)));
  r = Hello();
  r.set_job("no spaces");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(r)));
  r = Hello();
  r.set_device(kMaxClientDevice);
  EXPECT_TRUE(CheckRegisterRequest(r).ok());
  for (int device : {-1, kMaxClientDevice + 1}) {
    r.set_device(device);
    EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(r)));
  }
  r = Hello();
  r.set_gpu_uuid(std::string(kMaxGpuUuid, 'G'));
  EXPECT_TRUE(CheckRegisterRequest(r).ok());
  r.set_gpu_uuid(std::string(kMaxGpuUuid + 1, 'G'));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(r)));
  EXPECT_TRUE(
      CheckClientDescription(std::string(kMaxClientDescription, 'c')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckClientDescription(std::string(kMaxClientDescription + 1, 'c'))));
}

TEST(RequestLimitsTest, AutotunePreferencesNameAModeAndFewShortKeys) {
  v1::RegisterRequest r = Hello();
  for (const char* mode : {"", "off", "recommend", "apply"}) {
    r.mutable_autotune()->set_mode(mode);
    EXPECT_TRUE(CheckRegisterRequest(r).ok()) << mode;
  }
  r.mutable_autotune()->set_mode("Apply");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(r)));
  r.mutable_autotune()->set_mode("apply");
  for (size_t i = 0; i < kMaxPinnedKeys; ++i) {
    r.mutable_autotune()->add_pinned_keys(std::string(kMaxPinnedKey, 'k'));
  }
  EXPECT_TRUE(CheckRegisterRequest(r).ok());
  v1::RegisterRequest too_many = r;
  too_many.mutable_autotune()->add_pinned_keys("expandable_segments");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(too_many)));
  v1::RegisterRequest too_long = Hello();
  too_long.mutable_autotune()->add_pinned_keys(std::string(kMaxPinnedKey + 1, 'k'));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(too_long)));
  v1::RegisterRequest empty_key = Hello();
  empty_key.mutable_autotune()->add_pinned_keys("");
  EXPECT_TRUE(absl::IsInvalidArgument(CheckRegisterRequest(empty_key)));
}

TEST(RequestLimitsTest, SizesAndCountsHaveBounds) {
  EXPECT_TRUE(absl::IsInvalidArgument(CheckAcquireBytes(0, 1 << 20)));
  EXPECT_TRUE(CheckAcquireBytes(1 << 20, 1 << 20).ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckAcquireBytes((1 << 20) + 1, 1 << 20)));

  EXPECT_TRUE(absl::IsInvalidArgument(CheckReleaseIds(0)));
  EXPECT_TRUE(CheckReleaseIds(kMaxChunkIdsPerRequest).ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckReleaseIds(kMaxChunkIdsPerRequest + 1)));
  EXPECT_TRUE(CheckShareIds(0).ok());
  EXPECT_TRUE(CheckShareIds(kMaxChunkIdsPerRequest).ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckShareIds(kMaxChunkIdsPerRequest + 1)));

  EXPECT_TRUE(CheckOomMessage(std::string(kMaxOomMessage, 'm')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckOomMessage(std::string(kMaxOomMessage + 1, 'm'))));
  EXPECT_TRUE(CheckNackError(std::string(kMaxOomMessage, 'e')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckNackError(std::string(kMaxOomMessage + 1, 'e'))));
}

TEST(RequestLimitsTest, TelemetryHoldsFewEnoughStatsAndWellFormedEvents) {
  v1::TelemetryReport r;
  for (size_t i = 0; i < kMaxStats; ++i) {
    (*r.mutable_stats())[std::to_string(i)] = 1;
  }
  EXPECT_TRUE(CheckTelemetry(r).ok());
  (*r.mutable_stats())["one too many"] = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(r)));
  v1::TelemetryReport long_name;
  (*long_name.mutable_stats())[std::string(kMaxStatName, 's')] = 1;
  EXPECT_TRUE(CheckTelemetry(long_name).ok());
  (*long_name.mutable_stats())[std::string(kMaxStatName + 1, 's')] = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(long_name)));

  v1::TelemetryReport events;
  v1::EventBatch* batch = events.mutable_events();
  for (uint32_t op : {0, 1, 2, 3}) {  // 3: a step mark
    batch->add_ops(op);
    batch->add_sizes(op == 3 ? 0 : 512);
    batch->add_ids(op == 3 ? 0 : 1);
    batch->add_streams(op == 3 ? 0 : 7);
  }
  EXPECT_TRUE(CheckTelemetry(events).ok());
  v1::TelemetryReport ragged = events;
  ragged.mutable_events()->add_ops(0);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(ragged)));
  v1::TelemetryReport unknown_op = events;
  unknown_op.mutable_events()->set_ops(0, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(unknown_op)));
  v1::TelemetryReport too_many;
  for (size_t i = 0; i <= kMaxEventsPerBatch; ++i) {
    too_many.mutable_events()->add_ops(0);
    too_many.mutable_events()->add_sizes(512);
    too_many.mutable_events()->add_ids(i);
    too_many.mutable_events()->add_streams(7);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(too_many)));
  v1::TelemetryReport largest_size = events;
  largest_size.mutable_events()->set_sizes(0, kMaxEventBytes);
  EXPECT_TRUE(CheckTelemetry(largest_size).ok());
  v1::TelemetryReport past_any_device = events;
  past_any_device.mutable_events()->set_sizes(0, kMaxEventBytes + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(past_any_device)));
}

TEST(RequestLimitsTest, AnAllocatorStateHasColumnsOfOneLengthAndFitsTheMessageLimit) {
  v1::TelemetryReport r;
  v1::AllocatorState* state = r.mutable_events()->mutable_state_after();
  auto add_segment = [](v1::AllocatorState* s) {
    s->add_segment_addresses(1 << 21);
    s->add_segment_sizes(1 << 21);
    s->add_segment_streams(7);
    s->add_segment_flags(kStateSegmentSmall);
  };
  auto add_block = [](v1::AllocatorState* s) {
    s->add_block_ids(1 << 21);
    s->add_block_addresses(1 << 21);
    s->add_block_sizes(512);
    s->add_block_requested(500);
    s->add_block_flags(0);
  };
  add_segment(state);
  add_block(state);
  EXPECT_TRUE(CheckTelemetry(r).ok());
  v1::TelemetryReport ragged_segments = r;
  ragged_segments.mutable_events()->mutable_state_after()->add_segment_flags(0);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(ragged_segments)));
  v1::TelemetryReport ragged_blocks = r;
  ragged_blocks.mutable_events()->mutable_state_after()->add_block_requested(1);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(ragged_blocks)));
  v1::TelemetryReport asks_past_its_size = r;
  asks_past_its_size.mutable_events()->mutable_state_after()->set_block_requested(0, 513);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(asks_past_its_size)));
  v1::TelemetryReport huge_block = r;
  huge_block.mutable_events()->mutable_state_after()->set_block_sizes(0, kMaxEventBytes + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(huge_block)));
  v1::TelemetryReport huge_segment = r;
  huge_segment.mutable_events()->mutable_state_after()->set_segment_sizes(0, kMaxEventBytes + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(huge_segment)));
  v1::TelemetryReport too_many = r;
  while (static_cast<size_t>(too_many.events().state_after().block_ids_size()) <=
         kMaxStateBlocks) {
    add_block(too_many.mutable_events()->mutable_state_after());
  }
  EXPECT_TRUE(absl::IsInvalidArgument(CheckTelemetry(too_many)));
  // The largest state a client sends, with its report, fits the daemon's
  // 1 MiB message limit.
  v1::TelemetryReport largest;
  v1::AllocatorState* big = largest.mutable_events()->mutable_state_after();
  for (size_t i = 0; i < kMaxStateSegments; ++i) {
    big->add_segment_addresses(0x7fffffffffff - i * (1 << 21));
    big->add_segment_sizes(uint64_t{1} << 40);
    big->add_segment_streams(0x7fffffffffff);
    big->add_segment_flags(3);
  }
  for (size_t i = 0; i < kMaxStateBlocks; ++i) {
    big->add_block_ids(0x7fffffffffff - i);
    big->add_block_addresses(0x7fffffffffff - i);
    big->add_block_sizes(uint64_t{1} << 40);
    big->add_block_requested(uint64_t{1} << 40);
    big->add_block_flags(1);
  }
  largest.set_session_secret(std::string(32, 's'));
  largest.set_session_id(UINT64_MAX);
  EXPECT_TRUE(CheckTelemetry(largest).ok());
  EXPECT_LT(largest.ByteSizeLong(), size_t{1} << 20);
}

}  // namespace
}  // namespace allocd
