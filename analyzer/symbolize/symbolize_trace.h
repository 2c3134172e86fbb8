// `gpuheap symbolize TRACE`: on the machine where the trace's modules are, every native ip
// its stacks use is symbolized (symbolize.h, libdw) and the frames are stored in the trace
// (format/trace.h symbol_string / symbol_frames records, before its end record), so that the
// trace reads with function names and lines anywhere. The file is rewritten beside itself
// and renamed into place (trace_files.h); a .zst trace stays zstd.
#pragma once

#include <cstdint>
#include <string>

namespace gpuheap {

struct SymbolizeTraceOptions {
  bool allow_truncated = false;  // symbolize a trace without an end record / cut mid-record
};
struct SymbolizeTraceResult {
  std::uint64_t ips = 0;         // distinct native ips the stacks use
  std::uint64_t already = 0;     // of them, with frames stored by an earlier run
  std::uint64_t added = 0;       // symbolized now and stored
  std::uint64_t unresolved = 0;  // no name found here (module missing, no symbols)
  std::uint64_t strings = 0;     // symbol_string records added
  bool rewritten = false;        // false: nothing new to store, the file is unchanged
};
// Throws InputError (exit 2) on an unreadable, corrupt or (without allow_truncated)
// truncated trace; the file is then unchanged.
SymbolizeTraceResult symbolize_trace(const std::string& path, const SymbolizeTraceOptions& opt);

}  // namespace gpuheap
