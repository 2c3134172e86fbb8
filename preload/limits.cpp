#include "preload/limits.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload/real.h"

namespace gpuheap {
namespace detail {

namespace {

LimitSpec g_specs[kMaxDevices + 1];
DeviceBudget g_budgets[kMaxDevices];

bool unit_factor(const char* u, std::size_t n, double* f) noexcept {
  struct Unit {
    const char* name;
    double factor;
  };
  static const Unit units[] = {
      {"", 1},           {"b", 1},          {"k", 1024.0},    {"kib", 1024.0},  {"kb", 1e3},
      {"m", 1048576.0},  {"mib", 1048576.0}, {"mb", 1e6},     {"g", 1073741824.0},
      {"gib", 1073741824.0}, {"gb", 1e9},   {"t", 1099511627776.0}, {"tib", 1099511627776.0},
      {"tb", 1e12},
  };
  char low[8];
  if (n >= sizeof low) return false;
  for (std::size_t i = 0; i < n; ++i) low[i] = static_cast<char>(tolower(static_cast<unsigned char>(u[i])));
  low[n] = '\0';
  for (const Unit& x : units)
    if (strcmp(x.name, low) == 0) return *f = x.factor, true;
  return false;
}

}  // namespace

bool parse_limit_value(const char* text, std::size_t len, LimitSpec* out) noexcept {
  char buf[64];
  while (len && isspace(static_cast<unsigned char>(*text))) ++text, --len;
  while (len && isspace(static_cast<unsigned char>(text[len - 1]))) --len;
  if (len == 0 || len >= sizeof buf) return false;
  memcpy(buf, text, len);
  buf[len] = '\0';
  char* end = nullptr;
  double v = strtod(buf, &end);
  if (end == buf || v < 0) return false;
  double factor = 1;
  if (!unit_factor(end, strlen(end), &factor)) return false;
  // A bare number with a decimal point and at most 1 is a fraction of the device.
  bool has_dot = memchr(buf, '.', static_cast<std::size_t>(end - buf)) != nullptr;
  out->set = true;
  out->fraction = has_dot && *end == '\0' && v <= 1.0;
  out->value = out->fraction ? v : v * factor;
  // inf, nan and sizes past 2^63 would overflow the byte counters (and the conversion is UB).
  if (!(out->value < 9.2e18)) return false;
  return out->fraction ? v > 0 : out->value >= 1;
}

bool parse_limit(const char* text, LimitSpec out[kMaxDevices + 1]) noexcept {
  for (int i = 0; i <= kMaxDevices; ++i) out[i] = LimitSpec{};
  if (!text || !*text) return true;
  const char* p = text;
  while (*p) {
    const char* comma = strchr(p, ',');
    std::size_t n = comma ? static_cast<std::size_t>(comma - p) : strlen(p);
    // NOLINTNEXTLINE(bugprone-not-null-terminated-result): a search within n bytes, nothing is copied
    const char* colon = static_cast<const char*>(memchr(p, ':', n));
    int index = kMaxDevices;
    const char* value = p;
    std::size_t vlen = n;
    if (colon) {
      char* end = nullptr;
      long d = strtol(p, &end, 10);
      if (end != colon || d < 0 || d >= kMaxDevices) return false;
      index = static_cast<int>(d);
      value = colon + 1;
      vlen = n - static_cast<std::size_t>(colon + 1 - p);
    }
    if (!parse_limit_value(value, vlen, &out[index])) return false;
    p += n;
    if (*p == ',') ++p;
  }
  return true;
}

void limits_init(const char* env_value) noexcept {
  if (!parse_limit(env_value, g_specs)) {
    static const char msg[] = "gpuheap: GPUHEAP_LIMIT is not valid (e.g. 8GiB, 0.5, 0:8GiB,1:12GiB); no cap\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    for (auto& s : g_specs) s = LimitSpec{};
  }
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
