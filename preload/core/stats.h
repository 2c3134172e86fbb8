// Live per-device counters behind gpuheap_stats/gpuheap_reset_peak (preload/gpuheap.h):
// requested, allocated and reserved bytes, current and peak, kept in the process so a
// program (or the pytest plugin) can ask without reading the trace. Updated where the
// allocation paths record their events (alloc.cpp, the pool's trace observer).
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace preload {

inline constexpr int kMaxStatsDevices = 64;  // devices beyond this are not counted

struct DeviceStats {
  std::uint64_t requested = 0, requested_peak = 0;
  std::uint64_t allocated = 0, allocated_peak = 0;
  std::uint64_t reserved = 0, reserved_peak = 0;
  std::uint64_t allocs = 0, frees = 0;  // successful allocations / frees of device memory
};

// An allocation of `kind` handed out (`size` bytes for `requested`): counted when the kind
// holds device memory; pass-through kinds also count as reserved (no pool in between).
void stats_alloc(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t requested,
                 std::size_t size) noexcept;
void stats_free(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t size) noexcept;
// The pool took (delta > 0) or returned (delta < 0) segment bytes on `device`.
void stats_reserve(int device, std::int64_t delta) noexcept;
// False when `device` is out of range.
bool stats_get(int device, DeviceStats* out) noexcept;
// Peaks restart from the current values; device -1: every device.
void stats_reset_peak(int device) noexcept;

}  // namespace preload
}  // namespace gpuheap
