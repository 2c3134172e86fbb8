// summary --json's per-device "torch_memory_stats": the device's stats under the flat key
// names of torch.cuda.memory_stats() ("allocated_bytes.all.peak", "num_ooms", ...), so
// scripts written for PyTorch read gpuheap's numbers unchanged. Mapping: docs/summary-json.md.
#pragma once

#include <nlohmann/json.hpp>

#include "analyzer/model/model.h"

namespace gpuheap {

// The large_pool/small_pool keys are present only when every driver allocation on the device
// was a pool segment: gpuheap's pool splits by torch's rule (<= 1 MiB: small pool), but a
// pass-through or pitch allocation has no pool and would land in large_pool whatever its size.
bool torch_pools_honest(const DeviceState& d);
nlohmann::json torch_memory_stats_json(const DeviceState& d);

}  // namespace gpuheap
