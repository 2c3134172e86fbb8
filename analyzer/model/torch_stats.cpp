#include "analyzer/model/torch_stats.h"

#include <string>

namespace gpuheap {

bool torch_pools_honest(const DeviceState& d) {
  return d.stat[kDeviceAllocs][kAllPools].allocated == d.stat[kSegments][kAllPools].allocated;
}

nlohmann::json torch_memory_stats_json(const DeviceState& d) {
  // torch's array stats: NAME.{all,large_pool,small_pool}.{current,peak,allocated,freed}.
  static const std::pair<const char*, Metric> kArrays[] = {
      {"allocation", kAllocations},
      {"segment", kSegments},
      {"active", kActiveAllocs},
      {"inactive_split", kInactiveSplit},
      {"allocated_bytes", kAllocatedBytes},
      {"reserved_bytes", kReservedBytes},
      {"active_bytes", kActiveBytes},
      {"inactive_split_bytes", kInactiveSplitBytes},
      {"requested_bytes", kRequestedBytes},
  };
  static const std::pair<const char*, PoolIndex> kPools[] = {{"all", kAllPools},
                                                             {"large_pool", kLargePool},
                                                             {"small_pool", kSmallPool}};
  const bool pools = torch_pools_honest(d);
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const std::string& prefix, const Stat& s) {
    j[prefix + ".current"] = s.current;
    j[prefix + ".peak"] = s.peak;
    j[prefix + ".allocated"] = s.allocated;
    j[prefix + ".freed"] = s.freed;
  };
  for (auto [name, metric] : kArrays)
    for (auto [pool_name, pool] : kPools)
      if (pool == kAllPools || pools) put(std::string(name) + "." + pool_name, d.stat[metric][pool]);
  // Single stats (no pool split in torch either).
  put("oversize_allocations", d.stat[kOversizeAllocations][kAllPools]);
  put("oversize_segments", d.stat[kOversizeSegments][kAllPools]);
  j["num_alloc_retries"] = d.num_alloc_retries;
  j["num_ooms"] = d.num_ooms;
  // Every cudaMalloc-like call the job's device memory came from: pool segments plus
  // pass-through and pitch allocations (torch counts its own cudaMalloc/cudaFree calls).
  j["num_device_alloc"] = d.stat[kDeviceAllocs][kAllPools].allocated;
  j["num_device_free"] = d.stat[kDeviceAllocs][kAllPools].freed;
  return j;
}

}  // namespace gpuheap
