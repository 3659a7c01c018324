// Tenancy: which tenant (server/tenant_id.h) a peer belongs to, from what
// the kernel says of it, never from what it claims.
//
//   uid   the peer's uid: "uid:1001" (the default; a node of Unix users);
//   pod   the peer's Kubernetes pod: "pod:<pod UID>", read from
//         /proc/PID/cgroup (the daemon's pod needs hostPID: true to see the
//         pids of other pods); a process in no pod (the host's) is its uid's
//         tenant, "uid:1001";
//   node  every peer is one tenant, "node": one trust domain, for a node
//         that runs one tenant's jobs only.
//
// A peer whose pid the daemon cannot see (SO_PEERCRED reports pid 0 for a
// process in another PID namespace) has no tenant but under `node`: in a
// pod without hostPID every client of every other pod looks alike.
#ifndef ALLOCD_SERVER_TENANT_H_
#define ALLOCD_SERVER_TENANT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ipc/unix_socket.h"
#include "server/tenant_id.h"

namespace allocd {

enum class Tenancy { kUid, kPod, kNode };

// "uid", "pod" or "node"; InvalidArgument naming the choices otherwise.
absl::StatusOr<Tenancy> ParseTenancy(absl::string_view name);
absl::string_view TenancyName(Tenancy tenancy);

// Whether a peer under `tenancy` can have `tenant`, as Resolve names it:
// "uid:N" (a uid in decimal) under uid, and under pod for a process in no
// pod; "pod:<pod UID>" (a UUID in lower case, or 32 hex digits) under pod;
// "node" under node. InvalidArgument otherwise, saying the form this
// tenancy's tenants have: a quota for a tenant no peer can have would bind
// nobody.
absl::Status ValidateTenant(Tenancy tenancy, absl::string_view tenant);

// The pod UID in the contents of a /proc/PID/cgroup (v1: a line per
// hierarchy, v2: "0::PATH"), lower case with dashes; nullopt for a process
// in no Kubernetes pod. Knows the kubelet's layouts under both cgroup
// drivers, whatever the runtime's scope below the pod:
//   cgroupfs: /kubepods/burstable/pod<uid>/<container>
//   systemd:  /kubepods.slice/kubepods-burstable.slice/
//             kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
// (besteffort, burstable or none for guaranteed pods; cri-containerd-,
// crio-, docker- scopes; paths relative to a cgroup namespace, "/../..").
// A pod UID is a UUID, or 32 hex digits for a static pod.
std::optional<std::string> PodUidFromCgroup(absl::string_view proc_pid_cgroup);

// The tenant of each peer under one Tenancy. Thread-safe (constant).
class TenantResolver {
 public:
  // `proc` is where /proc is mounted (tests give a directory of their own).
  explicit TenantResolver(Tenancy tenancy, std::string proc = "/proc");

  Tenancy tenancy() const { return tenancy_; }

  // `peer`'s tenant. FailedPrecondition when its pid is 0 and the tenancy
  // is not `node`, saying why and what to set (hostPID, or --tenancy node);
  // under `pod`, Unavailable when its /proc/PID/cgroup cannot be read (the
  // process exited).
  absl::StatusOr<TenantId> Resolve(const PeerCredentials& peer) const;

 private:
  const Tenancy tenancy_;
  const std::string proc_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_TENANT_H_
