// Where a live job's traces are (job.h): targets resolved to a `gpuheap run`'s path list,
// directories, trace files and the process whose end closes the job.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpuheap::live {

struct Sources {
  std::string path_list;           // a `gpuheap run`'s list of trace paths (GPUHEAP_PATH_FILE)
  std::vector<std::string> dirs;   // every trace in them, new ones included
  std::vector<std::string> files;  // named traces, or the traces a PID had open
  pid_t root = 0;                  // a PID named: the job lasts while it runs
  std::uint64_t list_read = 0;     // bytes of the list taken (whole lines)
};

// The targets of `gpuheap top` (TRACE... | PID... | DIR; none: the newest path list of this
// user's running `gpuheap run`). Throws UsageError naming a target that leads to no trace.
Sources resolve_targets(const std::vector<std::string>& targets);
// Trace paths that appeared since the last call (the list's new lines, the directories'
// new traces) into `found`; returns the list's failure lines ("tracing failed in process
// PID: WHY").
std::vector<std::string> list_entries(Sources& s, std::vector<std::string>& found);
// No more traces can come: the PID named is gone, or the path list was removed (its run
// has waited for the program), or only files and directories were named.
bool sources_complete(const Sources& s);
std::string describe_sources(const Sources& s);

// The process is gone: no such pid, or a zombie (killed, not yet waited for).
bool process_gone(std::uint32_t pid);
std::string this_host();
// One line of a path list (GPUHEAP_PATH_FILE) decoded: `\n` a newline, `\\` a backslash.
std::string path_list_entry(const std::string& line);

}  // namespace gpuheap::live
