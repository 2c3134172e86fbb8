// `gpuheap check --max-category NAME=SIZE` (check.h): a limit on the bytes of one category
// (docs/categories.md) live at each device's peak.
#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"

namespace gpuheap {

namespace {

// The category's largest site at that moment, as one line for a message.
std::string top_of(SiteLists& sites, std::size_t ti, const CategoryMoment& mo, Category c) {
  for (const auto& s : mo.sites) {  // by category, then bytes descending
    if (s.cat != c) continue;
    return fmt::format("{} in {} allocations at {}", human_bytes(s.bytes), s.count,
                       text_safe(site_label_text(sites.res(ti).frames(s.stack), true)));
  }
  return "none";
}

}  // namespace

void check_categories(const Analysis& a, const CheckOptions& opt, CheckResult& r) {
  if (opt.max_category.empty()) return;
  SiteLists sites(a, opt.all_frames);
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
    const Model& m = *a.traces[ti];
    if (m.windowed()) {
      r.violations.push_back(
          fmt::format("{}: --max-category measures the whole trace, not a window (--phase, "
                      "--time, --after)",
                      text_safe(m.info.path)));
      continue;
    }
    const auto& rep = sites.categories(ti);
    for (const auto& [cat, limit] : opt.max_category) {
      for (const auto& mo : rep.peaks) {
        if (!mo.valid) continue;
        const std::uint64_t got = mo.totals.of(cat);
        const std::string what = fmt::format("{} at the peak of device {}{}: {} ({} B)", category_name(cat), mo.device,
                                             a.traces.size() > 1 ? " in " + text_safe(m.info.path) : "",
                                             human_bytes(got), got);
        if (got > limit) {
          r.violations.push_back(fmt::format("{} exceeds --max-category {}={}; top site: {}", what, category_name(cat),
                                             human_bytes(limit), top_of(sites, ti, mo, cat)));
        } else {
          r.passed.push_back(
              fmt::format("{} within --max-category {}={}", what, category_name(cat), human_bytes(limit)));
        }
      }
    }
  }
}

}  // namespace gpuheap
