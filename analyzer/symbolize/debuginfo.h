// Where the symbolizer finds separate debug information, without trusting any name: the
// module's build-id path under /usr/lib/debug/.build-id, its .gnu_debuglink name (next to
// it, in .debug/, under /usr/lib/debug), the dwz alternate file its DWARF names
// (.gnu_debugaltlink), and, only when the user opts in, debuginfod servers. Every
// candidate is opened through open_regular() (safe_file.h): a FIFO, device or directory
// planted at any of these names is skipped, never waited on. libdwfl's own
// dwfl_standard_find_debuginfo opens them with a plain open(2), and would ask the servers in
// DEBUGINFOD_URLS for every build-id of a trace.
#pragma once

#include <elfutils/libdwfl.h>

#include <cstdint>

namespace gpuheap {

// debuginfod: off by default (DEBUGINFOD_URLS is removed from the environment, so that no
// part of libdw queries a server either). enabled: the servers in DEBUGINFOD_URLS are asked
// for what is not found locally, each download limited to timeout_s (DEBUGINFOD_TIMEOUT,
// DEBUGINFOD_MAXTIME). Call before the first symbolization.
void configure_debuginfod(bool enabled, double timeout_s);

namespace symbolize {

// ELF and debug files larger than this are not opened (a bound for a file whose size a
// trace or a planted file chooses; real debug files of the largest libraries are far smaller).
inline constexpr std::uint64_t kMaxElfBytes = std::uint64_t{64} << 30;
inline constexpr std::uint64_t kMinElfBytes = 52;  // an ELF header

// Dwfl callbacks for one offline module: find_elf and find_debuginfo open only through
// open_regular() and validate what they open (build-id, or the debuglink CRC).
extern const Dwfl_Callbacks kGuardedCallbacks;

// What the lookups for the module being opened found. The symbolizer installs one around
// the calls that make libdwfl look (dwfl_module_getsymtab, dwfl_module_getdwarf).
struct DebugLookup {
  bool alt_found = false;  // a dwz alternate file was opened and validated
};
class DebugLookupScope {
 public:
  explicit DebugLookupScope(DebugLookup* l);
  ~DebugLookupScope();
  DebugLookupScope(const DebugLookupScope&) = delete;
  DebugLookupScope& operator=(const DebugLookupScope&) = delete;

 private:
  DebugLookup* prev_;
};

// Whether this Dwarf names a dwz alternate file (.gnu_debugaltlink).
bool needs_alt(Dwarf* dw);

}  // namespace symbolize
}  // namespace gpuheap
