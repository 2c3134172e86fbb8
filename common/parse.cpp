// The scalar parsers of parse.h. Stack buffers only, nothing that could allocate or re-enter
// a hook (they run in the preload's library constructor).
#include "common/parse.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

namespace gpuheap {
namespace common {

namespace {
constexpr std::uint64_t kUs = 1'000, kMs = 1'000'000, kS = 1'000'000'000;
}  // namespace

bool unit_factor(const char* u, double* f) noexcept {
  struct Unit {
    const char* name;
    double factor;
  };
  static const Unit units[] = {
      {"", 1},
      {"b", 1},
      {"k", 1024.0},
      {"kib", 1024.0},
      {"kb", 1e3},
      {"m", 1048576.0},
      {"mib", 1048576.0},
      {"mb", 1e6},
      {"g", 1073741824.0},
      {"gib", 1073741824.0},
      {"gb", 1e9},
      {"t", 1099511627776.0},
      {"tib", 1099511627776.0},
      {"tb", 1e12},
  };
  for (const Unit& x : units)
    if (strcasecmp(x.name, u) == 0) return *f = x.factor, true;
  return false;
}

// A number (digits, '.' allowed) and its unit suffix; false unless it starts with a digit.
bool split_number(const char* s, double* v, const char** unit) noexcept {
  if (!isdigit(static_cast<unsigned char>(*s)) && *s != '.') return false;  // no sign, no "inf"
  char* end = nullptr;
  *v = strtod(s, &end);
  if (end == s) return false;
  *unit = end;
  return true;
}

bool parse_bool(const char* text, bool* out) noexcept {
  static const char* const yes[] = {"1", "true", "yes", "on"};
  static const char* const no[] = {"0", "false", "no", "off"};
  for (const char* w : yes)
    if (strcasecmp(text, w) == 0) return *out = true, true;
  for (const char* w : no)
    if (strcasecmp(text, w) == 0) return *out = false, true;
  return false;
}

bool parse_uint(const char* text, std::uint64_t* out) noexcept {
  if (!*text) return false;
  std::uint64_t v = 0;
  for (const char* p = text; *p; ++p) {
    if (!isdigit(static_cast<unsigned char>(*p))) return false;
    unsigned d = static_cast<unsigned>(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool parse_size(const char* text, std::uint64_t* bytes) noexcept {
  double v = 0, f = 1;
  const char* unit = nullptr;
  if (!split_number(text, &v, &unit) || !unit_factor(unit, &f)) return false;
  // A unit is required (0 excepted), as in GPUHEAP_LIMIT and the CLI's SIZE options: a
  // threshold of "512" meant as MiB would release the cache on every free.
  if (*unit == '\0' && v != 0) return false;
  double b = v * f;
  if (!(b >= 0 && b < 9.2e18)) return false;  // the byte counters are signed 64-bit
  *bytes = static_cast<std::uint64_t>(b);
  return true;
}

bool parse_duration(const char* text, std::uint64_t unit_ns, std::uint64_t* ns) noexcept {
  std::size_t digits = strspn(text, "0123456789");
  if (digits == 0 || digits >= 20) return false;
  char num[20];
  memcpy(num, text, digits);
  num[digits] = '\0';
  std::uint64_t v = 0;
  if (!parse_uint(num, &v)) return false;
  const char* u = text + digits;
  std::uint64_t f = unit_ns;
  if (*u) {
    if (strcasecmp(u, "ns") == 0) f = 1;
    else if (strcasecmp(u, "us") == 0) f = kUs;
    else if (strcasecmp(u, "ms") == 0) f = kMs;
    else if (strcasecmp(u, "s") == 0) f = kS;
    else return false;
  }
  if (v > UINT64_MAX / f) return false;
  *ns = v * f;
  return true;
}

}  // namespace common
}  // namespace gpuheap
