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
}

}  // namespace
}  // namespace allocd
