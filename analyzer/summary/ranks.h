// Several processes (the ranks of a distributed job, or any traces given together): one row
// per process and device (rank, host, device, pid, peaks, when, leaks) and the spread
// across them, for summary (text, JSON), check's messages and the HTML report. A device is
// (host, device index): two hosts' device 0 are two GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/model/analysis.h"

namespace gpuheap {

struct RankRow {
  std::size_t trace = 0;                                     // index into Analysis::traces
  std::int32_t rank = -1, local_rank = -1, world_size = -1;  // -1: the trace does not say
  std::string host;
  int device = -1;  // -1: the process recorded no device memory
  std::uint32_t pid = 0;
  std::int64_t peak_requested = 0;  // peak held device memory, requested bytes (summary's "peak")
  std::int64_t peak_reserved = 0;   // the pool's peak reserved bytes
  std::uint64_t peak_ns = 0;        // when peak_requested fell, since the earliest process start (wall clock)
  std::uint64_t leaked_bytes = 0;   // requested bytes live at the end on this device
};

// Rows ordered by rank (processes without one last, in the order given), then host, pid,
// device. `device` >= 0: only that device index (of every host).
std::vector<RankRow> rank_rows(const Analysis& a, int device = -1);

// The spread of one figure across the rows: the largest and smallest, and which rows.
struct RankSpread {
  std::int64_t max = 0, min = 0;
  std::size_t max_row = 0, min_row = 0;  // indexes into the rows
  double ratio() const { return min > 0 ? static_cast<double>(max) / static_cast<double>(min) : 0; }  // 0: min is 0
};
RankSpread peak_requested_spread(const std::vector<RankRow>& rows);  // rows non-empty
RankSpread peak_reserved_spread(const std::vector<RankRow>& rows);

// "rank 3 (host b, device 0)" / "pid 4242 (host b, device 0)"; the host only with several.
std::string row_name(const RankRow& r, bool several_hosts);
// A merged device as messages name it: "device 0", "device 0 of host b", with " (rank 1)"
// or " (ranks 0, 1)" when its processes have ranks.
std::string merged_device_name(const Analysis& a, const MergedDevice& md);

// The table and the spread as summary prints them first with several traces ("" with one).
std::string ranks_text(const Analysis& a, int device = -1);
// {"rows": [...], "spread": {...}} (docs/summary-json.md "ranks"); null with one trace.
nlohmann::json ranks_json(const Analysis& a, int device = -1);

}  // namespace gpuheap
