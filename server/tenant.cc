#include "server/tenant.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace allocd {
namespace {

// A pod UID at the start of `s`, ending `s` or followed by ".slice" (the
// systemd driver's unit): 8-4-4-4-12 hex digits with '-' or '_' (systemd
// escapes the dashes), or 32 hex digits (a static pod's config hash).
std::optional<std::string> PodUidAt(absl::string_view s) {
  absl::ConsumeSuffix(&s, ".slice");
  auto hex = [](absl::string_view digits) {
    for (char c : digits) {
      if (!absl::ascii_isxdigit(c)) return false;
    }
    return true;
  };
  if (s.size() == 32 && hex(s)) return absl::AsciiStrToLower(s);
  if (s.size() != 36) return std::nullopt;
  for (size_t dash : {8, 13, 18, 23}) {
    if (s[dash] != '-' && s[dash] != '_') return std::nullopt;
  }
  std::string uid = absl::StrReplaceAll(s, {{"_", "-"}});
  if (!hex(absl::StrReplaceAll(uid, {{"-", ""}}))) return std::nullopt;
  return absl::AsciiStrToLower(uid);
}

// The pod UID one path component names: "pod<uid>" (cgroupfs) or
// "kubepods[-<qos>]-pod<uid>.slice" (systemd).
std::optional<std::string> PodUidOfComponent(absl::string_view component) {
  if (absl::ConsumePrefix(&component, "pod")) return PodUidAt(component);
  const size_t pod = component.rfind("-pod");
  if (pod == absl::string_view::npos ||
      !absl::StartsWith(component, "kubepods")) {
    return std::nullopt;
  }
  return PodUidAt(component.substr(pod + 4));
}

}  // namespace

absl::StatusOr<Tenancy> ParseTenancy(absl::string_view name) {
  if (name == "uid") return Tenancy::kUid;
  if (name == "pod") return Tenancy::kPod;
  if (name == "node") return Tenancy::kNode;
  return absl::InvalidArgumentError(absl::StrCat(
      "--tenancy must be uid, pod or node; got \"", name, "\""));
}

absl::string_view TenancyName(Tenancy tenancy) {
  switch (tenancy) {
    case Tenancy::kUid:
      return "uid";
    case Tenancy::kPod:
      return "pod";
    case Tenancy::kNode:
      return "node";
  }
  return "?";
}

absl::Status ValidateTenant(Tenancy tenancy, absl::string_view tenant) {
  absl::string_view rest = tenant;
  uint32_t uid = 0;
  const bool uid_form = absl::ConsumePrefix(&rest, "uid:") &&
                        absl::SimpleAtoi(rest, &uid) &&
                        rest == absl::StrCat(uid);
  rest = tenant;
  const bool pod_form = absl::ConsumePrefix(&rest, "pod:") &&
                        PodUidAt(rest) == std::string(rest);
  std::string form;
  switch (tenancy) {
    case Tenancy::kUid:
      if (uid_form) return absl::OkStatus();
      form = "uid:<uid>, such as uid:1001";
      break;
    case Tenancy::kPod:
      if (uid_form || pod_form) return absl::OkStatus();
      form = "pod:<pod UID> (lower case, such as "
             "pod:0f6c1b2a-9d3e-4c57-8a11-2b7c9e4d5f60), or uid:<uid> for "
             "processes in no pod";
      break;
    case Tenancy::kNode:
      if (tenant == "node") return absl::OkStatus();
      form = "node, the only tenant";
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no tenant is named \"", tenant, "\" under --tenancy ",
      TenancyName(tenancy), ": its tenants are ", form,
      " (allocctl sessions shows each session's)"));
}

std::optional<std::string> PodUidFromCgroup(absl::string_view proc_pid_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_pid_cgroup, '\n')) {
    // "ID:CONTROLLERS:PATH"; the path may hold colons of its own (some
    // runtimes name scopes "kubepods-...slice:cri-containerd:ID").
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3 || !absl::StrContains(fields[2], "kubepods")) {
      continue;
    }
    for (absl::string_view component : absl::StrSplit(fields[2], '/')) {
      for (absl::string_view part : absl::StrSplit(component, ':')) {
        if (std::optional<std::string> uid = PodUidOfComponent(part)) {
          return uid;
        }
      }
    }
  }
  return std::nullopt;
}

TenantResolver::TenantResolver(Tenancy tenancy, std::string proc)
    : tenancy_(tenancy), proc_(std::move(proc)) {}

absl::StatusOr<TenantId> TenantResolver::Resolve(
    const PeerCredentials& peer) const {
  if (tenancy_ == Tenancy::kNode) return TenantId("node");
  if (peer.pid == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "allocd cannot see this process (uid ", peer.uid,
        "): the kernel reports pid 0 for it, as for a process in another "
        "PID namespace (a pod other than the daemon's, when the daemon's "
        "pod lacks hostPID), so allocd cannot tell which tenant it belongs "
        "to. Set hostPID: true in allocd's DaemonSet, or, on a node that "
        "runs one tenant's jobs only, run allocd serve --tenancy node"));
  }
  const std::string uid_tenant = absl::StrCat("uid:", peer.uid);
  if (tenancy_ == Tenancy::kUid) return uid_tenant;
  const std::string path = absl::StrCat(proc_, "/", peer.pid, "/cgroup");
  std::ifstream file(path);
  std::stringstream contents;
  if (file.is_open()) contents << file.rdbuf();
  if (!file.is_open() || file.bad()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot read ", path, " to find the pod of pid ", peer.pid,
        " (it exited?)"));
  }
  if (std::optional<std::string> pod = PodUidFromCgroup(contents.str())) {
    return absl::StrCat("pod:", *pod);
  }
  return uid_tenant;
}

}  // namespace allocd
