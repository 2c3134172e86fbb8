#include "analyzer/model/phases.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/text_safe.h"

namespace gpuheap {

namespace {

constexpr std::uint64_t kForever = std::numeric_limits<std::uint64_t>::max();

std::uint64_t trace_start(const Model& m) { return m.info.have_process ? m.info.mono_ns : m.info.first_ts; }

std::string known_names(const Model& m) {
  std::set<std::string> names;
  for (const auto& p : m.phases) names.insert(p.name);
  if (names.empty()) return "the trace has no phases";
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + text_safe(n);
  return "known phases: " + s;
}

const PhaseDevice* on_device(const PhaseInstance& p, int device) {
  for (const auto& d : p.devices)
    if (d.device == device) return &d;
  return nullptr;
}

// A point: seconds after the trace's start, or a phase name (`start`: its first instance's
// start; else its `last ? last : first` instance's end; a mark is a point either way).
std::uint64_t point(const Model& m, const std::string& s, bool start, bool last, const char* what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() && *end == '\0') {
    if (errno == ERANGE || !std::isfinite(v) || v < 0)
      throw UsageError(fmt::format("{}: '{}' is not a time in seconds >= 0", what, text_safe(s)));
    return trace_start(m) + static_cast<std::uint64_t>(std::llround(v * 1e9));
  }
  const PhaseInstance* hit = nullptr;
  for (const auto& p : m.phases) {
    if (p.name != s) continue;
    if (!hit || last) hit = &p;
    if (!last) break;
  }
  if (!hit)
    throw UsageError(fmt::format("{}: {}: no phase or mark named '{}' ({})", what, text_safe(m.info.path), text_safe(s),
                                 known_names(m)));
  return start ? hit->start : hit->end;
}

}  // namespace

std::vector<PhaseRow> phase_rows(const Model& m, int device) {
  std::vector<PhaseRow> rows;
  std::map<std::pair<std::string, int>, std::size_t> at;
  for (const auto& p : m.phases) {
    auto key = std::make_pair(p.name, p.mark ? -1 - p.depth : p.depth);
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, rows.size()).first;
      rows.push_back({p.name, p.depth, p.mark});
    }
    auto& r = rows[it->second];
    r.count++;
    r.total_ns += p.end - p.start;
    if (p.mark) continue;
    if (const auto* d = on_device(p, device)) {
      r.peak_requested = std::max(r.peak_requested, d->peak_requested);
      r.peak_allocated = std::max(r.peak_allocated, d->peak_allocated);
      r.allocs += d->allocs;
    }
  }
  return rows;
}

std::string WindowSpec::describe() const {
  std::string s;
  if (!phase.empty()) s += fmt::format("phase {}", text_safe(phase));
  if (!time.empty()) s += fmt::format("{}time {}", s.empty() ? "" : ", ", text_safe(time));
  if (!after.empty()) s += fmt::format("{}after {}", s.empty() ? "" : ", ", text_safe(after));
  return s;
}

Intervals resolve_window(const Model& m, const WindowSpec& spec) {
  // Each option gives a set of intervals; several options intersect.
  std::vector<Intervals> sets;
  if (!spec.phase.empty()) {
    Intervals iv;
    for (const auto& p : m.phases)
      if (p.name == spec.phase && !p.mark) iv.emplace_back(p.start, p.end);
    if (iv.empty()) {
      bool is_mark = std::any_of(m.phases.begin(), m.phases.end(), [&](const auto& p) { return p.name == spec.phase; });
      throw UsageError(fmt::format("--phase: {}: {} '{}' ({})", text_safe(m.info.path),
                                   is_mark ? "a mark is a point, not a range:" : "no phase named",
                                   text_safe(spec.phase), known_names(m)));
    }
    sets.push_back(std::move(iv));
  }
  if (!spec.time.empty()) {
    auto colon = spec.time.find(':');
    if (colon == std::string::npos) throw UsageError(fmt::format("--time: '{}' is not FROM:TO", text_safe(spec.time)));
    std::string from = spec.time.substr(0, colon), to = spec.time.substr(colon + 1);
    std::uint64_t a = from.empty() ? 0 : point(m, from, true, false, "--time");
    std::uint64_t b = to.empty() ? kForever : point(m, to, false, true, "--time");
    sets.push_back({{a, b}});
  }
  if (!spec.after.empty()) sets.push_back({{point(m, spec.after, false, false, "--after"), kForever}});
  Intervals out = sets.empty() ? Intervals{{0, kForever}} : sets[0];
  for (std::size_t k = 1; k < sets.size(); ++k) {
    Intervals next;
    for (const auto& x : out)
      for (const auto& y : sets[k]) {
        auto lo = std::max(x.first, y.first), hi = std::min(x.second, y.second);
        if (lo < hi) next.emplace_back(lo, hi);
      }
    out = std::move(next);
  }
  return out;
}

Analysis analyze_window(const std::vector<std::string>& paths, const AnalyzeOptions& opt, const WindowSpec& spec) {
  if (!spec.any()) return analyze(paths, opt);
  // The first pass finds the phases (names are known only once the trace is read); the
  // second replays with the window. Twice the time, only when a window is asked for.
  auto whole = analyze(paths, opt);
  AnalyzeOptions o = opt;
  o.windows.clear();
  for (const auto& t : whole.traces) o.windows.push_back(resolve_window(*t, spec));
  o.warn_truncated = false;  // said once, by the first pass
  return analyze(paths, o);
}

Growth phase_growth(const Model& m, const std::string& name) {
  Growth g;
  std::string pick = name;
  if (pick.empty()) {
    std::map<std::string, std::uint64_t> n;
    std::vector<std::string> order;
    for (const auto& p : m.phases) {
      if (p.mark || p.depth != 0) continue;
      if (n[p.name]++ == 0) order.push_back(p.name);
    }
    std::uint64_t best = 0;
    for (const auto& s : order)
      if (n[s] > best) best = n[s], pick = s;
    if (best < 2) return g;
  }
  std::vector<const PhaseInstance*> inst;
  for (const auto& p : m.phases)
    if (!p.mark && p.name == pick) inst.push_back(&p);
  if (inst.empty() && !name.empty())
    throw UsageError(fmt::format("--growth-phase: {}: no phase named '{}' ({})", text_safe(m.info.path),
                                 text_safe(name), known_names(m)));
  g.phase = pick;
  g.instances = inst.size();
  if (inst.size() < 2) return g;
  g.valid = true;
  for (const auto& d : m.devices) {
    GrowthDevice gd;
    gd.device = d.device;
    for (const auto* p : inst) {
      const auto* x = on_device(*p, d.device);
      gd.ends.push_back(x ? x->end_requested : 0);
    }
    gd.baseline = gd.ends[1], gd.last = gd.ends.back(), gd.growth = gd.last - gd.baseline;
    if (g.devices.empty() || gd.growth > g.growth) g.growth = gd.growth, g.growth_device = gd.device;
    g.devices.push_back(std::move(gd));
  }
  return g;
}

}  // namespace gpuheap
