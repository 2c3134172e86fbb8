#include "analyzer/base/units.h"

#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "format/rules.h"

namespace gpuheap {

std::string torch_size_cell(std::int64_t sz, std::int64_t pref) {
  static const char* kPrefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int p = 0;
  double pref_d = static_cast<double>(pref);
  for (int i = 1; i < 6; ++i) {
    if (pref_d < 768.0 * 1024.0) break;
    p = i;
    sz /= 1024;
    pref_d /= 1024.0;
  }
  return fmt::format("{:6d} {}", sz, kPrefixes[p]);
}

std::string torch_count_cell(std::int64_t cnt, std::int64_t pref) {
  static const char* kPrefixes[] = {" ", "K", "M"};
  int p = 0;
  double pref_d = static_cast<double>(pref);
  for (int i = 1; i < 3; ++i) {
    if (pref_d < 750.0 * 1000.0) break;
    p = i;
    cnt /= 1000;
    pref_d /= 1000.0;
  }
  return fmt::format("{:7d} {} ", cnt, kPrefixes[p]);
}

std::string human_bytes(std::uint64_t b) {
  char buf[format::kBytesTextSize];
  return format::format_bytes(b, buf, sizeof buf);  // one size style for both halves
}

std::string human_duration_ns(std::uint64_t ns) {
  if (ns < 1000) return fmt::format("{} ns", ns);
  if (ns < 1000000) return fmt::format("{:.1f} us", static_cast<double>(ns) / 1e3);
  if (ns < 1000000000) return fmt::format("{:.1f} ms", static_cast<double>(ns) / 1e6);
  return fmt::format("{:.3f} s", static_cast<double>(ns) / 1e9);
}

std::uint64_t parse_size(std::string_view s) {
  std::string in(s);
  auto bad = [&]() { return UsageError(fmt::format("invalid size '{}' (examples: 123B, 512KiB, 1.5GiB, 2GB)", in)); };
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::size_t num_start = i;
  bool dot = false;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !dot))) {
    if (s[i] == '.') dot = true;
    ++i;
  }
  std::string num(s.substr(num_start, i - num_start));
  if (num.empty() || num == ".") throw bad();
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::string unit;
  for (; i < s.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  // A bare number is refused (0 excepted) as GPUHEAP_LIMIT refuses it: `--max-reserved 8`
  // meant as 8 GiB would be an 8-byte gate that fails every job, or one written as bytes
  // would pass where a unit was meant; "8B" says bytes.
  if (unit.empty() && num.find_first_not_of("0.") != std::string::npos)
    throw UsageError(
        fmt::format("size '{}' has no unit: write {}B for bytes, or {}MiB, {}GiB, ... "
                    "(every size needs a unit, as in GPUHEAP_LIMIT)",
                    in, num, num, num));
  double mult;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else {
    static const char kLetters[] = "kmgtp";
    auto pos = std::string_view(kLetters).find(unit[0]);
    if (pos == std::string_view::npos) throw bad();
    std::string rest = unit.substr(1);
    double base;
    if (rest.empty() || rest == "ib" || rest == "i") base = 1024;
    else if (rest == "b") base = 1000;
    else throw bad();
    mult = std::pow(base, static_cast<double>(pos + 1));
  }
  double v = std::stod(num) * mult;
  if (!std::isfinite(v) || v >= 1.8e19) throw bad();
  if (!dot) {
    // Integers stay exact (no double rounding for large byte counts).
    std::uint64_t iv = std::stoull(num);
    auto m = static_cast<std::uint64_t>(mult);
    if (m != 0 && iv > UINT64_MAX / m) throw bad();
    return iv * m;
  }
  return static_cast<std::uint64_t>(std::llround(v));
}

}  // namespace gpuheap
