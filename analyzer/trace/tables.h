// The trace's own tables, owned: what it says about the process, its modules, its Python
// code objects and the frames `gpuheap symbolize` stored in it. The replay (model/), the
// symbolizer (symbolize/) and the reports read them; none of them is needed to hold them.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/trace.h"

namespace gpuheap {

struct TraceInfo {
  std::string path;
  bool have_process = false;
  std::uint32_t pid = 0, ppid = 0;
  std::uint64_t wall_ns = 0, mono_ns = 0;
  std::string hostname, version, exe;
  std::vector<std::string> command;
  // The identity record's (format v4): -1 where the launcher did not say, rank -1 without one.
  std::int32_t rank = -1, local_rank = -1, world_size = -1;
  format::RankSource rank_source = format::RankSource::torchrun;
  std::uint64_t first_ts = 0, last_ts = 0;
  bool have_ts = false;
  std::uint64_t records = 0, events = 0;  // all records; alloc/free/... events
  bool truncated = false, cut_mid_record = false, has_end = false;
  format::EndReason end_reason = format::EndReason::exit;
  std::uint64_t end_ts = 0;
  std::uint64_t unmatched_frees = 0, unmatched_free_completed = 0, reused_live_ptrs = 0;
  // A segment of a rolling window (`gpuheap run --aggregate`, format v6 snapshot records):
  // the events before window_start_ts (events_before of them) are not in the file, only the
  // state they left (docs/cli.md says which figures stay exact).
  bool window = false;
  std::uint32_t window_segment = 0;
  std::uint64_t window_start_ts = 0, events_before = 0;
  std::uint64_t duration_ns() const {
    std::uint64_t last = has_end ? end_ts : last_ts;
    std::uint64_t first = have_process ? mono_ns : first_ts;
    return last > first ? last - first : 0;
  }
  // Trace clock -> ns since the epoch (aligns processes of a multi-trace run).
  std::uint64_t to_wall(std::uint64_t ts) const { return wall_ns + (ts - mono_ns); }
};

struct OwnedModule {
  std::uint64_t base = 0, lo = 0, hi = 0;
  std::string path, build_id;
};

// A py_code record, owned (analyzer/symbolize/pyframes.h turns a frame of it into a file:line).
struct PyCode {
  std::uint8_t major = 3, minor = 0;
  std::int32_t firstlineno = 0;
  std::string filename, name, linetable;
};

// The frames a trace stores for its stack ips (format/trace.h symbol records), owned.
struct StoredFrame {
  std::uint32_t function = 0, file = 0, line = 0;  // string ids (0: unknown), line (0: unknown)
  bool inlined = false;
};
struct StoredSymbols {
  std::unordered_map<std::uint32_t, std::string> strings;              // by id
  std::unordered_map<std::uint64_t, std::vector<StoredFrame>> frames;  // by stack entry (return address)
  void add(const format::SymbolStringRecord& r) { strings[r.id] = std::string(r.text); }
  void add(const format::SymbolFramesRecord& r);
  const std::string& str(std::uint32_t id) const;  // "" for 0 or an id never defined
};

}  // namespace gpuheap
