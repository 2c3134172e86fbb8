// `gpuheap report`: one self-contained HTML page (scripts, styles and data inline; it needs
// no network) with per-device timelines, icicle flame graphs and the summary's tables.
// The data is the replay's own: timelines from Model's bounded Timeline (bucket maxima, so
// the peaks drawn are exact however long the trace), flame graphs from the per-site figures
// (flame.cpp), tables from summary_json(). It goes into the page as JSON inside
// <script type="application/json"> with '<', '>' and '&' escaped, and report.js puts every
// string into the page as text, never as markup.
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/units.h"
#include "analyzer/export/export.h"
#include "analyzer/export/export_out.h"
#include "analyzer/export/report_assets.h"
#include "analyzer/summary/ranks.h"

namespace gpuheap {

namespace {

using nlohmann::json;

double secs(std::uint64_t ns) { return static_cast<double>(ns) / 1e9; }

json timeline_json(const std::string& label, const Timeline& tl, std::uint64_t offset_ns, bool has_active) {
  auto pts = tl.points();
  json t = json::array(), req = json::array(), alloc = json::array(), act = json::array(), res = json::array();
  for (const auto& p : pts) {
    t.push_back(secs(offset_ns + p.t));
    req.push_back(p.requested);
    alloc.push_back(p.allocated);
    act.push_back(p.active);
    res.push_back(p.reserved);
  }
  json j = {{"label", label},
            {"bucket_s", secs(tl.bucket_ns())},
            {"t", std::move(t)},
            {"requested", std::move(req)},
            {"allocated", std::move(alloc)},
            {"reserved", std::move(res)},
            {"markers", json::array()}};
  j["active"] = has_active ? std::move(act) : json(nullptr);
  return j;
}

// A device timeline's live requested bytes by category (CategoryReport::timelines: one
// entry per point, summing to its `requested`): the categories that occur, in their order,
// each with its series. Null when there is nothing to show: no category decided there (no
// phase found and every byte unknown, the rule of the summary's section).
json category_series_json(const std::vector<CategoryReport::Live>& at, bool saw_training) {
  json names = json::array(), series = json::array();
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    bool any = false;
    for (const auto& p : at) any = any || p[c] != 0;
    if (!any) continue;
    if (!saw_training && c == static_cast<std::size_t>(Category::unknown) && names.empty()) return nullptr;
    json v = json::array();
    for (const auto& p : at) v.push_back(p[c]);
    names.push_back(category_name(static_cast<Category>(c)));
    series.push_back(std::move(v));
  }
  if (names.empty()) return nullptr;
  return {{"names", std::move(names)}, {"bytes", std::move(series)}};
}

// Phase markers of one process on each of its device timelines: marks as lines, ranges as
// shaded spans. A job with thousands of steps would paint the chart solid and fatten the
// page: at most kMaxPhaseSpans spans and marks each (the first ones), the rest counted.
constexpr std::size_t kMaxPhaseSpans = 2000;
template <class At>
void phase_marks(json& t, const Model& m, const At& at) {
  json spans = json::array(), names = json::array();
  std::size_t marks = 0, left_out = 0;
  std::set<std::string> seen;
  for (const auto& p : m.phases) {
    if (seen.insert(p.name).second) names.push_back(p.name);
    if (p.mark) {
      if (marks++ >= kMaxPhaseSpans) {
        ++left_out;
        continue;
      }
      t["markers"].push_back({{"t", at(p.start)}, {"kind", "phase"}, {"label", p.name}});
    } else if (spans.size() < kMaxPhaseSpans) {
      spans.push_back({{"t0", at(p.start)}, {"t1", at(p.end)}, {"depth", p.depth}, {"label", p.name}});
    } else {
      ++left_out;
    }
  }
  t["spans"] = std::move(spans);
  if (!seen.empty()) t["phase_names"] = std::move(names);
  if (left_out) t["phases_left_out"] = left_out;
}

// Whether a trace's categories are shown (docs/categories.md): as the summary has them, for
// the whole trace only, and not when nothing was decided (every allocation unknown).
bool categories_shown(const Model& m, const CategoryReport& rep) {
  return m.window().empty() && !m.windowed() && rep.decided_anything();
}

// w split as `b` splits the stack's bytes (or allocations): exactly when they sum to w (they
// are the same allocations: docs/categories.md), else in proportion, the rounding to the
// largest; a stack the categories never saw is unknown.
std::array<std::uint64_t, kNumCategories> split_weight(std::uint64_t w, const CategoryBytes* b, bool counts) {
  std::array<std::uint64_t, kNumCategories> src{}, part{};
  if (b) src = counts ? b->count : b->bytes;
  std::uint64_t total = 0;
  for (auto v : src) total += v;
  if (total == w) return src;
  if (total == 0) {
    part[static_cast<std::size_t>(Category::unknown)] = w;
    return part;
  }
  std::uint64_t given = 0;
  std::size_t largest = 0;
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    part[c] = static_cast<std::uint64_t>(static_cast<unsigned __int128>(w) * src[c] / total);
    given += part[c];
    if (src[c] > src[largest]) largest = c;
  }
  part[largest] += w - given;
  return part;
}

// Each sample as one sample per category of its bytes, from its trace's categories at the
// metric's moment: live at its device's peak, live at the end, or all allocations.
std::vector<exporter::FlameSample> split_by_category(std::vector<exporter::FlameSample> samples,
                                                     exporter::FlameMetric m, SiteLists& sites) {
  std::map<std::pair<std::size_t, std::size_t>, std::unordered_map<std::uint32_t, CategoryBytes>> at_peak;
  std::vector<exporter::FlameSample> out;
  out.reserve(samples.size());
  for (auto& s : samples) {
    const auto& rep = sites.categories(s.trace);
    const CategoryBytes* b = nullptr;
    const std::unordered_map<std::uint32_t, CategoryBytes>* by = &rep.by_stack;
    if (m == exporter::FlameMetric::peak) {
      auto [it, fresh] = at_peak.try_emplace({s.trace, s.device});
      if (fresh && s.device < rep.peaks.size())
        for (const auto& x : rep.peaks[s.device].sites) {
          auto& cb = it->second[x.stack];
          cb.bytes[static_cast<std::size_t>(x.cat)] += x.bytes, cb.count[static_cast<std::size_t>(x.cat)] += x.count;
        }
      by = &it->second;
    } else if (m == exporter::FlameMetric::leaked) {
      by = &rep.leaked_by_stack;
    }
    if (auto it = by->find(s.stack); it != by->end()) b = &it->second;
    const auto parts = split_weight(s.weight, b, m == exporter::FlameMetric::count);
    std::vector<std::size_t> cats;  // at least one: the weight is not 0
    for (std::size_t c = 0; c < kNumCategories; ++c)
      if (parts[c]) cats.push_back(c);
    for (std::size_t i = 0; i + 1 < cats.size(); ++i) {
      out.push_back(s);
      out.back().weight = parts[cats[i]], out.back().category = static_cast<int>(cats[i]);
    }
    out.push_back(std::move(s));  // the last part takes the frames
    out.back().weight = parts[cats.back()], out.back().category = static_cast<int>(cats.back());
  }
  return out;
}

// A flame node's own bytes (not its children's) by category, what report.js sums up the tree
// for the category filter: nothing (null: left out) where it has none (most frames between), the
// category (an index of category_names) where they are all of one, else [category, bytes,
// ...]. Only the frames where stacks end carry any: a few bytes per frame.
json own_categories(const exporter::FlameTree& tree, const exporter::FlameNode& n) {
  std::vector<std::uint64_t> own = n.by_category;
  for (auto c : n.children)
    for (std::size_t k = 0; k < own.size() && k < tree.nodes[c].by_category.size(); ++k)
      own[k] -= tree.nodes[c].by_category[k];
  json pairs = json::array();
  for (std::size_t k = 0; k < own.size(); ++k)
    if (own[k]) pairs.push_back(k), pairs.push_back(own[k]);
  if (pairs.empty()) return nullptr;
  return pairs.size() == 2 ? pairs[0] : pairs;
}

// Where categories were decided the summary's leak list leaves library workspaces out (they
// are summed apart); this graph holds everything live at the end, so it says so.
const char* leaked_title(bool categories) {
  return categories ? "Live at the end: leaks and library workspaces (the category filter tells them apart)"
                    : "Leaked bytes (live at the end)";
}

json flame_json(const Analysis& a, exporter::FlameMetric m, const char* title, const ReportOptions& opt,
                SiteLists* by_category, std::vector<std::unique_ptr<StackResolver>>& res,
                exporter::FlameLabels& labels) {
  std::size_t before = 0;
  auto samples = exporter::flame_samples(a, m, opt.all_frames, res, !opt.all_frames);
  if (by_category) samples = split_by_category(std::move(samples), m, *by_category);
  auto tree = exporter::build_flame(samples, labels, opt.max_nodes, &before);
  // Names and files through one string table: deep stacks repeat them on every path.
  json names = json::array(), nodes = json::array();
  std::unordered_map<std::string, std::size_t> idx;
  auto name_id = [&](const std::string& s) {
    auto [it, fresh] = idx.emplace(s, names.size());
    if (fresh) names.push_back(s);
    return it->second;
  };
  name_id("");
  for (const auto& n : tree.nodes) {
    nodes.push_back({name_id(n.name), name_id(n.file), n.line, n.value, n.parent});
    if (n.by_category.empty()) continue;
    if (auto own = own_categories(tree, n); !own.is_null()) nodes.back().push_back(std::move(own));
  }
  return {{"id", exporter::metric_name(m)},
          {"by_category", by_category != nullptr},
          {"title", title},
          {"unit", m == exporter::FlameMetric::count ? "count" : "bytes"},
          {"total", tree.total()},
          {"capped", before > tree.nodes.size() ? before - tree.nodes.size() : 0},
          {"names", std::move(names)},
          {"nodes", std::move(nodes)}};
}

// Timeline time of trace clock `ts`: since the process's start with one trace; with several,
// since the earliest start by wall clock, so that every chart shares one time axis.
std::uint64_t since_origin(const Analysis& a, const TraceInfo& in, std::uint64_t ts) {
  if (a.traces.size() < 2) return ts >= in.mono_ns ? ts - in.mono_ns : 0;
  const std::uint64_t w = in.to_wall(ts);
  return w > a.merged_start_wall_ns ? w - a.merged_start_wall_ns : 0;
}

// "cuda:0 NAME (rank 1, pid 42 on host)": with several traces, whose chart it is.
std::string process_label(const Analysis& a, const TraceInfo& in, const DeviceState& d) {
  std::string label = fmt::format("cuda:{} {}", d.device, d.name);
  if (a.traces.size() < 2) return label;
  std::string who = in.rank >= 0 ? fmt::format("rank {}, pid {}", in.rank, in.pid) : fmt::format("pid {}", in.pid);
  if (a.several_hosts()) who += " on " + in.hostname;
  return label + " (" + who + ")";
}

// Several processes: the simultaneous totals of each GPU (aligned by wall clock), each with
// its peak marked and its requested bytes by category (`cats`, index-aligned with a.merged;
// what a process that decided nothing holds is unknown, and said so), and the time axis
// every chart shares.
void merged_timelines(const Analysis& a, const std::vector<MergedCategoryTimeline>& cats, json& tls, json& data) {
  std::uint64_t end = 0;
  for (const auto& mp : a.traces)
    end = std::max(end, since_origin(a, mp->info, mp->info.has_end ? mp->info.end_ts : mp->info.last_ts));
  data["time_axis"] = {{"min", 0.0}, {"max", secs(end)}};
  for (std::size_t gi = 0; gi < a.merged.size(); ++gi) {
    const auto& md = a.merged[gi];
    if (md.device < 0) continue;
    const std::string who = md.traces.size() == 1 ? std::string("its one process")
                                                  : fmt::format("all {} processes on it together", md.traces.size());
    json t = timeline_json(merged_device_name(a, md) + ": " + who, md.timeline, 0, false);
    if (gi < cats.size() && !cats[gi].at.empty()) {
      json c = category_series_json(cats[gi].at, cats[gi].saw_training);
      if (!c.is_null() && cats[gi].undecided) c["undecided"] = cats[gi].undecided;
      if (!c.is_null()) t["categories"] = std::move(c);
    }
    if (md.allocated.peak > 0) {
      const std::uint64_t at = md.peak_allocated_wall_ns - std::min(md.peak_allocated_wall_ns, a.merged_start_wall_ns);
      t["markers"].push_back(
          {{"t", secs(at)},
           {"kind", "peak"},
           {"label", "peak " + human_bytes(static_cast<std::uint64_t>(md.allocated.peak)) + " allocated"}});
    }
    tls.push_back(std::move(t));
  }
}

// JSON text that is safe inside <script>: '<', '>' and '&' occur only inside JSON strings,
// where their \u escapes mean the same.
std::string script_json(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string o;
  o.reserve(s.size() + s.size() / 16);
  std::size_t from = 0;  // copied in runs between the characters escaped
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c != '<' && c != '>' && c != '&') continue;
    o.append(s, from, i - from);
    o += c == '<' ? "\\u003c" : c == '>' ? "\\u003e" : "\\u0026";
    from = i + 1;
  }
  o.append(s, from, std::string::npos);
  return o;
}

}  // namespace

int report_command(const std::vector<std::string>& traces, const ReportOptions& opt) {
  // Before the replay: an output that is refused (an input, or existing without --force)
  // costs no work.
  exporter::OutFile out(opt.output, opt.inputs.empty() ? traces : opt.inputs, opt.force, "report");
  AnalyzeOptions aopt;
  aopt.progress = opt.progress;
  aopt.timeline_buckets = opt.points;
  Analysis a = analyze(traces, aopt);

  json data;
  data["generator"] = "gpuheap " GPUHEAP_VERSION;
  json tr = json::array(), tls = json::array();
  // One resolver per trace for the flame graphs and both summaries (each stack symbolized
  // and keyed once), and the summaries' merged site lists computed once for both; the
  // categories (with their timelines) once for the timelines, flame graphs and summaries.
  SiteLists sites(a, opt.all_frames);
  bool any_categories = false;
  // Several traces: every timeline by category from one read of them all in the merge's order
  // (the merged ones need it; each process's come with it, instead of a read each).
  static const std::vector<MergedCategoryTimeline> kNone;
  const auto& merged_cats = a.traces.size() > 1 ? sites.merged_categories() : kNone;
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
    const auto& mp = a.traces[ti];
    const auto& in = mp->info;
    const auto& cats = sites.categories(ti, true);
    const bool cats_shown = categories_shown(*mp, cats);
    any_categories = any_categories || cats_shown;
    std::string cmd;
    for (const auto& c : in.command) cmd += (cmd.empty() ? "" : " ") + c;
    tr.push_back({{"path", in.path},
                  {"pid", in.pid},
                  {"host", in.hostname},
                  {"command", cmd},
                  {"duration_ns", in.duration_ns()},
                  {"events", in.events}});
    if (in.rank >= 0) tr.back()["rank"] = in.rank;  // only where the trace has one (format v4)
    for (std::size_t di = 0; di < mp->devices.size(); ++di) {
      const auto& d = mp->devices[di];
      if (d.device < 0 || d.timeline.points().empty()) continue;  // host memory has no device timeline
      json t = timeline_json(process_label(a, in, d), d.timeline, since_origin(a, in, d.timeline.start()), true);
      if (cats_shown && di < cats.timelines.size()) {
        json c = category_series_json(cats.timelines[di], cats.saw_training);
        if (!c.is_null()) t["categories"] = std::move(c);
      }
      auto at = [&](std::uint64_t ts) { return secs(since_origin(a, in, ts)); };
      if (d.peak_held > 0)
        t["markers"].push_back({{"t", at(d.peak_held_ts)},
                                {"kind", "peak"},
                                {"label", "peak " + human_bytes(static_cast<std::uint64_t>(d.peak_held))}});
      for (const auto& o : mp->ooms)
        if (o.rec.device == d.device)
          t["markers"].push_back(
              {{"t", at(o.rec.ts)}, {"kind", "oom"}, {"label", "OOM " + human_bytes(o.rec.requested)}});
      phase_marks(t, *mp, at);
      tls.push_back(std::move(t));
    }
  }
  if (a.traces.size() > 1) merged_timelines(a, merged_cats, tls, data);
  data["traces"] = std::move(tr);
  data["timelines"] = std::move(tls);
  auto& res = sites.resolvers();
  exporter::FlameLabels labels;  // after sites: it keys by their resolvers' frames
  SiteLists* by_cat = any_categories ? &sites : nullptr;
  if (any_categories) {
    json names = json::array();
    for (std::size_t c = 0; c < kNumCategories; ++c) names.push_back(category_name(static_cast<Category>(c)));
    data["category_names"] = std::move(names);
  }
  data["flames"] =
      {flame_json(a, exporter::FlameMetric::peak, "Bytes live at the peak, by call stack", opt, by_cat, res, labels),
       flame_json(a, exporter::FlameMetric::leaked, leaked_title(any_categories), opt, by_cat, res, labels),
       flame_json(a, exporter::FlameMetric::allocated, "Bytes allocated in total", opt, by_cat, res, labels)};
  SummaryOptions sopt;
  sopt.all_frames = opt.all_frames;
  data["summary"] = summary_json(a, sopt, sites);
  data["summary_text"] = summary_text(a, sopt, sites);

  out.put(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"generator\" content=\"gpuheap " GPUHEAP_VERSION "\">\n<title>gpuheap report</title>\n<style>");
  out.put(assets::uplot_css);
  out.put("</style>\n<style>");
  out.put(assets::report_css);
  out.put(
      "</style>\n</head><body data-status=\"loading\">\n<h1>gpuheap report</h1><div id=\"meta\"></div>"
      "<div id=\"status\">loading (this page needs JavaScript)</div>\n"
      "<section><h2>Timeline</h2><div id=\"timelines\"></div></section>\n"
      "<section><h2>Flame graphs</h2><p class=\"hint\">Callers on top. Click a frame to zoom into it, click it "
      "again (or the path above) to zoom out; the search box highlights matching functions and files.</p>"
      "<div id=\"flames\"></div></section>\n"
      "<section><h2>Summary</h2><div id=\"tables\"></div></section>\n"
      "<script type=\"application/json\" id=\"gpuheap-data\">");
  out.put(script_json(data));
  out.put("</script>\n<script>");
  out.put(assets::uplot_js);
  out.put("</script>\n<script>");
  out.put(assets::report_js);
  out.put("</script>\n</body></html>\n");
  out.close();
  return 0;
}

}  // namespace gpuheap
