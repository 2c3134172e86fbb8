// Every GPUHEAP_* environment variable: one table (name, type, default, doc line), one
// parser, read once at load into one Settings struct that is handed to the parts that need
// it (runtime.cpp: pool, caps; recorder.cpp: the trace). A forked child keeps its parent's
// settings; an exec'd program loads gpuheap anew and reads its own environment.
//
// Parsing rules (README.md "Environment variables" repeats them for users):
//  - unset or empty: the default;
//  - boolean: 1/0, true/false, yes/no, on/off, any case;
//  - integer: decimal digits, within the option's range;
//  - size: a number with an optional unit (b, k/kib, m/mib, g/gib, t/tib binary; kb, mb,
//    gb, tb decimal; any case): "512MiB", "2GB", "1.5g", "123" bytes;
//  - duration: a whole number with an optional unit (ns, us, ms, s); without one, the unit
//    in the option's name (GPUHEAP_FLUSH_MS=20 is 20 ms, GPUHEAP_SEAL_US=200 is 200 us);
//  - leading and trailing blanks are ignored except in paths;
//  - an invalid or out-of-range value is replaced by the default, and one line on stderr
//    names the variable, the value and what is used instead. Never fatal.
//
// Nothing here allocates or calls a hooked function (getenv, strto*, snprintf into stack
// buffers and write(2) only): it runs in the library constructor, before main.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/parse.h"
#include "format/trace.h"

namespace gpuheap {
namespace preload {

enum class OptionType : std::uint8_t {
  boolean,
  integer,   // range lo..hi
  size,      // bytes
  duration,  // stored in ns; lo..hi in ns, unit_ns for a bare number
  text,      // a path or pattern, not interpreted here
  limit,     // GPUHEAP_LIMIT grammar (limits.h); kept as text once it parses
  ignored,   // accepted for compatibility, never read
};

enum class OptionId : std::uint8_t {
  disable,
  output,
  path_file,
  quiet,
  pool,
  stacks,
  stack_depth,
  free_stacks,
  flush_ms,
  seal_us,
  strict_fences,
  unsafe_reuse,
  buffer_mb,
  limit,
  release_threshold,
  follow_fork,
  python_stacks,
  follow_fork_root,
  stack_cache,
  aggregate,
};

struct OptionSpec {
  OptionId id;
  const char* name;
  OptionType type;
  const char* default_text;  // as README.md's table writes it (a test compares the two)
  std::uint64_t def;         // parsed default: 0/1, the integer, bytes or ns
  std::uint64_t lo, hi;      // integer and duration range (inclusive)
  std::uint64_t unit_ns;     // duration: the unit of a bare number
  const char* doc;           // one line
};

inline constexpr int kNumOptions = 20;
extern const OptionSpec kOptionTable[kNumOptions];
const OptionSpec* find_option(const char* name) noexcept;  // nullptr if unknown

// The parsed environment. Fixed-size: no allocation at load.
struct Settings {
  bool disable = false;                 // GPUHEAP_DISABLE: load but do nothing
  const char* output = nullptr;         // GPUHEAP_OUTPUT pattern (the environment's string), nullptr = default
  char path_file[4096] = {};            // GPUHEAP_PATH_FILE, "" = none (a name too long to fit: none)
  bool quiet = false;                   // GPUHEAP_QUIET: no "tracing to" line
  bool pool = true;                     // GPUHEAP_POOL (runtime.cpp turns it off in a child forked after CUDA use)
  bool stacks = true;                   // GPUHEAP_STACKS
  int stack_depth = 64;                 // GPUHEAP_STACK_DEPTH
  bool free_stacks = false;             // GPUHEAP_FREE_STACKS: also unwind at frees
  bool python_stacks = true;            // GPUHEAP_PYTHON_STACKS: Python frames in stacks (record/pystack.h)
  bool stack_cache = true;              // GPUHEAP_STACK_CACHE: reuse a thread's unchanged stacks (record/stackcache.h)
  std::uint64_t flush_ns = 20'000'000;  // GPUHEAP_FLUSH_MS: the background thread's tick
  std::uint64_t seal_ns = 200'000;      // GPUHEAP_SEAL_US
  bool strict_fences = false;           // GPUHEAP_STRICT_FENCES
  bool unsafe_reuse = false;            // GPUHEAP_UNSAFE_REUSE: TEST ONLY, reuse without fences
  char limit[1024] = {};                // GPUHEAP_LIMIT, validated; "" = no cap
  std::size_t release_threshold = 0;    // GPUHEAP_RELEASE_THRESHOLD in bytes, 0 = none
  std::uint64_t aggregate = 0;          // GPUHEAP_AGGREGATE: rolling-window budget in bytes, 0 = full trace
  bool follow_fork = true;              // GPUHEAP_FOLLOW_FORK
  char follow_fork_root[64] =
      {};  // GPUHEAP_FOLLOW_FORK_ROOT: "PID:START" of the one traced process, set at load (runtime.cpp)
  char output_abs[4096] = {};  // the output pattern made absolute at load (runtime.cpp); output then points here
  // The job's rank, from the launcher's variables (read_identity); written to the trace
  // as an identity record right after `process` when have_identity.
  bool have_identity = false;
  format::IdentityRecord identity;
};

// Where the values come from and where warnings go; the defaults are getenv and stderr.
using EnvLookup = const char* (*)(const char* name);
using WarnFn = void (*)(const char* line);  // one line, without "\n"

// Parses every option in table order. GPUHEAP_DISABLE comes first: when it is set, nothing
// else is read or warned about. Returns the number of invalid values (each warned once).
int read_settings(Settings* out, EnvLookup lookup = nullptr, WarnFn warn = nullptr) noexcept;

// The process's rank in a distributed job, from the first launcher family whose rank
// variable holds a decimal number: torchrun (RANK, LOCAL_RANK, WORLD_SIZE), Open MPI
// (OMPI_COMM_WORLD_*), PMI (PMI_RANK, MPI_LOCALRANKID, PMI_SIZE), Slurm (SLURM_PROCID,
// SLURM_LOCALID, SLURM_NTASKS). torchrun's come first: under `srun torchrun` SLURM_PROCID
// numbers the node's launcher, RANK the worker. A local rank or size that is not a number
// is -1 (unknown). False (and *out untouched) when none of them names a rank. Never warns:
// these variables belong to the launcher, not to gpuheap.
bool read_identity(format::IdentityRecord* out, EnvLookup lookup = nullptr) noexcept;

// The single-value parsers (parse_bool, parse_uint, parse_size, parse_duration) are the
// rules both halves share: common/parse.h.

// ---- GPUHEAP_LIMIT ----
//   SPEC[,SPEC...]   SPEC = [DEVICE:]VALUE
//   VALUE = a size with a unit ("8GiB", "512MiB", "2GB" decimal, "8G" binary, "4096b"
//           bytes) or a fraction of the device's total memory ("0.5", "1.0": a number
//           without a unit, with a '.', in (0, 1]). A number without a unit that is not
//           such a fraction ("2", "1.5") is invalid: the whole variable is then ignored
//           (one warning, no cap), as for any invalid value.
//   A SPEC without DEVICE applies to every device not named explicitly. A DEVICE this
//   process does not have is warned about once, when the first cap is looked up
//   (limits.cpp); the other SPECs still apply.
inline constexpr int kMaxDevices = 64;

struct LimitSpec {
  bool set = false;
  bool fraction = false;
  double value = 0;  // bytes, or fraction of total
};

// Parses a GPUHEAP_LIMIT value into per-device specs (index kMaxDevices = default). Returns
// false on a syntax error.
bool parse_limit(const char* text, LimitSpec out[kMaxDevices + 1]) noexcept;
// Parses one size/fraction value; false on error.
bool parse_limit_value(const char* text, std::size_t len, LimitSpec* out) noexcept;

}  // namespace preload
}  // namespace gpuheap
