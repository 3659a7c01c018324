// SplitGrant (client/received_chunks.h): a read-ahead's answer parted into
// the grants it holds.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "client/received_chunks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A grant of chunks of `sizes`, ids from 10, each with an FD of its own.
ReceivedChunks GrantOf(std::vector<uint64_t> sizes, uint32_t reused) {
  ReceivedChunks grant{.epoch = 3, .reused = reused};
  for (uint64_t size : sizes) {
    grant.ids.push_back(10 + grant.ids.size());
    grant.fds.emplace_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
    grant.offsets.push_back(0);
    grant.sizes.push_back(size);
  }
  return grant;
}

TEST(SplitGrantTest, EachGrantIsItsChunksInOrderWithItsFds) {
  absl::StatusOr<std::vector<ReceivedChunks>> grants =
      SplitGrant(GrantOf({16 * kMiB, 2 * kMiB, 2 * kMiB, 16 * kMiB, 2 * kMiB,
                          2 * kMiB},
                         /*reused=*/4),
                 20 * kMiB);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(grants->size(), 2u);
  EXPECT_THAT((*grants)[0].ids, ElementsAre(10, 11, 12));
  EXPECT_THAT((*grants)[1].ids, ElementsAre(13, 14, 15));
  for (const ReceivedChunks& grant : *grants) {
    EXPECT_EQ(grant.epoch, 3u);
    EXPECT_EQ(grant.bytes(), 20 * kMiB);
    ASSERT_EQ(grant.fds.size(), 3u);
    for (const UniqueFd& fd : grant.fds) EXPECT_GE(fd.get(), 0);
  }
  // The reused chunks counted first.
  EXPECT_EQ((*grants)[0].reused, 3u);
  EXPECT_EQ((*grants)[1].reused, 1u);
}

TEST(SplitGrantTest, ChunksAcrossABoundaryOrALeftoverAreRefused) {
  absl::StatusOr<std::vector<ReceivedChunks>> across =
      SplitGrant(GrantOf({16 * kMiB, 16 * kMiB}, 2), 20 * kMiB);
  EXPECT_EQ(across.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(across.status().message(), HasSubstr("crosses the end"));
  absl::StatusOr<std::vector<ReceivedChunks>> leftover =
      SplitGrant(GrantOf({16 * kMiB, 4 * kMiB, 2 * kMiB}, 3), 20 * kMiB);
  EXPECT_EQ(leftover.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(leftover.status().message(), HasSubstr("not whole grants"));
  ReceivedChunks no_fds = GrantOf({20 * kMiB}, 1);
  no_fds.fds.clear();
  EXPECT_EQ(SplitGrant(std::move(no_fds), 20 * kMiB).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitGrant(GrantOf({20 * kMiB}, 1), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SplitGrantTest, ClientMadeChunksStayWithTheirGrants) {
  ReceivedChunks answer =
      GrantOf({16 * kMiB, 4 * kMiB, 16 * kMiB, 4 * kMiB, 16 * kMiB, 4 * kMiB},
              /*reused=*/2);
  // The last two grants are the client's to make: no FDs.
  answer.client_made = 4;
  for (size_t i = 2; i < answer.fds.size(); ++i) answer.fds[i].reset();
  absl::StatusOr<std::vector<ReceivedChunks>> grants =
      SplitGrant(std::move(answer), 20 * kMiB);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(grants->size(), 3u);
  EXPECT_EQ((*grants)[0].client_made, 0u);
  EXPECT_EQ((*grants)[0].reused, 2u);
  EXPECT_EQ((*grants)[1].client_made, 2u);
  EXPECT_EQ((*grants)[2].client_made, 2u);
  EXPECT_THAT((*grants)[2].ids, ElementsAre(14, 15));
  EXPECT_FALSE((*grants)[2].fds[0].valid());
}

}  // namespace
}  // namespace allocd
