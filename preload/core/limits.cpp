#include "preload/core/limits.h"

#include <stdio.h>
#include <unistd.h>

#include <atomic>

#include "preload/core/stderr_line.h"
#include "preload/hooks/real.h"

namespace gpuheap {
namespace preload {

namespace {

LimitSpec g_specs[kMaxDevices + 1];
DeviceBudget g_budgets[kMaxDevices];
constinit std::atomic<bool> g_devices_checked{false};

// "5:1GiB" on a machine (or CUDA_VISIBLE_DEVICES) with fewer devices caps nothing: say so
// once, naming the entries, instead of accepting it silently. Needs the driver, so it runs
// at the first cap lookup, not at load; retried while the driver cannot answer.
void check_devices_once() noexcept {
  if (g_devices_checked.load(std::memory_order_acquire)) return;
  auto count = real<Fn::cuDeviceGetCount>();
  int n = 0;
  if (!count || count(&n) != CUDA_SUCCESS) return;
  if (g_devices_checked.exchange(true)) return;
  char names[160];
  std::size_t len = 0;
  int missing = 0;
  for (int d = n < 0 ? 0 : n; d < kMaxDevices; ++d) {
    if (!g_specs[d].set) continue;
    int w = snprintf(names + len, sizeof names - len, "%s%d", missing ? ", " : "", d);
    if (w > 0 && len + static_cast<std::size_t>(w) < sizeof names) len += static_cast<std::size_t>(w);
    ++missing;
  }
  if (!missing) return;
  char line[400];
  int w = snprintf(line, sizeof line,
                   "gpuheap: GPUHEAP_LIMIT names device%s %s, but this process has %d device%s; "
                   "%s nothing (the other entries apply)\n",
                   missing == 1 ? "" : "s", names, n, n == 1 ? "" : "s",
                   missing == 1 ? "that entry caps" : "those entries cap");
  if (w > 0)
    write_stderr(line, static_cast<std::size_t>(w) < sizeof line ? static_cast<std::size_t>(w) : sizeof line - 1);
}

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
  check_devices_once();
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
    else return 0;  // not resolvable yet (no driver): try again next time
  }
  b->limit.store(lim, std::memory_order_relaxed);
  b->resolved.store(true, std::memory_order_release);
  return lim;
}

bool counts_against_limit(format::AllocKind kind) noexcept {
  // Pooled memory counts through the pool's segments (CudaUpstream), not per block.
  return kind != format::AllocKind::device_pooled && format::holds_device_memory(kind);
}

}  // namespace preload
}  // namespace gpuheap
