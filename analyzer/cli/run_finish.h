// `gpuheap run`'s finishing step, once the program has exited: each trace it wrote is
// symbolized (symbolize_trace.h: the frames stored in the trace, here where the modules are)
// and compressed (trace_files.h: TRACE.zst). While the program runs the trace stays the
// preload's crash-safe raw file; plain LD_PRELOAD never gets this step.
#pragma once

#include <string>
#include <vector>

namespace gpuheap {

struct FinishOptions {
  bool symbolize = true;  // --no-symbolize turns it off
  bool compress = true;   // --no-compress turns it off
  bool force = false;     // replace an existing TRACE.zst
  bool verbose = false;   // list the modules that were not found
};

// Returns the final path of each trace (TRACE.zst once compressed), in the order given. A
// trace without an end record (its process died, or still runs and writes it) is left as it
// is, with a note; a step that fails warns and leaves the trace as the step before left it.
// Never throws for one trace's trouble.
std::vector<std::string> finish_traces(const std::vector<std::string>& paths, const FinishOptions& opt);

}  // namespace gpuheap
