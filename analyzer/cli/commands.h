// Subcommands that are more than a report: dump and run.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "analyzer/cli/run_finish.h"

namespace gpuheap {

// Writes every record of the trace as one text line to `out`; returns the exit status.
// Throws InputError for unreadable / invalid input. `progress`: the progress line on stderr
// (progress.h; only on a terminal, after a second).
int dump_trace(const std::string& path, std::FILE* out, bool progress = true);

struct RunOptions {
  std::string output;  // GPUHEAP_OUTPUT pattern ("" = preload's default)
  bool no_stacks = false, no_pool = false, simulate = false;
  bool keep_framework_pools = false;
  std::string limit;            // GPUHEAP_LIMIT ("" = none)
  std::string aggregate;        // GPUHEAP_AGGREGATE: rolling-window size ("" = full traces)
  bool allow_no_trace = false;  // a traced process that could not write its trace is not an error
  bool force = false;           // -o NAME may replace an existing NAME (and NAME.zst)
  bool quiet = false;           // -q: nothing on stderr after a successful run (errors still)
  bool live = false;            // --live: the live view (analyzer/live) while the program runs
  std::string live_output;      // --live: the program's stdout and stderr go here ("" = gpuheap-live.PID.out)
  std::vector<std::string> command;
  FinishOptions finish;  // after the program exits: symbolize, compress (run_finish.h)
};
// Runs the command under the preload; returns its exit status (128+signal when killed), or
// 3 when it exited 0 but a traced process could not write its trace (unless allow_no_trace).
int run_traced(const RunOptions& opt);

// Directory of the running gpuheap binary (/proc/self/exe).
std::string self_dir();
// libgpuheap.so next to the binary, or in ../lib; "" when neither exists.
std::string find_preload_library();

}  // namespace gpuheap
