// "Memory by category" (docs/categories.md): the summary's section and JSON object.
#include <algorithm>

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/report.h"

namespace gpuheap {

namespace {

double pct(std::uint64_t part, std::uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// A site as the category lists name it: its library, label and autograd node.
std::string category_site(SiteLists& sites, std::size_t ti, std::uint32_t stack, bool full) {
  const auto& t = sites.traits(ti, stack);
  std::string where = !t.library.empty() ? "[" + t.library + "] " : "";
  where += text_safe(site_label_text(sites.res(ti).frames(stack), !full));
  if (!t.node.empty()) where += " [autograd " + text_safe(t.node) + "]";
  // An autograd thread's stack stops at the engine: the line that called backward() is the
  // main thread's (docs/coverage.md).
  const auto& callers = sites.categories(ti).backward_caller;
  auto it = callers.find(stack);
  if (it != callers.end()) where += " (backward() from " + text_safe(it->second) + ")";
  return where;
}

std::string libraries_text(const CategoryMoment& mo) {
  std::string out;
  for (const auto& [lib, b] : mo.libraries)
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", text_safe(lib), human_bytes(b));
  return out;
}

// The default view: every category with bytes, packed into lines (the summary fits two
// screens); --full: one line per category, every site of it below.
void moment_brief(std::string& out, const CategoryMoment& mo) {
  const std::uint64_t total = mo.totals.total();
  std::string line = " ";
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    if (!mo.totals.count[c]) continue;
    const auto cat = static_cast<Category>(c);
    std::string item = fmt::format(" {} {} ({:.1f}%{})", category_name(cat), human_bytes(mo.totals.bytes[c]),
                                   pct(mo.totals.bytes[c], total),
                                   cat == Category::library && !mo.libraries.empty() ? ": " + libraries_text(mo) : "");
    if (line.size() > 1 && line.size() + item.size() > 110) {
      out += line + ",\n", line = " ";
    } else if (line.size() > 1) {
      line += ',';
    }
    line += item;
  }
  out += line + "\n";
}

void moment_text(std::string& out, const CategoryMoment& mo, SiteLists& sites, std::size_t ti,
                 const SummaryOptions& opt) {
  if (!opt.full) return moment_brief(out, mo);
  const std::uint64_t total = mo.totals.total();
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    if (!mo.totals.count[c]) continue;
    const auto cat = static_cast<Category>(c);
    std::string row = fmt::format("  {:<16} {:>10} {:5.1f}% {:>6} alloc{}  {}", category_name(cat),
                                  human_bytes(mo.totals.bytes[c]), pct(mo.totals.bytes[c], total), mo.totals.count[c],
                                  mo.totals.count[c] == 1 ? " " : "s",
                                  cat == Category::library ? libraries_text(mo) : "");
    while (row.back() == ' ') row.pop_back();
    out += row + "\n";
    for (const auto& s : mo.sites)
      if (s.cat == cat)
        out += fmt::format("      {:>10} in {:>4} {}\n", human_bytes(s.bytes), s.count,
                           category_site(sites, ti, s.stack, true));
  }
}

// Where the moment was in training, as found from frames ("" when no phase was found).
std::string moment_phase(const CategoryMoment& mo, const CategoryReport& rep) {
  if (!rep.saw_training) return "";
  if (mo.phase == TrainPhase::none)
    return fmt::format(", outside forward/backward/step (step {} of {})", mo.step, rep.steps);
  return fmt::format(", in the {} of step {} of {}", train_phase_name(mo.phase), mo.step, rep.steps);
}

void phases_found_text(std::string& out, const CategoryReport& rep) {
  if (!rep.saw_training) return;
  // The largest instance of each phase kind over the steps.
  const FoundPhase* best[5] = {};
  for (const auto& p : rep.phases) {
    auto i = static_cast<std::size_t>(p.phase);
    if (!best[i] || p.peak > best[i]->peak) best[i] = &p;
  }
  out += fmt::format("  phases found from frames: {} step{}; highest of each:", rep.steps, rep.steps == 1 ? "" : "s");
  for (auto* p : best) {
    if (!p || p->phase == TrainPhase::none) continue;
    out += fmt::format(" {} {} (step {});", train_phase_name(p->phase), human_bytes(p->peak), p->step);
  }
  out.back() = '\n';
}

bool nothing_decided(const CategoryMoment& mo, const CategoryReport& rep) {
  // Without a phase found only the stack rules decide: a section only when they did.
  return !rep.saw_training && mo.totals.of(Category::unknown) == mo.totals.total();
}

// Where an OOM's step began, as its comparison line names it (CategoryReport::oom_since).
std::string since_text(const CategoryMoment& since) {
  if (since.step == 0) return "since the trace began";
  if (since.step == 1) return "since training began (before step 1)";
  return fmt::format("since the end of step {}", since.step - 1);
}
const char* since_key(const CategoryMoment& since) {
  return since.step == 0 ? "trace_start" : since.step == 1 ? "before_step_1" : "end_of_previous_step";
}

// The categories that grew from `since` to `at`, largest growth first (then category order).
std::vector<std::pair<Category, std::int64_t>> grown(const CategoryMoment& since, const CategoryMoment& at) {
  std::vector<std::pair<Category, std::int64_t>> out;
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    const auto d = static_cast<std::int64_t>(at.totals.bytes[c]) - static_cast<std::int64_t>(since.totals.bytes[c]);
    if (d > 0) out.push_back({static_cast<Category>(c), d});
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  return out;
}

// The OOM's moments, or null when the categories do not cover it (a window).
std::pair<const CategoryMoment*, const CategoryMoment*> oom_moments(SiteLists& sites, std::size_t ti, std::size_t oi) {
  const Model& m = *sites.analysis().traces[ti];
  if (!m.window().empty() || m.windowed()) return {nullptr, nullptr};
  const auto& rep = sites.categories(ti);
  if (oi >= rep.ooms.size() || !rep.ooms[oi].valid || nothing_decided(rep.ooms[oi], rep)) return {nullptr, nullptr};
  return {&rep.ooms[oi], &rep.oom_since[oi]};
}

}  // namespace

void oom_categories_text(std::string& out, SiteLists& sites, std::size_t ti, std::size_t oi) {
  auto [at, since] = oom_moments(sites, ti, oi);
  if (!at) return;
  out += fmt::format("  by category (as known at the OOM{}; docs/categories.md):\n",
                     moment_phase(*at, sites.categories(ti)));
  std::string brief;
  moment_brief(brief, *at);
  for (std::size_t from = 0; from < brief.size();) {  // indented under the OOM
    const auto nl = brief.find('\n', from);
    out += "  " + brief.substr(from, nl - from + 1);
    from = nl + 1;
  }
  const auto g = grown(*since, *at);
  if (g.empty()) {
    out += fmt::format("  no category grew {}\n", since_text(*since));
    return;
  }
  const auto c = static_cast<std::size_t>(g[0].first);
  out += fmt::format("  {} grew most {}: +{} ({} -> {})", category_name(g[0].first), since_text(*since),
                     human_bytes(static_cast<std::uint64_t>(g[0].second)), human_bytes(since->totals.bytes[c]),
                     human_bytes(at->totals.bytes[c]));
  for (std::size_t i = 1; i < g.size() && i < 3; ++i)
    out += fmt::format("{} {} +{}", i == 1 ? "; then" : ",", category_name(g[i].first),
                       human_bytes(static_cast<std::uint64_t>(g[i].second)));
  out += "\n";
}

nlohmann::json oom_categories_json(SiteLists& sites, std::size_t ti, std::size_t oi) {
  auto [at, since] = oom_moments(sites, ti, oi);
  if (!at) return nullptr;
  const auto g = grown(*since, *at);
  nlohmann::json grew = nlohmann::json::array();
  for (const auto& [c, d] : g) grew.push_back({{"category", category_name(c)}, {"bytes", d}});
  return {{"step", at->step},
          {"phase", train_phase_name(at->phase)},
          {"totals", category_totals_json(at->totals)},
          {"since",
           {{"reference", since_key(*since)}, {"step", since->step}, {"totals", category_totals_json(since->totals)}}},
          {"grew", std::move(grew)}};
}

void categories_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  const Model& m = *sites.analysis().traces[ti];
  if (!m.window().empty() || m.windowed()) return;  // the categories cover the whole trace only
  const auto& rep = sites.categories(ti);
  for (std::size_t di = 0; di < m.devices.size(); ++di) {
    const auto& d = m.devices[di];
    if (opt.device >= 0 && d.device != opt.device) continue;
    const auto& mo = rep.peaks[di];
    if (!mo.valid || !mo.totals.total() || nothing_decided(mo, rep)) continue;
    out += fmt::format("Memory by category at the peak, device {}: {} requested{}\n", d.device,
                       human_bytes(mo.totals.total()), moment_phase(mo, rep));
    moment_text(out, mo, sites, ti, opt);
    phases_found_text(out, rep);
    out += "\n";
  }
  for (std::size_t oi = 0; oi < rep.ooms.size(); ++oi) {
    const auto& mo = rep.ooms[oi];
    if (!mo.valid || (opt.device >= 0 && mo.device != opt.device) || nothing_decided(mo, rep)) continue;
    out += fmt::format("Memory by category at OOM #{}, device {}: {} requested{}\n", oi + 1, mo.device,
                       human_bytes(mo.totals.total()), moment_phase(mo, rep));
    moment_text(out, mo, sites, ti, opt);
    out += "\n";
  }
}

nlohmann::json category_totals_json(const CategoryBytes& b) {
  auto j = nlohmann::json::object();
  for (std::size_t c = 0; c < kNumCategories; ++c)
    j[category_name(static_cast<Category>(c))] = {{"bytes", b.bytes[c]}, {"count", b.count[c]}};
  return j;
}

nlohmann::json categories_json(SiteLists& sites, std::size_t ti) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& rep = sites.categories(ti);
  auto j = nlohmann::json::object();
  auto peaks = nlohmann::json::array();
  for (std::size_t di = 0; di < m.devices.size(); ++di) {
    const auto& mo = rep.peaks[di];
    if (!mo.valid) continue;
    auto libs = nlohmann::json::object();
    for (const auto& [lib, b] : mo.libraries) libs[lib] = b;
    peaks.push_back({{"device", mo.device}, {"totals", category_totals_json(mo.totals)}, {"libraries", libs}});
  }
  j["at_peak"] = std::move(peaks);
  j["leaked"] = category_totals_json(rep.leaked);
  // Each phase instance found from frames: its step, bounds and highest point, by category
  // (the categories at that moment, provisional for what was still undecided then).
  auto found = nlohmann::json::array();
  for (const auto& p : rep.phases) {
    if (p.phase == TrainPhase::none) continue;
    auto by = nlohmann::json::object();
    for (std::size_t c = 0; c < kNumCategories; ++c)
      if (p.at_peak.bytes[c]) by[category_name(static_cast<Category>(c))] = p.at_peak.bytes[c];
    found.push_back({{"step", p.step},
                     {"phase", train_phase_name(p.phase)},
                     {"start_ns", p.start >= m.info.mono_ns ? p.start - m.info.mono_ns : 0},
                     {"end_ns", p.end >= m.info.mono_ns ? p.end - m.info.mono_ns : 0},
                     {"peak_bytes", p.peak},
                     {"peak_by_category", std::move(by)}});
  }
  j["phases_found"] = std::move(found);
  j["steps_found"] = rep.steps;
  j["training_found"] = rep.saw_training;
  return j;
}

}  // namespace gpuheap
