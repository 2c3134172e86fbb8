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
  std::atomic<std::uint64_t> limit{0};         // resolved cap in bytes, 0 = none
  std::atomic<bool> resolved{false};
  std::atomic<std::int64_t> pool_reserved{0};  // bytes in pool segments (all contexts)
  std::atomic<std::int64_t> other_held{0};     // non-pooled device memory (pass-through kinds)
  std::int64_t held() const noexcept {
    return pool_reserved.load(std::memory_order_relaxed) + other_held.load(std::memory_order_relaxed);
  }
};

void limits_init(const char* env_value) noexcept;  // from the library constructor
DeviceBudget* budget(int device) noexcept;          // nullptr for a bad ordinal
// The cap of this device (0 = none), resolving fractions with the device's total memory.
std::uint64_t device_limit(int device) noexcept;

// Whether memory of this kind counts against the cap (device memory the process holds).
bool counts_against_limit(format::AllocKind kind) noexcept;

}  // namespace detail
}  // namespace gpuheap
