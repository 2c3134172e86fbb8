// `gpuheap check --max-category NAME=SIZE` (check.h): a limit on the bytes of one category
// (docs/categories.md) live at each device's peak; and, for a failing --baseline gate, the
// category that grew most over the baseline's.
#include <algorithm>
#include <array>

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

// A whole number from a baseline document (fallback where absent or of another type: a
// baseline is input, never trusted to have the right shapes).
std::int64_t int_at(const nlohmann::json& j, const char* key, std::int64_t fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

// Bytes by category from a summary --json `categories` totals object (0 where absent).
std::array<std::int64_t, kNumCategories> totals_of(const nlohmann::json& t) {
  std::array<std::int64_t, kNumCategories> out{};
  if (!t.is_object()) return out;
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    auto it = t.find(category_name(static_cast<Category>(c)));
    if (it != t.end()) out[c] = int_at(*it, "bytes", 0);
  }
  return out;
}

}  // namespace

std::string grown_category(SiteLists& sites, const nlohmann::json& baseline, int device) {
  const Analysis& a = sites.analysis();
  if (a.traces.size() != 1 || a.traces[0]->windowed() || !baseline.is_object()) return {};
  auto jc = baseline.find("categories");
  if (jc == baseline.end() || !jc->is_object()) return {};
  const auto& rep = sites.categories(0);
  const CategoryBytes* now = device < 0 ? &rep.leaked : nullptr;
  const nlohmann::json* before = nullptr;
  if (device < 0) {
    auto l = jc->find("leaked");
    if (l != jc->end()) before = &*l;
  } else {
    for (const auto& mo : rep.peaks)
      if (mo.valid && mo.device == device) now = &mo.totals;
    auto peaks = jc->find("at_peak");
    if (peaks != jc->end() && peaks->is_array())
      for (const auto& p : *peaks)
        if (int_at(p, "device", -1) == device && p.contains("totals")) before = &p["totals"];
  }
  if (!now || !before || !before->is_object()) return {};
  const auto was = totals_of(*before);
  std::size_t best = kNumCategories;
  std::int64_t most = 0;
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    const std::int64_t d = static_cast<std::int64_t>(now->bytes[c]) - was[c];
    if (d > most) most = d, best = c;
  }
  if (best == kNumCategories) return {};
  return fmt::format("category grew most: {} +{} ({} -> {}) {}", category_name(static_cast<Category>(best)),
                     human_bytes(static_cast<std::uint64_t>(most)),
                     human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(was[best], 0))),
                     human_bytes(now->bytes[best]), device < 0 ? "among the leaks" : "at the peak");
}

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
