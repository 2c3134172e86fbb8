// Per-process memory caps per device (GPUHEAP_LIMIT) and the bytes this process holds on
// each device, which cudaMemGetInfo answers inside the cap and the OOM report explains.
//
// The GPUHEAP_LIMIT grammar and its parser are in options.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "format/trace.h"
#include "preload/core/options.h"

namespace gpuheap {
namespace detail {

struct DeviceBudget {
  std::atomic<std::uint64_t> limit{0};  // resolved cap in bytes, 0 = none
  std::atomic<bool> resolved{false};
  // Every byte charged to this device: pool segments and pass-through kinds alike. One
  // counter, so the cap check and the charge are one atomic step (reserve, then allocate;
  // two threads can never both pass a check that only one of them fits).
  std::atomic<std::int64_t> held_bytes{0};

  // Charges `bytes` if held + bytes stays within `lim` (0 = no cap); false changes nothing.
  bool try_charge(std::int64_t bytes, std::uint64_t lim) noexcept {
    std::int64_t cur = held_bytes.load(std::memory_order_relaxed);
    do {
      if (lim && cur + bytes > static_cast<std::int64_t>(lim)) return false;
    } while (!held_bytes.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return true;
  }
  // Unconditional: corrections to what the driver really handed out, and releases (< 0).
  void charge(std::int64_t bytes) noexcept { held_bytes.fetch_add(bytes, std::memory_order_relaxed); }
  std::int64_t held() const noexcept { return held_bytes.load(std::memory_order_relaxed); }
};

void limits_init(const char* spec) noexcept;  // from the library constructor; spec validated
DeviceBudget* budget(int device) noexcept;          // nullptr for a bad ordinal
// The cap of this device (0 = none), resolving fractions with the device's total memory.
std::uint64_t device_limit(int device) noexcept;

// Whether memory of this kind counts against the cap (device memory the process holds).
bool counts_against_limit(format::AllocKind kind) noexcept;

}  // namespace detail
}  // namespace gpuheap
