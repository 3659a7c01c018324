// TenantId: the trust domain a session belongs to. Memory, job labels,
// quotas and sessions never cross from one tenant to another; the daemon
// derives the tenant from the peer's kernel credentials (never from what a
// client says), by the --tenancy mode (server/tenant.h):
//   "uid:<uid>"  the peer's uid (--tenancy uid, the default);
//   "pod:<uid>"  the peer's Kubernetes pod, by its pod UID (--tenancy pod);
//   "node"       every peer: one trust domain (--tenancy node).
// A string so that it keys maps, labels and logs as it is; compare whole
// values only (never parse one back).
#ifndef ALLOCD_SERVER_TENANT_ID_H_
#define ALLOCD_SERVER_TENANT_ID_H_

#include <string>

namespace allocd {

// The tenant of a session, such as "uid:1001", "pod:<uid>" or "node". Empty
// is no tenant (a default-constructed value; never a registered session's).
using TenantId = std::string;

}  // namespace allocd

#endif  // ALLOCD_SERVER_TENANT_ID_H_
