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
namespace preload {

struct DeviceBudget {
  std::atomic<std::uint64_t> limit{0};  // resolved cap in bytes, 0 = none
  std::atomic<bool> resolved{false};
  // Every byte charged to this device: pool segments and pass-through kinds alike. One
  // counter, so the cap check and the charge are one atomic step (reserve, then allocate;
  // two threads can never both pass a check that only one of them fits).
  std::atomic<std::int64_t> held_bytes{0};

  // No device holds this much (4 EiB); a request past it is never charged. As a signed
  // charge a SIZE_MAX request was -1: it lowered `held` (the OOM report then said "held by
  // this process 16777216.00 TiB") and passed any cap.
  static constexpr std::uint64_t kMaxCharge = std::uint64_t{1} << 62;

  // Charges `bytes` if held + bytes stays within `lim` (0 = no cap) and sets *charged to
  // what was charged (undo with charge(-*charged)); false changes nothing. A request over
  // kMaxCharge fails under a cap and is charged 0 without one (the driver gives its answer).
  bool try_charge(std::uint64_t bytes, std::uint64_t lim, std::int64_t* charged) noexcept {
    *charged = 0;
    if (bytes > kMaxCharge) return lim == 0;
    const auto add = static_cast<std::int64_t>(bytes);
    std::int64_t cur = held_bytes.load(std::memory_order_relaxed);
    do {
      if (lim && cur + add > static_cast<std::int64_t>(lim)) return false;
    } while (!held_bytes.compare_exchange_weak(cur, cur + add, std::memory_order_relaxed));
    *charged = add;
    return true;
  }
  // Unconditional: corrections to what the driver really handed out, and releases (< 0).
  void charge(std::int64_t bytes) noexcept { held_bytes.fetch_add(bytes, std::memory_order_relaxed); }
  std::int64_t held() const noexcept { return held_bytes.load(std::memory_order_relaxed); }
};

void limits_init(const char* spec) noexcept;  // from the library constructor; spec validated
DeviceBudget* budget(int device) noexcept;    // nullptr for a bad ordinal
// The cap of this device (0 = none), resolving fractions with the device's total memory.
std::uint64_t device_limit(int device) noexcept;

// Whether memory of this kind counts against the cap (device memory the process holds).
bool counts_against_limit(format::AllocKind kind) noexcept;

}  // namespace preload
}  // namespace gpuheap
