#include "preload/core/limits.h"

#include "preload/hooks/real.h"

namespace gpuheap {
namespace detail {

namespace {

LimitSpec g_specs[kMaxDevices + 1];
DeviceBudget g_budgets[kMaxDevices];

}  // namespace

void limits_init(const char* spec) noexcept {
  // read_settings() validated the text and warned about an invalid one: then it is "".
  if (!parse_limit(spec, g_specs))
    for (auto& s : g_specs) s = LimitSpec{};
}

DeviceBudget* budget(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return &g_budgets[device];
}

std::uint64_t device_limit(int device) noexcept {
  DeviceBudget* b = budget(device);
  if (!b) return 0;
  if (b->resolved.load(std::memory_order_acquire)) return b->limit.load(std::memory_order_relaxed);
  const LimitSpec& s = g_specs[device].set ? g_specs[device] : g_specs[kMaxDevices];
  std::uint64_t lim = 0;
  if (s.set && !s.fraction) {
    lim = static_cast<std::uint64_t>(s.value);
  } else if (s.set) {
    auto get = real<Fn::cuDeviceGet>();
    auto total = real<Fn::cuDeviceTotalMem_v2>();
    CUdevice d = 0;
    size_t t = 0;
    if (get && total && get(&d, device) == CUDA_SUCCESS && total(&t, d) == CUDA_SUCCESS)
      lim = static_cast<std::uint64_t>(s.value * static_cast<double>(t));
    else
      return 0;  // not resolvable yet (no driver): try again next time
  }
  b->limit.store(lim, std::memory_order_relaxed);
  b->resolved.store(true, std::memory_order_release);
  return lim;
}

bool counts_against_limit(format::AllocKind kind) noexcept {
  // Pooled memory counts through the pool's segments (CudaUpstream), not per block.
  return kind != format::AllocKind::device_pooled && format::holds_device_memory(kind);
}

}  // namespace detail
}  // namespace gpuheap
