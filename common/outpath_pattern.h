// The trace output path pattern (GPUHEAP_OUTPUT), a rule both halves share: the preload
// expands it for each traced process (preload/record/outpath.h creates the file), and
// `gpuheap run` resolves it against its directory the way the preload does.
//   %p  process id            %h  hostname
//   %r  $RANK (empty if unset) %n  program name (basename of /proc/self/exe, else argv[0])
//   %%  a literal '%'
// An unknown conversion ("%x") and a trailing lone '%' are copied literally, so a typo
// still yields a usable, recognisable file name. Substituted values have '/' replaced by
// '_' (a RANK or hostname must never move the file into another directory).
// No exceptions, no allocation (the preload calls these at load and in its hooks).
#pragma once

#include <cstddef>

namespace gpuheap {
namespace common {

struct OutpathVars {
  long pid = 0;
  const char* hostname = "";
  const char* rank = nullptr;  // nullptr: RANK unset -> %r expands to ""
  const char* program = "";
};

inline constexpr const char* kDefaultOutputPattern = "./gpuheap.%n.%p.trace";

// Expands `pattern` (nullptr or "" = default) into out[0..cap). Returns the length
// written (NUL excluded), or -1 if the result does not fit.
long expand_output_pattern(const char* pattern, const OutpathVars& vars, char* out, std::size_t cap) noexcept;

// `pattern` (nullptr or "" = default) resolved against the directory `cwd` into out[0..cap):
// a relative pattern becomes "CWD/PATTERN" ("./" dropped), with each '%' of CWD written
// "%%" so the directory is taken literally; an absolute one is copied. Returns the length,
// or -1 if it does not fit or cwd is not absolute (out then holds ""). The preload does this
// once, at load (core/runtime.cpp), so that a process that changes directory before its
// first event, and the programs it execs, write where the job started.
long absolute_output_pattern(const char* pattern, const char* cwd, char* out, std::size_t cap) noexcept;

}  // namespace common
}  // namespace gpuheap
