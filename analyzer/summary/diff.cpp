// `gpuheap diff`: per-device totals of two traces, the JSON document (gpuheap.diff/1) and
// the --fail-on gate. The per-site table is report.h's diff_sites/diff_text.
#include "analyzer/summary/diff.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/check.h"

namespace gpuheap {

namespace {

constexpr const char* kNames[kNumDiffMetrics] = {"requested", "allocated", "reserved", "leaked", "count"};
constexpr const char* kLabels[kNumDiffMetrics] = {"peak requested", "peak allocated", "peak reserved", "leaked at end",
                                                  "allocations"};

bool is_bytes(int m) { return m != kDiffCount; }

// The totals a device contributes, from the same stats summary --json shows.
std::array<std::int64_t, kNumDiffMetrics> totals_of(const DeviceState& d) {
  return {d.stat[kRequestedBytes][kAllPools].peak, d.stat[kAllocatedBytes][kAllPools].peak,
          d.stat[kReservedBytes][kAllPools].peak, static_cast<std::int64_t>(d.leaked_bytes),
          d.stat[kAllocations][kAllPools].allocated};
}

std::string value_text(int m, std::int64_t v) {
  if (!is_bytes(m)) return fmt::format("{}", v);
  return fmt::format("{} ({} B)", human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0))), v);
}

// Cells of the totals table: bytes human-readable, counts plain.
std::string cell(int m, std::int64_t v) {
  if (!is_bytes(m)) return fmt::format("{}", v);
  return human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)));
}
std::string delta_cell(int m, std::int64_t d) {
  if (!is_bytes(m)) return fmt::format("{:+}", d);
  auto mag = human_bytes(static_cast<std::uint64_t>(d < 0 ? -d : d));
  return d == 0 ? mag : fmt::format("{}{}", d < 0 ? '-' : '+', mag);
}
std::string pct_text(std::int64_t a, std::int64_t b) {
  auto p = change_pct(a, b);
  return p ? fmt::format("{:+.1f}%", *p) : std::string("+inf%");
}

nlohmann::json pct_json(std::int64_t a, std::int64_t b) {
  auto p = change_pct(a, b);
  return p ? nlohmann::json(*p) : nlohmann::json(nullptr);
}

}  // namespace

const char* diff_metric_name(int m) { return m >= 0 && m < kNumDiffMetrics ? kNames[m] : "?"; }

std::optional<int> diff_metric_from(const std::string& name) {
  for (int m = 0; m < kNumDiffMetrics; ++m)
    if (name == kNames[m]) return m;
  return std::nullopt;
}

std::optional<double> change_pct(std::int64_t a, std::int64_t b) {
  if (a == b) return 0.0;
  if (a == 0) return std::nullopt;  // b > 0: the totals are never negative
  return 100.0 * (static_cast<double>(b) - static_cast<double>(a)) / static_cast<double>(a);
}

std::vector<DeviceDiff> diff_devices(const Model& a, const Model& b) {
  std::map<int, DeviceDiff> by;
  for (const auto& d : a.devices) {
    if (d.device < 0) continue;  // pinned host memory: not a GPU (summary --json's "host")
    auto& x = by[d.device];
    x.device = d.device, x.in_a = true, x.a = totals_of(d);
  }
  for (const auto& d : b.devices) {
    if (d.device < 0) continue;
    auto& x = by[d.device];
    x.device = d.device, x.in_b = true, x.b = totals_of(d);
  }
  std::vector<DeviceDiff> out;
  out.reserve(by.size());
  for (auto& [dev, x] : by) out.push_back(x);
  return out;
}

std::vector<CategoryDiff> diff_categories(const Model& a, const CategoryReport& ca, const Model& b,
                                          const CategoryReport& cb) {
  std::map<int, CategoryDiff> by;
  auto side = [&by](const Model& m, const CategoryReport& r, bool is_a) {
    for (std::size_t i = 0; i < m.devices.size() && i < r.peaks.size(); ++i) {
      const auto& mo = r.peaks[i];
      if (m.devices[i].device < 0 || !mo.valid) continue;  // pinned host memory: not a GPU
      auto& x = by[m.devices[i].device];
      x.device = m.devices[i].device;
      (is_a ? x.in_a : x.in_b) = true;
      auto& v = is_a ? x.a : x.b;
      for (std::size_t c = 0; c < kNumCategories; ++c) v[c] = static_cast<std::int64_t>(mo.totals.bytes[c]);
    }
  };
  side(a, ca, true);
  side(b, cb, false);
  std::vector<CategoryDiff> out;
  out.reserve(by.size());
  for (auto& [dev, x] : by) out.push_back(x);
  return out;
}

std::string diff_categories_text(const std::vector<CategoryDiff>& cats) {
  if (cats.empty()) return {};
  constexpr auto kUnknown = static_cast<std::size_t>(Category::unknown);
  bool decided = false;
  for (const auto& d : cats)
    for (std::size_t c = 0; c < kNumCategories; ++c) decided |= c != kUnknown && (d.a[c] || d.b[c]);
  if (!decided)
    return "By category: every byte is unknown in both traces (no training phase found; docs/categories.md)\n\n";
  std::string out = "By category at each device's peak (requested bytes live then; docs/categories.md):\n";
  for (const auto& d : cats) {
    const char* only = d.in_a && d.in_b ? "" : d.in_a ? " (only in A)" : " (only in B)";
    out += fmt::format("  {:<18}{:>14}{:>14}{:>14}{:>10}\n", fmt::format("device {}{}", d.device, only), "A", "B",
                       "delta", "change");
    for (std::size_t c = 0; c < kNumCategories; ++c) {
      const auto va = d.a[c], vb = d.b[c];
      if (!va && !vb) continue;
      out += fmt::format("    {:<16}{:>14}{:>14}{:>14}{:>10}\n", category_name(static_cast<Category>(c)),
                         cell(kDiffRequested, va), cell(kDiffRequested, vb), delta_cell(kDiffRequested, vb - va),
                         pct_text(va, vb));
    }
  }
  out += "\n";
  return out;
}

nlohmann::json diff_categories_json(const std::vector<CategoryDiff>& cats) {
  auto arr = nlohmann::json::array();
  for (const auto& d : cats) {
    nlohmann::json at_peak = nlohmann::json::object();
    for (std::size_t c = 0; c < kNumCategories; ++c) {
      const auto va = d.a[c], vb = d.b[c];
      at_peak[category_name(static_cast<Category>(c))] = {{"a", va},
                                                          {"b", vb},
                                                          {"delta", vb - va},
                                                          {"change_pct", pct_json(va, vb)}};
    }
    arr.push_back({{"device", d.device}, {"in_a", d.in_a}, {"in_b", d.in_b}, {"at_peak", std::move(at_peak)}});
  }
  return arr;
}

DiffVerdict diff_verdict(const Model& a, const Model& b, const std::vector<DeviceDiff>& devs, const DiffGate& gate) {
  DiffVerdict v;
  v.gated = !gate.fail_on.empty();
  if (!v.gated) return v;
  v.allowed_truncated = gate.allow_truncated;
  for (const Model* m : {&a, &b})
    if (m->info.truncated)
      v.incomplete.push_back(fmt::format("{} is incomplete ({})", text_safe(m->info.path), incompleteness(m->info)));
  for (const auto& d : devs)
    for (int m : gate.fail_on) {
      const std::int64_t va = d.a[static_cast<std::size_t>(m)], vb = d.b[static_cast<std::size_t>(m)];
      const std::int64_t growth = vb - va;
      // --tolerance-bytes is slack in bytes: it never excuses growth of the allocation count.
      const bool slack = m != kDiffCount && static_cast<std::uint64_t>(growth) <= gate.tolerance_bytes;
      if (growth <= 0 || slack) continue;
      // Growth from 0 is infinite %: fails whatever the tolerance (the slack bytes aside).
      auto p = change_pct(va, vb);
      if (p && *p <= gate.tolerance_pct) continue;
      v.breaches.push_back({m, d.device, va, vb});
    }
  return v;
}

std::vector<std::string> verdict_lines(const DiffVerdict& v, const DiffGate& gate) {
  std::vector<std::string> out;
  if (!v.gated) return out;
  for (const auto& s : v.incomplete)
    out.push_back(v.allowed_truncated
                      ? fmt::format("note: {}; comparing what it holds (--allow-truncated)", s)
                      : fmt::format("FAIL: {}, so its numbers cannot be trusted; pass --allow-truncated to "
                                    "compare what it holds",
                                    s));
  const std::string pct_limit = fmt::format("--tolerance {}%", gate.tolerance_pct);
  std::string limit = pct_limit;
  if (gate.tolerance_bytes)
    limit += fmt::format(" and --tolerance-bytes {}",
                         value_text(kDiffRequested, static_cast<std::int64_t>(gate.tolerance_bytes)));
  for (const auto& x : v.breaches)
    out.push_back(fmt::format("FAIL: {} on device {}: A {} -> B {}, {} exceeds {}", diff_metric_name(x.metric),
                              x.device, value_text(x.metric, x.a), value_text(x.metric, x.b), pct_text(x.a, x.b),
                              x.metric == kDiffCount ? pct_limit : limit));
  if (!v.failed()) {
    std::string metrics;
    for (int m : gate.fail_on) metrics += (metrics.empty() ? "" : ",") + std::string(diff_metric_name(m));
    out.push_back(fmt::format("ok: no growth of {} beyond {} on any device", metrics, limit));
  }
  return out;
}

std::string diff_totals_text(const std::vector<DeviceDiff>& devs, const Model& a, const Model& b) {
  std::string out = fmt::format("gpuheap diff totals: A = {}\n                     B = {}\n", text_safe(a.info.path),
                                text_safe(b.info.path));
  if (devs.empty()) out += "  no device in either trace\n";
  for (const auto& d : devs) {
    const char* only = d.in_a && d.in_b ? "" : d.in_a ? " (only in A)" : " (only in B)";
    out += fmt::format("  {:<18}{:>14}{:>14}{:>14}{:>10}\n", fmt::format("device {}{}", d.device, only), "A", "B",
                       "delta", "change");
    for (int m = 0; m < kNumDiffMetrics; ++m) {
      const auto va = d.a[static_cast<std::size_t>(m)], vb = d.b[static_cast<std::size_t>(m)];
      out += fmt::format("    {:<16}{:>14}{:>14}{:>14}{:>10}\n", kLabels[m], cell(m, va), cell(m, vb),
                         delta_cell(m, vb - va), pct_text(va, vb));
    }
  }
  out += "\n";
  return out;
}

nlohmann::json diff_json(const std::vector<DeviceDiff>& devs, const std::vector<DiffRow>& rows, std::size_t top,
                         const Model& a, const Model& b, const DiffVerdict& v, const DiffGate& gate) {
  using nlohmann::json;
  auto trace = [](const Model& m) {
    return json{{"path", m.info.path}, {"truncated", m.info.truncated}, {"has_end", m.info.has_end}};
  };
  json doc;
  doc["schema"] = "gpuheap.diff/1";
  doc["a"] = trace(a);
  doc["b"] = trace(b);
  json jd = json::array();
  for (const auto& d : devs) {
    json j = {{"device", d.device}, {"in_a", d.in_a}, {"in_b", d.in_b}};
    for (int m = 0; m < kNumDiffMetrics; ++m) {
      const auto va = d.a[static_cast<std::size_t>(m)], vb = d.b[static_cast<std::size_t>(m)];
      j[kNames[m]] = {{"a", va}, {"b", vb}, {"delta", vb - va}, {"change_pct", pct_json(va, vb)}};
    }
    jd.push_back(std::move(j));
  }
  doc["devices"] = std::move(jd);
  json js = json::array();
  std::size_t changed = 0;
  for (const auto& r : rows) changed += r.changed() ? 1 : 0;  // the moved-only rows come last
  for (std::size_t i = 0; i < changed && i < top; ++i) {
    const auto& r = rows[i];
    json moved = json::array();
    for (const auto& mv : r.moved)
      moved.push_back({{"frame", mv.frame},
                       {"function", r.frames[mv.frame].function},
                       {"file", r.frames[mv.frame].file},
                       {"a", mv.line_a},
                       {"b", mv.line_b}});
    js.push_back({{"key", r.key},
                  {"key_b", r.count_b == 0 ? json(nullptr) : json(r.count_a == 0 ? r.key : r.key_b)},
                  {"moved", std::move(moved)},
                  {"stack", stack_json(r.frames)},
                  {"library", library_label(r.frames)},
                  {"peak_bytes", {{"a", r.peak_a}, {"b", r.peak_b}, {"delta", r.d_peak()}}},
                  {"total_bytes", {{"a", r.total_a}, {"b", r.total_b}, {"delta", r.d_total()}}},
                  {"count", {{"a", r.count_a}, {"b", r.count_b}, {"delta", r.d_count()}}}});
  }
  doc["sites"] = std::move(js);
  doc["sites_changed"] = changed;
  doc["sites_moved_unchanged"] = rows.size() - changed;
  json fail_on = json::array();
  for (int m : gate.fail_on) fail_on.push_back(kNames[m]);
  json breaches = json::array();
  for (const auto& x : v.breaches)
    breaches.push_back({{"metric", kNames[x.metric]},
                        {"device", x.device},
                        {"a", x.a},
                        {"b", x.b},
                        {"delta", x.b - x.a},
                        {"change_pct", pct_json(x.a, x.b)}});
  doc["verdict"] = {{"gated", v.gated},
                    {"fail_on", std::move(fail_on)},
                    {"tolerance_pct", gate.tolerance_pct},
                    {"tolerance_bytes", gate.tolerance_bytes},
                    {"allow_truncated", gate.allow_truncated},
                    {"incomplete", v.incomplete},
                    {"breaches", std::move(breaches)},
                    {"passed", !v.failed()}};
  return doc;
}

}  // namespace gpuheap
