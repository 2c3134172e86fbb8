// Who a trace is of, from its first records only (the process record and the identity
// record that follows it, format v4): what --pid, --rank and --host select on before a
// trace is replayed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpuheap {

struct TraceHead {
  std::string path, hostname;
  std::uint32_t pid = 0;
  std::int32_t rank = -1, local_rank = -1, world_size = -1;  // -1: not in the trace
};

// Throws NotATraceError when the first record is not a process record (as TraceReader).
TraceHead read_trace_head(const std::string& path);

// The traces (of `paths`, in their order) that every given selector accepts: pid one of
// `pids`, rank one of `ranks` (a trace without a rank has none), hostname one of `hosts`;
// an empty list accepts all. None left: InputError naming what the traces hold.
struct TraceSelection {
  std::vector<std::int64_t> pids, ranks;
  std::vector<std::string> hosts;
  bool any() const { return !pids.empty() || !ranks.empty() || !hosts.empty(); }
};
std::vector<std::string> select_traces(const std::vector<std::string>& paths, const TraceSelection& sel);

}  // namespace gpuheap
