#include "analyzer/symbolize/pyframes.h"

#include <fmt/format.h>

namespace gpuheap {
namespace {

// 3.10 (Objects/lnotab_notes.txt of that release): pairs of an unsigned byte advancing the
// address (in bytes) and a signed byte advancing the line; -128 means "no line" for that range.
int line_310(int firstlineno, std::string_view t, std::uint64_t addr) {
  int line = firstlineno;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i + 1 < t.size(); i += 2) {
    std::uint64_t start = end;
    end += static_cast<unsigned char>(t[i]);
    auto ld = static_cast<signed char>(t[i + 1]);
    bool none = ld == -128;
    if (!none) line += ld;
    if (addr >= start && addr < end) return none ? 0 : line;
  }
  return 0;
}

// 3.11+ location table entries: a first byte with bit 7 set, bits 3..6 the entry's code and
// bits 0..2 its length in code units minus one, then the code's payload (varints of 6-bit
// chunks, bit 6 = more). Codes: 15 no location; 14 long form (signed line delta first); 13 line
// delta only; 10..12 one-line forms (line delta code-10); 0..9 short forms (same line).
struct Cursor {
  std::string_view t;
  std::size_t i = 0;
  bool more() const { return i < t.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; more() && shift < 64; shift += 6) {
      auto b = static_cast<unsigned char>(t[i++]);
      v |= static_cast<std::uint64_t>(b & 63) << shift;
      if (!(b & 64)) break;
    }
    return v;
  }
  std::int64_t svarint() {
    std::uint64_t u = varint();
    return (u & 1) ? -static_cast<std::int64_t>(u >> 1) : static_cast<std::int64_t>(u >> 1);
  }
};

int line_311(int firstlineno, std::string_view t, std::uint64_t unit) {
  Cursor c{t};
  std::int64_t line = firstlineno;
  std::uint64_t pos = 0;
  while (c.more()) {
    auto b = static_cast<unsigned char>(c.t[c.i++]);
    if (!(b & 0x80)) return 0;  // not at an entry: a damaged table
    int code = (b >> 3) & 15;
    std::uint64_t len = (b & 7) + 1;
    bool none = code == 15;
    if (code == 14 || code == 13) line += c.svarint();
    else if (code >= 10 && code <= 12) line += code - 10;
    // The rest of the entry (columns, end line) does not matter here: skip to the next entry.
    while (c.more() && !(static_cast<unsigned char>(c.t[c.i]) & 0x80)) ++c.i;
    if (unit >= pos && unit < pos + len) return none ? 0 : static_cast<int>(line);
    pos += len;
  }
  return 0;
}

}  // namespace

int py_line(int minor, int firstlineno, std::string_view table, std::uint32_t lasti) {
  if (lasti == format::kPyNoLasti) return firstlineno;
  if (minor <= 10) return line_310(firstlineno, table, 2ull * lasti);  // 3.10 addresses are bytes
  return line_311(firstlineno, table, lasti);
}

Frame py_frame_of(const std::unordered_map<std::uint32_t, PyCode>& codes, std::uint64_t entry) {
  Frame f;
  f.module = "python";
  std::uint32_t id = format::py_frame_code(entry);
  auto it = codes.find(id);
  if (it == codes.end()) {
    f.function = fmt::format("<unknown Python code {}>", id);
    return f;
  }
  const PyCode& c = it->second;
  f.function = c.name;
  f.file = c.filename;
  f.line = py_line(c.minor, c.firstlineno, c.linetable, format::py_frame_lasti(entry));
  return f;
}

bool is_interpreter_frame(const Frame& f) {
  std::string_view m = f.module;
  auto slash = m.rfind('/');
  if (slash != std::string_view::npos) m.remove_prefix(slash + 1);
  for (std::string_view p : {"libpython", "python", "_ctypes", "libffi"})
    if (m.substr(0, p.size()) == p) return true;
  return false;
}

}  // namespace gpuheap
