#include "analyzer/base/text_safe.h"

#include <fmt/format.h>

namespace gpuheap {

namespace {

// Length of the valid UTF-8 sequence at s[i] and its code point, or 0 when it is not one
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, > U+10FFFF).
std::size_t utf8_at(std::string_view s, std::size_t i, char32_t* cp) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  std::size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
  if (n == 0 || c > 0xF4 || i + n > s.size()) return 0;
  char32_t v = c & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3F);
  }
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

bool invisible_control(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string text_safe(std::string_view s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c < 0x20 || c == 0x7F || (quote && c == '"')) out += fmt::format("\\x{:02x}", c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    char32_t cp = 0;
    std::size_t n = utf8_at(s, i, &cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (invisible_control(cp)) {
      out += fmt::format("\\u{:04x}", static_cast<std::uint32_t>(cp));
      i += n;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace gpuheap
