// Per-process memory caps per device (GPUHEAP_LIMIT) and the bytes this process holds on
// each device, which cudaMemGetInfo answers inside the cap and the OOM report explains.
//
// GPUHEAP_LIMIT grammar:  SPEC[,SPEC...]   SPEC = [DEVICE:]VALUE
//   VALUE = a size ("8GiB", "512MiB", "2GB" decimal, "8G" binary, "123" bytes) or a
//           fraction of the device's total memory ("0.5"; a number with a '.' and <= 1).
//   A SPEC without DEVICE applies to every device not named explicitly.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace detail {

inline constexpr int kMaxDevices = 64;

struct LimitSpec {
  bool set = false;
  bool fraction = false;
  double value = 0;  // bytes, or fraction of total
};

// Parses a GPUHEAP_LIMIT value into per-device specs (index kMaxDevices = default). Returns
// false on a syntax error (then nothing is capped and a warning is printed once).
bool parse_limit(const char* text, LimitSpec out[kMaxDevices + 1]) noexcept;
// Parses one size/fraction value; false on error.
bool parse_limit_value(const char* text, std::size_t len, LimitSpec* out) noexcept;

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

void limits_init(const char* env_value) noexcept;  // from the library constructor
DeviceBudget* budget(int device) noexcept;          // nullptr for a bad ordinal
// The cap of this device (0 = none), resolving fractions with the device's total memory.
std::uint64_t device_limit(int device) noexcept;

// Whether memory of this kind counts against the cap (device memory the process holds).
bool counts_against_limit(format::AllocKind kind) noexcept;

}  // namespace detail
}  // namespace gpuheap
