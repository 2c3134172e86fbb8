// The output path pattern of outpath_pattern.h: caller buffers only.
#include "common/outpath_pattern.h"

#include <stdio.h>

namespace gpuheap {
namespace common {
namespace {

struct Out {
  char* p;
  std::size_t cap, n = 0;
  bool ok = true;
  void ch(char c) {
    if (n + 1 >= cap) {
      ok = false;
      return;
    }
    p[n++] = c;
  }
  void value(const char* s) {  // substituted text: no directory separators
    for (; s && *s; ++s) ch(*s == '/' ? '_' : *s);
  }
};

}  // namespace

long expand_output_pattern(const char* pattern, const OutpathVars& v, char* out, std::size_t cap) noexcept {
  if (!out || cap == 0) return -1;
  if (!pattern || !*pattern) pattern = kDefaultOutputPattern;
  Out o{out, cap};
  char num[24];
  for (const char* s = pattern; *s; ++s) {
    if (*s != '%') {
      o.ch(*s);
      continue;
    }
    switch (s[1]) {
      case 'p':
        snprintf(num, sizeof num, "%ld", v.pid);
        o.value(num);
        ++s;
        break;
      case 'h': o.value(v.hostname), ++s; break;
      case 'r': o.value(v.rank), ++s; break;
      case 'n': o.value(v.program), ++s; break;
      case '%': o.ch('%'), ++s; break;
      case '\0': o.ch('%'); break;  // trailing lone '%'
      default: o.ch('%'); break;    // unknown: keep "%x" literally (x copied next round)
    }
  }
  out[o.ok ? o.n : 0] = '\0';
  return o.ok ? static_cast<long>(o.n) : -1;
}

long absolute_output_pattern(const char* pattern, const char* cwd, char* out, std::size_t cap) noexcept {
  if (!out || cap == 0) return -1;
  out[0] = '\0';
  if (!pattern || !*pattern) pattern = kDefaultOutputPattern;
  Out o{out, cap};
  if (pattern[0] != '/') {
    if (!cwd || cwd[0] != '/') return -1;
    for (const char* c = cwd; *c; ++c) {
      if (*c == '%') o.ch('%');
      o.ch(*c);
    }
    if (o.n > 0 && out[o.n - 1] != '/') o.ch('/');
    while (pattern[0] == '.' && pattern[1] == '/') pattern += 2;
  }
  for (const char* s = pattern; *s; ++s) o.ch(*s);
  out[o.ok ? o.n : 0] = '\0';
  return o.ok ? static_cast<long>(o.n) : -1;
}

}  // namespace common
}  // namespace gpuheap
