#include "server/tenant.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr char kUid[] = "3f1e8c2a-1234-4d5e-9abc-0123456789ab";

TEST(PodUidFromCgroupTest, CgroupfsDriverOnCgroupV1) {
  EXPECT_EQ(PodUidFromCgroup(
                "12:pids:/kubepods/burstable/pod3f1e8c2a-1234-4d5e-9abc-"
                "0123456789ab/8f9e0d1c2b3a4958\n"
                "11:memory:/kubepods/burstable/pod3f1e8c2a-1234-4d5e-9abc-"
                "0123456789ab/8f9e0d1c2b3a4958\n"
                "1:name=systemd:/kubepods/burstable/pod3f1e8c2a-1234-4d5e-"
                "9abc-0123456789ab/8f9e0d1c2b3a4958\n"),
            kUid);
  // Guaranteed pods have no QoS level in the path.
  EXPECT_EQ(PodUidFromCgroup("4:cpu,cpuacct:/kubepods/pod3f1e8c2a-1234-4d5e-"
                             "9abc-0123456789ab/abc\n"),
            kUid);
}

TEST(PodUidFromCgroupTest, SystemdDriverOnCgroupV2WithEachRuntime) {
  for (const char* scope :
       {"cri-containerd-0123abcd.scope", "crio-0123abcd.scope",
        "docker-0123abcd.scope"}) {
    const std::string line =
        std::string("0::/kubepods.slice/kubepods-besteffort.slice/"
                    "kubepods-besteffort-pod3f1e8c2a_1234_4d5e_9abc_"
                    "0123456789ab.slice/") +
        scope + "\n";
    EXPECT_EQ(PodUidFromCgroup(line), kUid) << line;
  }
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/kubepods-pod3f1e8c2a_1234_"
                             "4d5e_9abc_0123456789ab.slice/"
                             "cri-containerd-0123.scope\n"),
            kUid);
}

TEST(PodUidFromCgroupTest, CgroupfsDriverOnCgroupV2AndUpperCase) {
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods/burstable/pod3F1E8C2A-1234-4D5E-"
                             "9ABC-0123456789AB/0123abcd\n"),
            kUid);
}

// Read from inside the daemon's own cgroup namespace, another pod's path is
// relative to the daemon's cgroup.
TEST(PodUidFromCgroupTest, PathsRelativeToACgroupNamespace) {
  EXPECT_EQ(PodUidFromCgroup("0::/../../kubepods-burstable-pod3f1e8c2a_1234_"
                             "4d5e_9abc_0123456789ab.slice/"
                             "cri-containerd-0123.scope\n"),
            kUid);
}

// Some runtimes name the scope "SLICE:RUNTIME:ID" under the runtime's own
// service (k3s, containerd's systemd cgroup in a nested layout).
TEST(PodUidFromCgroupTest, ColonSeparatedScopeNames) {
  EXPECT_EQ(PodUidFromCgroup("0::/system.slice/containerd.service/"
                             "kubepods-burstable-pod3f1e8c2a_1234_4d5e_9abc_"
                             "0123456789ab.slice:cri-containerd:0123abcd\n"),
            kUid);
}

TEST(PodUidFromCgroupTest, StaticPodsHaveAHashForUid) {
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/kubepods-burstable.slice/"
                             "kubepods-burstable-pod6e1f0a9b8c7d6e5f4a3b2c1d0"
                             "e9f8a7b.slice/cri-containerd-0123.scope\n"),
            "6e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b");
}

TEST(PodUidFromCgroupTest, ProcessesInNoPod) {
  EXPECT_EQ(PodUidFromCgroup("0::/user.slice/user-1001.slice/session-3.scope\n"),
            std::nullopt);
  EXPECT_EQ(PodUidFromCgroup("0::/system.slice/docker-0123abcd.scope\n"),
            std::nullopt);
  EXPECT_EQ(PodUidFromCgroup("0::/\n"), std::nullopt);
  EXPECT_EQ(PodUidFromCgroup(""), std::nullopt);
  // "pod" that is no pod UID, even under kubepods.
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods/podcast/abc\n"), std::nullopt);
  // A pod UID outside kubepods is not the kubelet's.
  EXPECT_EQ(PodUidFromCgroup("0::/mine/pod3f1e8c2a-1234-4d5e-9abc-"
                             "0123456789ab/x\n"),
            std::nullopt);
}

TEST(TenantResolverTest, ModesAndTheirTenants) {
  const std::filesystem::path proc =
      std::filesystem::path(testing::TempDir()) / "tenant_test_proc";
  std::filesystem::create_directories(proc / "100");
  std::filesystem::create_directories(proc / "200");
  std::ofstream(proc / "100" / "cgroup")
      << "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-"
         "pod3f1e8c2a_1234_4d5e_9abc_0123456789ab.slice/"
         "cri-containerd-0123.scope\n";
  std::ofstream(proc / "200" / "cgroup")
      << "0::/user.slice/user-1001.slice/session-3.scope\n";
  const TenantResolver pod(Tenancy::kPod, proc.string());
  EXPECT_EQ(pod.Resolve({.pid = 100, .uid = 0}).value(),
            std::string("pod:") + kUid);
  // The host's processes are their uid's tenant.
  EXPECT_EQ(pod.Resolve({.pid = 200, .uid = 1001}).value(), "uid:1001");
  EXPECT_TRUE(absl::IsUnavailable(pod.Resolve({.pid = 300, .uid = 1}).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(pod.Resolve({.pid = 0, .uid = 1}).status()));
  const TenantResolver uid(Tenancy::kUid, proc.string());
  EXPECT_EQ(uid.Resolve({.pid = 100, .uid = 1001}).value(), "uid:1001");
  const TenantResolver node(Tenancy::kNode, proc.string());
  EXPECT_EQ(node.Resolve({.pid = 0, .uid = 1001}).value(), "node");
}

// allocctl quota set --tenant 'x;y' was accepted (issue 41): a quota no
// peer could ever be bound by.
TEST(ValidateTenantTest, OnlyNamesAPeerOfTheTenancyCanHave) {
  const std::string pod = "pod:0f6c1b2a-9d3e-4c57-8a11-2b7c9e4d5f60";
  EXPECT_TRUE(ValidateTenant(Tenancy::kUid, "uid:1001").ok());
  EXPECT_TRUE(ValidateTenant(Tenancy::kUid, "uid:0").ok());
  EXPECT_TRUE(ValidateTenant(Tenancy::kPod, pod).ok());
  EXPECT_TRUE(ValidateTenant(Tenancy::kPod, "pod:" + std::string(32, 'a')).ok());
  EXPECT_TRUE(ValidateTenant(Tenancy::kPod, "uid:1001").ok());  // in no pod
  EXPECT_TRUE(ValidateTenant(Tenancy::kNode, "node").ok());
  for (const char* bad : {"x;y", "", "uid:", "uid:x", "uid:-1", "uid:01",
                          "uid:1001 ", "uid:4294967296", "node", pod.c_str()}) {
    const absl::Status s = ValidateTenant(Tenancy::kUid, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--tenancy uid")) << bad;
    EXPECT_THAT(s.message(), HasSubstr("uid:1001")) << bad;
  }
  // Resolve writes pod UIDs in lower case with dashes.
  for (const std::string& bad :
       {std::string("pod:0F6C1B2A-9D3E-4C57-8A11-2B7C9E4D5F60"),
        std::string("pod:0f6c1b2a_9d3e_4c57_8a11_2b7c9e4d5f60"),
        std::string("pod:x;y"), std::string("node")}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ValidateTenant(Tenancy::kPod, bad)))
        << bad;
  }
  const absl::Status node = ValidateTenant(Tenancy::kNode, "uid:1001");
  EXPECT_TRUE(absl::IsInvalidArgument(node));
  EXPECT_THAT(node.message(), HasSubstr("node, the only tenant"));
}

TEST(TenancyTest, Names) {
  for (Tenancy t : {Tenancy::kUid, Tenancy::kPod, Tenancy::kNode}) {
    EXPECT_EQ(ParseTenancy(TenancyName(t)).value(), t);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseTenancy("user").status()));
}

}  // namespace
}  // namespace allocd
