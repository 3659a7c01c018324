// PublishPool: a device pool's state as the daemon's pool series
// (Metrics::Pool) and what each of its sessions holds (Metrics::Held).
// Whatever changes a pool — a grant, a release, a trim, an adoption, a
// capacity fitted after a restart — publishes it after, so /metrics never
// lags a change by more than the change itself.
//
// Thread-safe (NodePool::Stats and Metrics are).
#ifndef ALLOCD_SERVER_POOL_METRICS_H_
#define ALLOCD_SERVER_POOL_METRICS_H_

#include "server/metrics.h"
#include "server/pool/device_pools.h"

namespace allocd {

void PublishPool(const DevicePool& device, Metrics& metrics);

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_METRICS_H_
