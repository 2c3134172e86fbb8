// `gpuheap diff A B`: per-device totals, bytes by category at each device's peak, per-site
// rows (report.h diff_sites) and a CI gate (--fail-on METRIC,... with --tolerance PCT /
// --tolerance-bytes SIZE). JSON schema gpuheap.diff/1 (docs/diff-json.md).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/model/category_pass.h"
#include "analyzer/model/model.h"
#include "analyzer/summary/report.h"

namespace gpuheap {

// The gated quantities, named as `check` names its limits (--max-requested ...) plus count.
enum DiffMetric : int { kDiffRequested, kDiffAllocated, kDiffReserved, kDiffLeaked, kDiffCount, kNumDiffMetrics };
const char* diff_metric_name(int m);  // "requested", "allocated", "reserved", "leaked", "count"
std::optional<int> diff_metric_from(const std::string& name);

// One device's totals in A and B (0 where the trace never used it).
struct DeviceDiff {
  int device = 0;
  bool in_a = false, in_b = false;
  std::array<std::int64_t, kNumDiffMetrics> a{}, b{};
};
// Every GPU (device >= 0) present in either trace, by index.
std::vector<DeviceDiff> diff_devices(const Model& a, const Model& b);
// (b - a) / a in %; nullopt for growth from 0 (infinite), 0 when both are 0.
std::optional<double> change_pct(std::int64_t a, std::int64_t b);

// One device's requested bytes live at its peak, by category (docs/categories.md), in A and
// B: the moment and figures of `summary`'s "Memory by category at the peak".
struct CategoryDiff {
  int device = 0;
  bool in_a = false, in_b = false;  // the trace has a peak on that device
  std::array<std::int64_t, kNumCategories> a{}, b{};
};
// Every GPU with a peak in either trace, by index. `ca`/`cb` are categorize()'s of a and b.
std::vector<CategoryDiff> diff_categories(const Model& a, const CategoryReport& ca, const Model& b,
                                          const CategoryReport& cb);
// The "By category" table: the categories with bytes in A or B; one line instead when
// neither trace has anything but unknown (no training phase found, no stack rule matched).
std::string diff_categories_text(const std::vector<CategoryDiff>& cats);

struct DiffGate {
  std::vector<int> fail_on;           // DiffMetric values; empty: no gate (exit 0)
  double tolerance_pct = 5.0;         // growth allowed, in % of A
  std::uint64_t tolerance_bytes = 0;  // growth up to this never fails
  bool allow_truncated = false;
};
struct DiffBreach {
  int metric = 0, device = 0;
  std::int64_t a = 0, b = 0;
};
struct DiffVerdict {
  bool gated = false;  // --fail-on was given
  std::vector<DiffBreach> breaches;
  std::vector<std::string> incomplete;  // one line per trace that is not whole (gated only)
  bool failed() const { return !breaches.empty() || (!incomplete.empty() && !allowed_truncated); }
  bool allowed_truncated = false;
};
DiffVerdict diff_verdict(const Model& a, const Model& b, const std::vector<DeviceDiff>& devs, const DiffGate& gate);

// The totals table that precedes the per-site table (diff_text) in the text output.
std::string diff_totals_text(const std::vector<DeviceDiff>& devs, const Model& a, const Model& b);
// "FAIL: ..." / "note: ..." lines of a verdict, without the "gpuheap diff: " prefix.
std::vector<std::string> verdict_lines(const DiffVerdict& v, const DiffGate& gate);
nlohmann::json diff_json(const std::vector<DeviceDiff>& devs, const std::vector<DiffRow>& rows, std::size_t top,
                         const Model& a, const Model& b, const DiffVerdict& v, const DiffGate& gate);
// The document's "categories" array (diff_categories), added by the CLI.
nlohmann::json diff_categories_json(const std::vector<CategoryDiff>& cats);

}  // namespace gpuheap
