#include "server/pool_metrics.h"

namespace allocd {

void PublishPool(const DevicePool& device, Metrics& metrics) {
  const PoolStats stats = device.pool->Stats();
  metrics.Pool(device.index, device.uuid,
               {.capacity = stats.capacity,
                .in_use = stats.in_use_bytes,
                .free = stats.free_bytes,
                .chunks_created_total = stats.chunks_created_total,
                .chunks_reused_total = stats.chunks_reused_total,
                .chunks_client_made_total = stats.chunks_client_made_total,
                .trimmed_bytes_total = stats.trimmed_bytes_total,
                .adopted_bytes_total = stats.adopted_bytes_total});
  for (const auto& [id, held] : stats.sessions) {
    metrics.Held(id, held.bytes);
  }
}

}  // namespace allocd
