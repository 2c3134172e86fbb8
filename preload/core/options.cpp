// The option table and its parser (see options.h for the rules). Runs in the library
// constructor: stack buffers only, nothing that could allocate or re-enter a hook.
#include "preload/core/options.h"

#include "preload/core/stderr_line.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

namespace gpuheap {
namespace preload {

namespace {

using T = OptionType;
using I = OptionId;
constexpr std::uint64_t kUs = 1'000, kMs = 1'000'000, kS = 1'000'000'000;

}  // namespace

// GPUHEAP_DISABLE first: when set, nothing else is read (read_settings).
constinit const OptionSpec kOptionTable[kNumOptions] = {
    {I::disable, "GPUHEAP_DISABLE", T::boolean, "0", 0, 0, 1, 0, "load but do nothing"},
    {I::output, "GPUHEAP_OUTPUT", T::text, "./gpuheap.%n.%p.trace", 0, 0, 0, 0,
     "trace path pattern: %p pid, %h host, %r $RANK, %n program name"},
    {I::path_file, "GPUHEAP_PATH_FILE", T::text, "none", 0, 0, 0, 0,
     "append each trace file's path to this file when it is created"},
    {I::quiet, "GPUHEAP_QUIET", T::boolean, "0", 0, 0, 1, 0, "no \"tracing to\" line on stderr"},
    {I::pool, "GPUHEAP_POOL", T::boolean, "1", 1, 0, 1, 0, "serve cudaMalloc/cuMemAlloc from gpuheap's pool"},
    {I::stacks, "GPUHEAP_STACKS", T::boolean, "1", 1, 0, 1, 0, "record call stacks"},
    {I::stack_depth, "GPUHEAP_STACK_DEPTH", T::integer, "64", 64, 1, 256, 0, "frames kept per stack"},
    {I::free_stacks, "GPUHEAP_FREE_STACKS", T::boolean, "0", 0, 0, 1, 0, "also unwind at frees"},
    {I::python_stacks, "GPUHEAP_PYTHON_STACKS", T::boolean, "1", 1, 0, 1, 0,
     "Python frames (file, function, line) in place of the interpreter's"},
    {I::flush_ms, "GPUHEAP_FLUSH_MS", T::duration, "20", 20 * kMs, 1 * kMs, 60 * kS, kMs,
     "the background thread's tick"},
    {I::seal_us, "GPUHEAP_SEAL_US", T::duration, "200", 200 * kUs, 0, 3600 * kS, kUs,
     "how often freed blocks are fenced"},
    {I::strict_fences, "GPUHEAP_STRICT_FENCES", T::boolean, "0", 0, 0, 1, 0,
     "fence with events even when all work goes to the legacy default stream"},
    {I::unsafe_reuse, "GPUHEAP_UNSAFE_REUSE", T::boolean, "0", 0, 0, 1, 0,
     "TEST ONLY: reuse freed blocks without fences"},
    {I::buffer_mb, "GPUHEAP_BUFFER_MB", T::ignored, "\xE2\x80\x94", 0, 0, 0, 0, "ignored (nothing is buffered)"},
    {I::limit, "GPUHEAP_LIMIT", T::limit, "none", 0, 0, 0, 0, "per-process cap per device"},
    {I::release_threshold, "GPUHEAP_RELEASE_THRESHOLD", T::size, "none", 0, 0, 0, 0,
     "give free cached segments back once the unused cache exceeds this"},
    {I::follow_fork, "GPUHEAP_FOLLOW_FORK", T::boolean, "1", 1, 0, 1, 0,
     "0: trace only the process started first, not its forked or exec'd children"},
    {I::follow_fork_root, "GPUHEAP_FOLLOW_FORK_ROOT", T::text, "none", 0, 0, 0, 0,
     "set by gpuheap under GPUHEAP_FOLLOW_FORK=0: the one process traced (PID:START)"},
    {I::stack_cache, "GPUHEAP_STACK_CACHE", T::boolean, "1", 1, 0, 1, 0,
     "0: unwind every stack in full (the per-thread cache of unchanged stacks off)"},
    {I::aggregate, "GPUHEAP_AGGREGATE", T::size, "none", 0, 0, 0, 0,
     "keep the trace to a rolling window of about this size, its summary exact (docs/cli.md)"},
};

const OptionSpec* find_option(const char* name) noexcept {
  for (const OptionSpec& s : kOptionTable)
    if (strcmp(s.name, name) == 0) return &s;
  return nullptr;
}

namespace {

// Copies text without surrounding blanks into buf; false if it does not fit.
bool trimmed(const char* text, std::size_t len, char* buf, std::size_t cap) noexcept {
  while (len && isspace(static_cast<unsigned char>(*text))) ++text, --len;
  while (len && isspace(static_cast<unsigned char>(text[len - 1]))) --len;
  if (len >= cap) return false;
  memcpy(buf, text, len);
  buf[len] = '\0';
  return true;
}

void default_warn(const char* line) noexcept {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "gpuheap: %s\n", line);
  if (n <= 0) return;
  std::size_t len = static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1;
  write_stderr(buf, len);
}

const char* expected(const OptionSpec& s, char* buf, std::size_t cap) noexcept {
  switch (s.type) {
    case T::boolean: return "1/0, true/false, yes/no or on/off";
    case T::integer:
      snprintf(buf, cap, "an integer in %llu..%llu", static_cast<unsigned long long>(s.lo),
               static_cast<unsigned long long>(s.hi));
      return buf;
    case T::size: return "a size with a unit such as 512MiB, 2GB or 1048576b";
    case T::duration:
      snprintf(buf, cap, "a duration in %llu..%llu %s, or with a unit (ns, us, ms, s)",
               static_cast<unsigned long long>(s.lo / s.unit_ns), static_cast<unsigned long long>(s.hi / s.unit_ns),
               s.unit_ns == kMs ? "ms" : "us");
      return buf;
    case T::limit:
      return "a size with a unit (8GiB, 512MiB, 4096b) or a fraction with a point (0.5), per device 0:8GiB,1:0.5";
    case T::text: return "a path of at most 4095 bytes";
    case T::ignored: break;
  }
  return "";
}

// One line: the variable, the value as given (shortened, control characters masked), what
// was expected and what is used instead.
void warn_invalid(WarnFn warn, const OptionSpec& s, const char* value) noexcept {
  char shown[80];
  std::size_t n = 0;
  for (const char* p = value; *p && n + 1 < sizeof shown; ++p)
    shown[n++] = static_cast<unsigned char>(*p) < 0x20 || *p == 0x7f ? '?' : *p;
  shown[n] = '\0';
  bool cut = strlen(value) > n;
  char exp[128];
  char line[400];
  snprintf(line, sizeof line, "%s=\"%s%s\" is not valid (expected %s); using the default %s%s", s.name, shown,
           cut ? "..." : "", expected(s, exp, sizeof exp), s.default_text, s.type == T::limit ? " (no cap)" : "");
  warn(line);
}

void store(Settings* o, OptionId id, std::uint64_t v) noexcept {
  bool b = v != 0;
  switch (id) {
    case I::disable: o->disable = b; break;
    case I::quiet: o->quiet = b; break;
    case I::pool: o->pool = b; break;
    case I::stacks: o->stacks = b; break;
    case I::stack_depth: o->stack_depth = static_cast<int>(v); break;
    case I::free_stacks: o->free_stacks = b; break;
    case I::python_stacks: o->python_stacks = b; break;
    case I::stack_cache: o->stack_cache = b; break;
    case I::flush_ms: o->flush_ns = v; break;
    case I::seal_us: o->seal_ns = v; break;
    case I::strict_fences: o->strict_fences = b; break;
    case I::unsafe_reuse: o->unsafe_reuse = b; break;
    case I::release_threshold: o->release_threshold = static_cast<std::size_t>(v); break;
    case I::aggregate: o->aggregate = v; break;
    case I::follow_fork: o->follow_fork = b; break;
    case I::output:
    case I::path_file:
    case I::buffer_mb:
    case I::limit:
    case I::follow_fork_root: break;
  }
}

// Parses one set, non-empty value into *o; false if invalid (*o keeps the default).
bool apply(Settings* o, const OptionSpec& s, const char* v) noexcept {
  char buf[64];
  bool small = s.type == T::boolean || s.type == T::integer || s.type == T::size || s.type == T::duration;
  if (small && !trimmed(v, strlen(v), buf, sizeof buf)) return false;
  std::uint64_t x = 0;
  bool b = false;
  switch (s.type) {
    case T::boolean:
      if (!common::parse_bool(buf, &b)) return false;
      x = b;
      break;
    case T::integer:
      if (!common::parse_uint(buf, &x) || x < s.lo || x > s.hi) return false;
      break;
    case T::size:
      if (!common::parse_size(buf, &x)) return false;
      break;
    case T::duration:
      if (!common::parse_duration(buf, s.unit_ns, &x) || x < s.lo || x > s.hi) return false;
      break;
    case T::text:
      if (s.id == I::output) {
        o->output = v;  // kept as given: the pattern's expansion checks its length
      } else if (s.id == I::follow_fork_root) {
        if (strlen(v) >= sizeof o->follow_fork_root) return false;
        snprintf(o->follow_fork_root, sizeof o->follow_fork_root, "%s", v);
      } else {
        if (strlen(v) >= sizeof o->path_file) return false;  // a cut name would be another file
        snprintf(o->path_file, sizeof o->path_file, "%s", v);
      }
      return true;
    case T::limit: {
      LimitSpec scratch[kMaxDevices + 1];
      if (strlen(v) >= sizeof o->limit || !parse_limit(v, scratch)) return false;
      snprintf(o->limit, sizeof o->limit, "%s", v);
      return true;
    }
    case T::ignored: return true;
  }
  store(o, s.id, x);
  return true;
}

}  // namespace

int read_settings(Settings* out, EnvLookup lookup, WarnFn warn) noexcept {
  if (!lookup) lookup = [](const char* name) noexcept -> const char* { return getenv(name); };
  if (!warn) warn = default_warn;
  *out = Settings{};
  int invalid = 0;
  for (const OptionSpec& s : kOptionTable) {
    const char* v = lookup(s.name);
    if (v && *v && !apply(out, s, v)) {
      ++invalid;
      warn_invalid(warn, s, v);
    }
    if (s.id == I::disable && out->disable) break;
  }
  if (!out->disable) out->have_identity = read_identity(&out->identity, lookup);
  return invalid;
}

namespace {

// A rank or size: decimal digits, at most INT32_MAX; -1 otherwise (unset included).
std::int32_t rank_number(EnvLookup lookup, const char* name) noexcept {
  const char* v = name ? lookup(name) : nullptr;
  std::uint64_t x = 0;
  if (!v || !common::parse_uint(v, &x) || x > 0x7FFFFFFFu) return -1;
  return static_cast<std::int32_t>(x);
}

}  // namespace

bool read_identity(format::IdentityRecord* out, EnvLookup lookup) noexcept {
  if (!lookup) lookup = [](const char* name) noexcept -> const char* { return getenv(name); };
  struct Family {
    format::RankSource source;
    const char *rank, *local, *size;
  };
  static constexpr Family kFamilies[] = {
      {format::RankSource::torchrun, "RANK", "LOCAL_RANK", "WORLD_SIZE"},
      {format::RankSource::ompi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},
      {format::RankSource::pmi, "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"},
      {format::RankSource::slurm, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},
  };
  for (const Family& f : kFamilies) {
    const std::int32_t rank = rank_number(lookup, f.rank);
    if (rank < 0) continue;
    out->rank = rank, out->source = f.source;
    out->local_rank = rank_number(lookup, f.local), out->world_size = rank_number(lookup, f.size);
    return true;
  }
  return false;
}

bool parse_limit_value(const char* text, std::size_t len, LimitSpec* out) noexcept {
  char buf[64];
  if (!trimmed(text, len, buf, sizeof buf) || !*buf) return false;
  double v = 0, factor = 1;
  const char* unit = nullptr;
  if (!common::split_number(buf, &v, &unit) || !common::unit_factor(unit, &factor)) return false;
  if (*unit == '\0') {
    // No unit: a fraction of the device's memory, written with a decimal point, in (0, 1].
    // Anything else is refused: read as bytes, "2" was a 2-byte cap and "1.5" a 1-byte one,
    // which nobody means (2 GiB? twice the device?).
    bool has_dot = memchr(buf, '.', static_cast<std::size_t>(unit - buf)) != nullptr;
    if (!has_dot || !(v > 0 && v <= 1.0)) return false;
    out->set = true, out->fraction = true, out->value = v;
    return true;
  }
  out->set = true;
  out->fraction = false;
  out->value = v * factor;
  // inf, nan and sizes past 2^63 would overflow the byte counters (and the conversion is UB).
  if (!(out->value < 9.2e18)) return false;
  return out->value >= 1;
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

}  // namespace preload
}  // namespace gpuheap
