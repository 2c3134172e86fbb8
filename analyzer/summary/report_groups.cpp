// --group-by: the peak's sites summed by the label's line, function, file, library or the
// category of most of the site's bytes (docs/categories.md); one grouping for the text and
// the JSON summary.
#include <algorithm>
#include <map>

#include "analyzer/base/text_safe.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap {

namespace {

std::string group_key(SiteLists& sites, std::size_t ti, std::uint32_t stack, const std::string& by) {
  StackResolver& res = sites.res(ti);
  if (by == "category") return std::string(category_name(sites.site_category(ti, stack)));
  const auto& fr = res.frames(stack);
  if (by == "module") return text_safe(res.library(stack));
  if (fr.empty()) return "<no stack>";
  if (by == "line") return site_label_text(fr, true);
  if (by == "function") return text_safe(short_name(site_label(fr)));
  const Frame& f = fr[label_pos(fr).index];
  return text_safe(std::string(base_name(!f.file.empty() ? f.file : f.module.empty() ? "?" : f.module)));
}

}  // namespace

std::vector<PeakGroup> peak_groups(SiteLists& sites, std::size_t ti, std::size_t di, const SummaryOptions& opt) {
  std::map<std::string, PeakGroup> groups;
  SummaryOptions every = opt;  // every site of --library (or all), not the top ones
  every.full = true;
  StackResolver& res = sites.res(ti);
  for (const auto& r : shown_sites(sites.peak(ti, di), res, every)) {
    std::string key = group_key(sites, ti, r.stack, opt.group_by);
    PeakGroup& g = groups[key];
    g.key = std::move(key);
    g.bytes += r.bytes, g.allocated += r.allocated, g.count += r.count, ++g.sites;
  }
  std::vector<PeakGroup> rows;
  rows.reserve(groups.size());
  for (auto& [k, g] : groups) rows.push_back(std::move(g));
  // Ties keep the key order (the map's): the same trace always gives the same list.
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  if (!opt.full && rows.size() > opt.top) rows.resize(opt.top);
  return rows;
}

}  // namespace gpuheap
