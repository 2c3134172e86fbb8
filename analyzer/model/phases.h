// Phases in the reports: the by-phase table, windows for --phase/--time/--after, growth.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "analyzer/model/analysis.h"

namespace gpuheap {

// Instances of the same name at the same depth aggregate into one row: count, summed time,
// the largest peak of any instance (the "worst step"), allocations summed over instances.
struct PhaseRow {
  std::string name;
  int depth = 0;
  bool mark = false;
  std::uint64_t count = 0, total_ns = 0, allocs = 0;
  std::int64_t peak_requested = 0, peak_allocated = 0;
};
// Rows in order of their first instance (nesting follows from depth), for one device.
std::vector<PhaseRow> phase_rows(const Model& m, int device);

// What restricts a summary/check: --phase NAME, --time FROM:TO, --after TIME|MARK.
struct WindowSpec {
  std::string phase, time, after;
  bool any() const { return !phase.empty() || !time.empty() || !after.empty(); }
  std::string describe() const;
};
using Intervals = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
// The trace-clock intervals of `spec` in `m` (a model of the whole trace). Throws
// InputError (exit 2) for an unknown phase name (listing the known ones) or a bad time.
Intervals resolve_window(const Model& m, const WindowSpec& spec);

// Runs analyze() over the whole traces, and again restricted when `spec` says so.
Analysis analyze_window(const std::vector<std::string>& paths, const AnalyzeOptions& opt, const WindowSpec& spec);

// Growth: requested bytes live at the end of each instance of a repeated range (a step),
// against the end of its 2nd instance (the first steady one: the 1st includes warm-up).
struct GrowthDevice {
  int device = 0;
  std::int64_t baseline = 0, last = 0, growth = 0;  // growth = last - baseline
  std::vector<std::int64_t> ends;                   // per instance, in order
};
struct Growth {
  bool valid = false;  // a range with at least 2 instances exists
  std::string phase;
  std::uint64_t instances = 0;
  std::int64_t growth = 0;  // the largest of the devices'
  int growth_device = 0;
  std::vector<GrowthDevice> devices;
};
// `name` empty: the most repeated top-level range (ties: the first to start). A given name
// that is not a range of the trace throws InputError.
Growth phase_growth(const Model& m, const std::string& name);

}  // namespace gpuheap
