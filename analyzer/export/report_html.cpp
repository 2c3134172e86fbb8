// `gpuheap report`: one self-contained HTML page (scripts, styles and data inline; it needs
// no network) with per-device timelines, icicle flame graphs and the summary's tables.
// The data is the replay's own: timelines from Model's bounded Timeline (bucket maxima, so
// the peaks drawn are exact however long the trace), flame graphs from the per-site figures
// (flame.cpp), tables from summary_json(). It goes into the page as JSON inside
// <script type="application/json"> with '<', '>' and '&' escaped, and report.js puts every
// string into the page as text, never as markup.
#include <algorithm>
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

json flame_json(const Analysis& a, exporter::FlameMetric m, const char* title, const ReportOptions& opt,
                std::vector<std::unique_ptr<StackResolver>>& res, exporter::FlameLabels& labels) {
  std::size_t before = 0;
  auto tree = exporter::build_flame(exporter::flame_samples(a, m, opt.all_frames, res, !opt.all_frames), labels,
                                    opt.max_nodes, &before);
  // Names and files through one string table: deep stacks repeat them on every path.
  json names = json::array(), nodes = json::array();
  std::unordered_map<std::string, std::size_t> idx;
  auto name_id = [&](const std::string& s) {
    auto [it, fresh] = idx.emplace(s, names.size());
    if (fresh) names.push_back(s);
    return it->second;
  };
  name_id("");
  for (const auto& n : tree.nodes) nodes.push_back({name_id(n.name), name_id(n.file), n.line, n.value, n.parent});
  return {{"id", exporter::metric_name(m)},
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
// its peak marked, and the time axis every chart shares.
void merged_timelines(const Analysis& a, json& tls, json& data) {
  std::uint64_t end = 0;
  for (const auto& mp : a.traces)
    end = std::max(end, since_origin(a, mp->info, mp->info.has_end ? mp->info.end_ts : mp->info.last_ts));
  data["time_axis"] = {{"min", 0.0}, {"max", secs(end)}};
  for (const auto& md : a.merged) {
    if (md.device < 0) continue;
    const std::string who = md.traces.size() == 1 ? std::string("its one process")
                                                  : fmt::format("all {} processes on it together", md.traces.size());
    json t = timeline_json(merged_device_name(a, md) + ": " + who, md.timeline, 0, false);
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
  for (const auto& mp : a.traces) {
    const auto& in = mp->info;
    std::string cmd;
    for (const auto& c : in.command) cmd += (cmd.empty() ? "" : " ") + c;
    tr.push_back({{"path", in.path},
                  {"pid", in.pid},
                  {"host", in.hostname},
                  {"command", cmd},
                  {"duration_ns", in.duration_ns()},
                  {"events", in.events}});
    if (in.rank >= 0) tr.back()["rank"] = in.rank;  // only where the trace has one (format v4)
    for (const auto& d : mp->devices) {
      if (d.device < 0 || d.timeline.points().empty()) continue;  // host memory has no device timeline
      json t = timeline_json(process_label(a, in, d), d.timeline, since_origin(a, in, d.timeline.start()), true);
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
  if (a.traces.size() > 1) merged_timelines(a, tls, data);
  data["traces"] = std::move(tr);
  data["timelines"] = std::move(tls);
  // One resolver per trace for the flame graphs and both summaries (each stack symbolized
  // and keyed once), and the summaries' merged site lists computed once for both.
  SiteLists sites(a, opt.all_frames);
  auto& res = sites.resolvers();
  exporter::FlameLabels labels;  // after sites: it keys by their resolvers' frames
  data["flames"] = {flame_json(a, exporter::FlameMetric::peak, "Bytes live at the peak, by call stack", opt, res,
                               labels),
                    flame_json(a, exporter::FlameMetric::leaked, "Leaked bytes (live at the end)", opt, res, labels),
                    flame_json(a, exporter::FlameMetric::allocated, "Bytes allocated in total", opt, res, labels)};
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
