// Summary sections about phases: the "By phase" table (text) / `phases` (JSON), and growth.
#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/model/phases.h"
#include "analyzer/summary/report.h"

namespace gpuheap {

namespace {

std::uint64_t rel(std::uint64_t ts, const TraceInfo& in) { return ts >= in.mono_ns ? ts - in.mono_ns : 0; }
// Every instance is listed up to this many (a job of 100,000 steps has 400,000 of them);
// phase_table aggregates them all.
constexpr std::size_t kMaxListedPhases = 10000;

std::string hb(std::int64_t v) { return human_bytes(static_cast<std::uint64_t>(v < 0 ? 0 : v)); }
std::string signed_hb(std::int64_t v) {
  return (v < 0 ? "-" : "+") + human_bytes(static_cast<std::uint64_t>(v < 0 ? -v : v));
}

}  // namespace

void phases_text(std::string& out, const Model& m, const SummaryOptions& opt) {
  if (m.phases.empty()) return;
  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    if (d.device < 0) continue;  // host memory: phases are about device peaks
    out += fmt::format("By phase, device {} (peak: the largest instance's; time and allocations: summed):\n", d.device);
    out += fmt::format("  {:<32} {:>7} {:>11} {:>12} {:>12} {:>9}\n", "Phase", "Count", "Time", "Peak req.",
                       "Peak alloc.", "Allocs");
    for (const auto& r : phase_rows(m, d.device)) {
      std::string name = std::string(static_cast<std::size_t>(2 * r.depth), ' ') + text_safe(r.name);
      if (r.mark) {
        out += fmt::format("  {:<32} {:>7} {:>11} {:>12} {:>12} {:>9}\n", name + " (mark)", r.count, "-", "-", "-",
                           "-");
        continue;
      }
      out += fmt::format("  {:<32} {:>7} {:>11} {:>12} {:>12} {:>9}\n", name, r.count, human_duration_ns(r.total_ns),
                         hb(r.peak_requested), hb(r.peak_allocated), r.allocs);
    }
    if (m.unmatched_pops) out += fmt::format("  ({} pops without an open range were ignored)\n", m.unmatched_pops);
    if (m.untracked_ranges)
      out += fmt::format("  ({} ranges opened while {} were open were not tracked)\n", m.untracked_ranges,
                         Model::kMaxOpenPhases);
    out += "\n";
  }
  auto g = phase_growth(m, opt.growth_phase);
  if (!g.valid) return;
  for (const auto& gd : g.devices) {
    if (opt.device >= 0 && gd.device != opt.device) continue;
    if (gd.device < 0) continue;
    out += fmt::format(
        "Growth, device {}: {} requested live at the end of '{}' #{} vs {} at the end of #2 "
        "(the first steady one): {}\n",
        gd.device, hb(gd.last), text_safe(g.phase), g.instances, hb(gd.baseline), signed_hb(gd.growth));
  }
  out += "\n";
}

void phases_json(nlohmann::json& doc, const Model& m, const SummaryOptions& opt) {
  using nlohmann::json;
  const auto& in = m.info;
  json arr = json::array();
  std::size_t listed = 0;
  for (const auto& p : m.phases) {
    if (listed++ >= kMaxListedPhases) break;
    json devs = json::array();
    for (const auto& d : p.devices) {
      if (opt.device >= 0 && d.device != opt.device) continue;
      devs.push_back({{"device", d.device},
                      {"peak_requested", d.peak_requested},
                      {"peak_allocated", d.peak_allocated},
                      {"allocations", d.allocs},
                      {"end_requested", d.end_requested},
                      {"end_allocated", d.end_allocated}});
    }
    arr.push_back({{"name", p.name},
                   {"kind", p.mark ? "mark" : "range"},
                   {"source", p.source == format::PhaseSource::nvtx ? "nvtx" : "api"},
                   {"tid", p.tid},
                   {"depth", p.depth},
                   {"start_ns", rel(p.start, in)},
                   {"end_ns", rel(p.end, in)},
                   {"open_at_end", p.open_at_end},
                   {"devices", std::move(devs)}});
  }
  doc["phases"] = std::move(arr);
  doc["phases_left_out"] = m.phases.size() > kMaxListedPhases ? m.phases.size() - kMaxListedPhases : 0;
  json table = json::array();
  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    for (const auto& r : phase_rows(m, d.device))
      table.push_back({{"device", d.device},
                       {"name", r.name},
                       {"kind", r.mark ? "mark" : "range"},
                       {"depth", r.depth},
                       {"count", r.count},
                       {"total_ns", r.total_ns},
                       {"peak_requested", r.peak_requested},
                       {"peak_allocated", r.peak_allocated},
                       {"allocations", r.allocs}});
  }
  doc["phase_table"] = std::move(table);
  doc["unmatched_pops"] = m.unmatched_pops;
  doc["untracked_ranges"] = m.untracked_ranges;
  auto g = phase_growth(m, opt.growth_phase);
  if (g.valid) {
    json devs = json::array();
    for (const auto& gd : g.devices) {
      if (opt.device >= 0 && gd.device != opt.device) continue;
      devs.push_back({{"device", gd.device},
                      {"baseline_bytes", gd.baseline},
                      {"last_bytes", gd.last},
                      {"growth_bytes", gd.growth},
                      {"end_bytes", gd.ends}});
    }
    doc["growth"] = {{"phase", g.phase},         {"instances", g.instances},  {"baseline_instance", 2},
                     {"growth_bytes", g.growth}, {"device", g.growth_device}, {"devices", std::move(devs)}};
  } else {
    doc["growth"] = nullptr;
  }
  if (m.windowed()) {
    json w = json::array();
    for (const auto& [a, b] : m.window())
      w.push_back({rel(a, in), b == ~std::uint64_t{0} ? json(nullptr) : json(rel(b, in))});
    doc["window"] = {{"spec", opt.window}, {"intervals_ns", std::move(w)}};
  }
}

}  // namespace gpuheap
