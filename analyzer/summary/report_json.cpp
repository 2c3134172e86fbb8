// JSON summary, schema "gpuheap.summary/2" (docs/summary-json.md).
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "analyzer/model/torch_stats.h"
#include "analyzer/summary/ranks.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap {

namespace {

using nlohmann::json;

json stat_json(const Stat& s) {
  return {{"current", s.current}, {"peak", s.peak}, {"allocated", s.allocated}, {"freed", s.freed}};
}
json metric_json(const DeviceState& d, Metric m) {
  json j = stat_json(d.stat[m][kAllPools]);
  j["large_pool"] = stat_json(d.stat[m][kLargePool]);
  j["small_pool"] = stat_json(d.stat[m][kSmallPool]);
  return j;
}
std::uint64_t rel(std::uint64_t ts, const TraceInfo& in) { return ts >= in.mono_ns ? ts - in.mono_ns : 0; }

json frag_json(const Fragmentation& f, const TraceInfo& in) {
  return {{"ts_ns", rel(f.ts, in)},
          {"reserved", f.reserved},
          {"allocated", f.allocated},
          {"active", f.active},
          {"free_bytes", f.free_bytes},
          {"largest_free", f.largest_free},
          {"free_pieces", f.free_pieces},
          {"median_request", f.median_request},
          {"unusable_bytes", f.unusable_bytes},
          {"unusable_share", f.unusable_share}};
}

// `stack`, `label` and `label_frame` (the label's index in `stack`) of one site. Whole stacks
// unless --depth: then the frames text shows (from the first frame below the allocator's, or
// from the first Python frame where the label is one), `frames_hidden` counting the others.
void put_stack(json& j, const std::vector<Frame>& frames, const SummaryOptions& opt) {
  const LabelPos pos = label_pos(frames);
  j["label"] = site_label(frames);
  if (!opt.depth_given || opt.full) {
    j["stack"] = stack_json(frames);
    if (!frames.empty()) j["label_frame"] = pos.index;
    return;
  }
  const std::size_t from = pos.python_from, to = std::min(frames.size(), from + opt.depth);
  j["stack"] = stack_json(std::vector<Frame>(frames.begin() + static_cast<std::ptrdiff_t>(from),
                                             frames.begin() + static_cast<std::ptrdiff_t>(to)));
  if (pos.index >= from && pos.index < to) j["label_frame"] = pos.index - from;
  j["frames_hidden"] = frames.size() - (to - from);
}

json site_list(const std::vector<SiteRow>& rows, StackResolver& res, const SummaryOptions& opt, double pct_of = 0) {
  json arr = json::array();
  for (const auto& r : shown_sites(rows, res, opt)) {
    const auto& frames = res.frames(r.stack);
    json j = {{"bytes", r.bytes},
              {"allocated_bytes", r.allocated},
              {"count", r.count},
              {"stack_id", r.stack},
              {"library", res.library(r.stack)}};
    put_stack(j, frames, opt);
    if (pct_of > 0) j["percent"] = 100.0 * static_cast<double>(r.bytes) / pct_of;
    arr.push_back(std::move(j));
  }
  return arr;
}

// Every site object (one with a stack_id) gets its category (the category of most of its
// bytes over the whole trace: SiteLists::site_category).
void add_site_categories(json& j, SiteLists& sites, std::size_t ti) {
  if (j.is_object()) {
    auto it = j.find("stack_id");
    if (it != j.end() && it->is_number_unsigned())
      j["category"] = category_name(sites.site_category(ti, it->get<std::uint32_t>()));
    for (auto& [k, v] : j.items()) {
      (void)k;
      if (v.is_structured()) add_site_categories(v, sites, ti);
    }
  } else if (j.is_array()) {
    for (auto& v : j) add_site_categories(v, sites, ti);
  }
}

json kinds_json(const DeviceState& d) {
  json kinds = json::object();
  for (int k = 0; k < format::kNumAllocKinds; ++k) {
    const auto& u = d.kinds[k];
    if (!u.used) continue;
    kinds[format::alloc_kind_name(static_cast<format::AllocKind>(k))] = {{"current", u.current},
                                                                         {"peak", u.peak},
                                                                         {"total", u.total},
                                                                         {"count", u.count},
                                                                         {"peak_count", u.peak_count},
                                                                         {"total_count", u.total_count}};
  }
  return kinds;
}

// The OOMs recorded (of --device's only, if given), each with its advice and live sites.
json ooms_json(SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& in = m.info;
  StackResolver& res = sites.res(ti);
  json ooms = json::array();
  for (std::size_t oi = 0; oi < m.ooms.size(); ++oi) {
    const auto& o = m.ooms[oi];
    if (opt.device >= 0 && o.rec.device != opt.device) continue;
    const auto& r = o.rec;
    const OomAdvice adv = oom_advice(o);
    ooms.push_back({{"device", r.device},
                    {"ts_ns", rel(r.ts, in)},
                    {"kind", format::alloc_kind_name(r.kind)},
                    {"requested", r.requested},
                    {"device_free", r.device_free},
                    {"device_total", r.device_total},
                    {"limit", r.limit},
                    {"pool_reserved", r.reserved},
                    {"pool_allocated", r.allocated},
                    {"pool_largest_free", r.largest_free},
                    {"replay_reserved", o.model_reserved},
                    {"replay_allocated", o.model_allocated},
                    {"held", adv.held},
                    {"reserved_unused", adv.reserved_unused},
                    {"fits_without_fragmentation", adv.fits_without_fragmentation},
                    {"cause", adv.cause},
                    {"suggestion", adv.suggestion},
                    {"fragmentation", frag_json(o.frag, in)},
                    {"top_live", site_list(sites.oom_live(ti, oi), res, opt)},
                    {"categories", oom_categories_json(sites, ti, oi)}});
    put_stack(ooms.back(), res.frames(r.stack), opt);
  }
  return ooms;
}

// --group-by's rows for one device (peak_groups), as summary --json's peak_groups.
json peak_groups_json(SiteLists& sites, std::size_t ti, std::size_t di, const SummaryOptions& opt) {
  const DeviceState& d = sites.analysis().traces[ti]->devices[di];
  json out = json::array();
  for (const auto& g : peak_groups(sites, ti, di, opt))
    out.push_back(
        {{"device", d.device},
         {"by", opt.group_by},
         {"key", g.key},
         {"bytes", g.bytes},
         {"allocated_bytes", g.allocated},
         {"count", g.count},
         {"sites", g.sites},
         {"percent", d.peak_held > 0 ? 100.0 * static_cast<double>(g.bytes) / static_cast<double>(d.peak_held) : 0.0}});
  return out;
}

json process_json(SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& in = m.info;
  StackResolver& res = sites.res(ti);
  json doc;
  doc["schema"] = "gpuheap.summary/2";
  doc["trace"] = {{"path", in.path},
                  {"pid", in.pid},
                  {"ppid", in.ppid},
                  {"host", in.hostname},
                  {"command", in.command},
                  {"exe", in.exe},
                  {"version", in.version},
                  {"start_wall_ns", in.wall_ns},
                  {"duration_ns", in.duration_ns()},
                  {"events", in.events},
                  {"records", in.records},
                  {"truncated", in.truncated},
                  {"cut_mid_record", in.cut_mid_record},
                  {"has_end", in.has_end},
                  {"end_ns", in.duration_ns()},
                  {"unmatched_frees", in.unmatched_frees},
                  {"unmatched_free_completed", in.unmatched_free_completed}};
  if (in.window)  // a rolling window's segment (format v6): what docs/cli.md says stays exact
    doc["trace"]["window"] = {{"segment", in.window_segment},
                              {"events_before", in.events_before},
                              {"start_ns", rel(in.window_start_ts, in)},
                              {"exact",
                               {"peak_held", "peak_consumers", "leaks", "most_allocations", "num_ooms",
                                "num_alloc_retries", "empty_cache"}}};
  if (in.rank >= 0) {  // only where the trace has an identity record (format v4)
    auto known = [](std::int32_t v) { return v >= 0 ? json(v) : json(nullptr); };
    doc["trace"]["rank"] = in.rank, doc["trace"]["local_rank"] = known(in.local_rank);
    doc["trace"]["world_size"] = known(in.world_size);
    doc["trace"]["rank_source"] = format::rank_source_name(in.rank_source);
  }
  static const std::pair<Metric, const char*> kMetrics[] = {
      {kRequestedBytes, "requested_bytes"},
      {kAllocatedBytes, "allocated_bytes"},
      {kActiveBytes, "active_bytes"},
      {kReservedBytes, "reserved_bytes"},
      {kInactiveSplitBytes, "inactive_split_bytes"},
      {kAllocations, "allocations"},
      {kActiveAllocs, "active_allocs"},
      {kSegments, "segments"},
      {kInactiveSplit, "inactive_split"},
      {kOversizeAllocations, "oversize_allocations"},
      {kOversizeSegments, "oversize_segments"},
  };
  json devs = json::array(), peaks = json::array(), frag = json::array(), tl = json::array(), groups = json::array();
  // Pinned host memory has no device (the trace's device -1): its own object, so that
  // devices[] holds GPUs only and devices[0] is the first GPU.
  doc["host"] = {{"other_kinds", json::object()}};
  for (const auto& d : m.devices)
    if (d.device < 0) doc["host"]["other_kinds"] = kinds_json(d);
  for (std::size_t di = 0; di < m.devices.size(); ++di) {
    const auto& d = m.devices[di];
    if (d.device < 0 || (opt.device >= 0 && d.device != opt.device)) continue;
    json j = {{"device", d.device}, {"name", d.name}, {"total_memory", d.total_memory}};
    for (auto [metric, name] : kMetrics) j[name] = metric_json(d, metric);
    j["num_ooms"] = d.num_ooms;
    j["num_alloc_retries"] = d.num_alloc_retries;
    j["torch_memory_stats"] = torch_memory_stats_json(d);
    j["empty_cache"] = {{"calls", d.empty_cache_calls}, {"released", d.empty_cache_released}};
    j["other_kinds"] = kinds_json(d);
    j["peak_held"] = {{"bytes", d.peak_held},
                      {"allocated_bytes", d.peak_held_allocated},
                      {"ts_ns", rel(d.peak_held_ts, in)}};
    devs.push_back(std::move(j));

    for (auto& e : site_list(sites.peak(ti, di), res, opt, static_cast<double>(d.peak_held))) {
      e["device"] = d.device;
      peaks.push_back(std::move(e));
    }
    if (!opt.group_by.empty())
      for (auto& g : peak_groups_json(sites, ti, di, opt)) groups.push_back(std::move(g));
    json libs = json::array();
    for (const auto& l : sites.peak_libraries(ti, di))
      libs.push_back({{"library", l.library}, {"bytes", l.bytes}, {"count", l.count}});
    devs.back()["peak_by_library"] = std::move(libs);
    if (d.frag_reserved_peak > 0)  // the one figure, as replay gives it (model/fragmentation.h)
      devs.back()["fragmentation"] = {{"bytes", std::max<std::int64_t>(d.frag_non_releasable, 0)},
                                      {"at", "peak_reserved"},
                                      {"reserved", d.frag_reserved_peak},
                                      {"ts_ns", rel(d.frag_reserved_ts, in)}};
    if (d.frag_peak.valid) {
      auto f = frag_json(d.frag_peak, in);
      f["device"] = d.device;
      f["at"] = "peak_allocated";
      frag.push_back(std::move(f));
    }
    json pts = json::array();
    for (const auto& p : d.timeline.points()) pts.push_back({p.t, p.requested, p.allocated, p.reserved});
    tl.push_back({{"device", d.device},
                  {"start_ns", rel(d.timeline.start(), in)},
                  {"bucket_ns", d.timeline.bucket_ns()},
                  {"columns", {"t_ns", "requested_max", "allocated_max", "reserved_max"}},
                  {"points", std::move(pts)}});
  }
  doc["devices"] = std::move(devs);
  doc["peak_consumers"] = std::move(peaks);
  if (!opt.group_by.empty()) doc["peak_groups"] = std::move(groups);

  doc["most_allocations"] = site_list(sites.most_allocations(ti), res, opt);
  doc["temporary"] = site_list(sites.temporary(ti), res, opt);
  doc["leaks"] = site_list(sites.leaks(ti), res, opt);  // every site: `category` says which are a library's
  doc["leaked_bytes"] = m.leaked_bytes;
  doc["leaked_allocated_bytes"] = m.leaked_allocated_bytes;
  doc["leaked_count"] = m.leaked_count;
  doc["fragmentation"] = std::move(frag);
  doc["ooms"] = ooms_json(sites, ti, opt);
  doc["timeline"] = std::move(tl);
  phases_json(doc, m, opt);
  if (!m.windowed() && !in.window) doc["categories"] = categories_json(sites, ti);
  add_site_categories(doc, sites, ti);
  return doc;
}

}  // namespace

nlohmann::json summary_json(const Analysis& a, const SummaryOptions& opt) {
  SiteLists sites(a, opt.all_frames);
  return summary_json(a, opt, sites);
}

nlohmann::json summary_json(const Analysis& a, const SummaryOptions& opt, SiteLists& sites) {
  if (&sites.analysis() != &a || sites.all_frames() != opt.all_frames)
    throw std::invalid_argument("summary_json: site lists of another analysis or frame view");
  if (a.traces.size() == 1) return process_json(sites, 0, opt);
  json doc;
  doc["schema"] = "gpuheap.summary/2";
  doc["processes"] = json::array();
  std::uint64_t leaked = 0;
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
    auto p = process_json(sites, ti, opt);
    p.erase("schema");
    leaked += a.traces[ti]->leaked_bytes;
    doc["processes"].push_back(std::move(p));
  }
  json devs = json::array(), tl = json::array();
  for (const auto& md : a.merged) {
    if (md.device < 0 || (opt.device >= 0 && md.device != opt.device)) continue;
    devs.push_back({{"device", md.device},
                    {"host", md.host},
                    {"processes", md.traces},
                    {"requested_bytes", stat_json(md.requested)},
                    {"allocated_bytes", stat_json(md.allocated)},
                    {"reserved_bytes", stat_json(md.reserved)},
                    {"sum_of_peaks_allocated", md.sum_of_peaks_allocated},
                    {"sum_of_peaks_reserved", md.sum_of_peaks_reserved},
                    {"peak_allocated_wall_ns", md.peak_allocated_wall_ns}});
    json pts = json::array();
    for (const auto& p : md.timeline.points()) pts.push_back({p.t, p.requested, p.allocated, p.reserved});
    tl.push_back({{"device", md.device},
                  {"host", md.host},
                  {"bucket_ns", md.timeline.bucket_ns()},
                  {"columns", {"t_ns", "requested_max", "allocated_max", "reserved_max"}},
                  {"points", std::move(pts)}});
  }
  doc["merged"] = {{"start_wall_ns", a.merged_start_wall_ns},
                   {"devices", std::move(devs)},
                   {"leaked_bytes", leaked},
                   {"timeline", std::move(tl)}};
  doc["ranks"] = ranks_json(a, opt.device);
  return doc;
}

}  // namespace gpuheap
