// `gpuheap check`: limits and baseline comparison for CI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/model/analysis.h"
#include "analyzer/model/categories.h"

namespace gpuheap {

struct CheckOptions {
  std::optional<std::uint64_t> max_requested, max_allocated, max_reserved, max_leaked;
  std::string baseline;        // a `summary --json` document of an earlier run
  double tolerance_pct = 5.0;  // allowed growth over the baseline
  bool all_frames = false;
  bool allow_truncated = false;  // check a trace without an end record (or cut) anyway
  // Growth of live bytes across the instances of a repeated phase (analyzer/model/phases.h);
  // a trace without two instances of it fails the gate (nothing was measured).
  std::optional<std::uint64_t> max_growth;
  std::string growth_phase;  // "" = the most repeated top-level range
  // --max-category NAME=SIZE: bytes of a category (docs/categories.md) live at each device's peak.
  std::vector<std::pair<Category, std::uint64_t>> max_category;
};

// The four measured quantities, as `check` and baselines see them: the largest per-GPU
// peak (a GPU is a device index of one host: processes of one host on one device are
// merged by aligned time, those of two hosts never), and leaked bytes summed.
struct CheckMeasures {
  std::int64_t requested = 0, allocated = 0, reserved = 0, leaked = 0;
  int requested_dev = 0, allocated_dev = 0, reserved_dev = 0;
  // The host of each peak's GPU ("" with one trace, or from a baseline document).
  std::string requested_host, allocated_host, reserved_host;
  // How messages name each peak's GPU ("device 0 of host b (rank 1)"); "" = "device N".
  std::string requested_at, allocated_at, reserved_at;
};
CheckMeasures measure(const Analysis& a);
// From a summary --json document (single- or multi-trace). Throws InputError when the
// document is not one.
CheckMeasures measure_baseline(const nlohmann::json& doc);

// A trace that is not whole (no end record: killed or still running; or cut mid-record)
// fails the check unless allow_truncated: its peaks and leaks describe only what was
// written, so a limit that "held" on it says nothing. Then no limit is reported as passed.
struct CheckResult {
  std::vector<std::string> violations;  // one line each
  std::vector<std::string> passed;      // one line per limit that held (empty when incomplete and not allowed)
  std::vector<std::string> notes;       // incomplete traces accepted with allow_truncated
};
CheckResult run_check(const Analysis& a, const CheckOptions& opt);
// The --max-category limits (check_categories.cpp), added to r by run_check.
void check_categories(const Analysis& a, const CheckOptions& opt, CheckResult& r);
// For a failing --baseline gate: "grew: +7.00 MiB at LABEL [LIBRARY] (0 B -> 7.00 MiB, new);
// ..." for the sites of this run whose bytes exceed their baseline site's (paired as `diff`
// pairs sites, site_match.h), largest growth first, at most 3 named: at the peak of
// `device`, or among the leaks for device < 0. "" when no site grew. A site the baseline
// does not list is new when its list is whole, else its growth is unknown and said so.
// A GPU is a device of one host: `host` (this run's) and `base_host` (the baseline's) name
// the hosts of the two GPUs the gate compared ("": every process, as with one trace), and
// only their processes' sites are compared, never a device index summed across hosts.
struct GrowthGpu {
  int device = -1;  // < 0: the leaks
  std::string host, base_host;
};
std::string grown_sites(const Analysis& a, const nlohmann::json& baseline, const GrowthGpu& gpu, bool all_frames);
// For the same gate (check_categories.cpp): "category grew most: activation +4.00 MiB (8.00
// MiB -> 12.0 MiB) at the peak" -- from the baseline's `categories` (at the peak of `device`,
// or of the leaks for device < 0) to this run's. "" when none grew, or either side has no
// categories to compare (several traces, a window, a baseline without them). `sites` are
// of this run's analysis.
class SiteLists;
std::string grown_category(SiteLists& sites, const nlohmann::json& baseline, int device);
// Why a trace is not whole ("no end record: ..."), for the incomplete-trace lines that
// check and diff --fail-on print.
std::string incompleteness(const TraceInfo& in);

}  // namespace gpuheap
