// Text summary. Section order: header, per-device torch-style tables (+ non-pooled kinds),
// peak consumers, most allocations / temporaries, leaks, fragmentation and OOMs; then, for
// several traces, the merged per-device view.
#include <algorithm>

#include <fmt/format.h>

#include "analyzer/labels.h"
#include "analyzer/report.h"
#include "analyzer/text_safe.h"
#include "analyzer/units.h"

namespace gpuheap {

namespace {

const std::string kRule(75, '-');
const std::string kDouble(75, '=');

std::string signed_bytes(std::int64_t v) {
  return (v < 0 ? "-" : "+") + human_bytes(static_cast<std::uint64_t>(v < 0 ? -v : v));
}

// One site's stack. By default from the first frame below the allocator's own (labels.h;
// those are counted in one line), at most opt.depth frames; a stack through Python that is
// too long to show whole keeps its first frame and the Python lines, which say where in the
// program it was, counting the native frames between (the framework's operator dispatch).
// --full: every frame. summary --json has every frame.
void append_stack(std::string& out, StackResolver& res, std::uint32_t stack, const SummaryOptions& opt) {
  const auto& fr = res.frames(stack);
  if (fr.empty()) {
    out += stack == 0 ? "        (no stack recorded)\n" : fmt::format("        (stack {} not in trace)\n", stack);
    return;
  }
  auto line = [&](std::size_t i) { out += fmt::format("        at {}\n", Symbolizer::format_frame(fr[i])); };
  if (opt.full) {
    for (std::size_t i = 0; i < fr.size(); ++i) line(i);
    return;
  }
  const LabelPos pos = label_pos(fr);
  if (pos.allocator > 0)
    out += fmt::format("        ... {} allocator frame{}\n", pos.allocator, pos.allocator == 1 ? "" : "s");
  std::size_t next = pos.allocator, shown = 0;
  if (pos.python_from > next) {
    out += fmt::format("        ... {} native frame{}\n", pos.python_from - next, pos.python_from - next == 1 ? "" : "s");
    next = pos.python_from;
  }
  std::size_t first_py = next;
  while (first_py < fr.size() && fr[first_py].module != "python") ++first_py;
  if (first_py < fr.size() && fr.size() - next > opt.depth && first_py > next + 1 && opt.depth > 2) {
    line(next);
    out += fmt::format("        ... {} native frame{}\n", first_py - next - 1, first_py - next - 1 == 1 ? "" : "s");
    shown = 1, next = first_py;
  }
  for (; next < fr.size() && shown < opt.depth; ++next, ++shown) line(next);
  if (next < fr.size()) out += fmt::format("        ... {} more frame{}\n", fr.size() - next, fr.size() - next == 1 ? "" : "s");
}

// "[LIBRARY] LABEL (file:line)" after a site's numbers: what a person reads first.
std::string site_tag(StackResolver& res, std::uint32_t stack) {
  const auto& fr = res.frames(stack);
  return fmt::format("[{}] {}", text_safe(library_label(fr)), site_label_text(fr));
}

void kinds_table(std::string& out, const DeviceState& d);

// "REQUESTED requested  ALLOCATED allocated": what the program asked for (the same every
// run of a deterministic program), then the pool's block bytes beside it.
std::string both_bytes(std::uint64_t requested, std::uint64_t allocated) {
  return fmt::format("{:>10} requested {:>10} allocated", human_bytes(requested), human_bytes(allocated));
}

// Records with no device (device < 0: host allocations) get only the non-pooled rows.
bool host_only(const DeviceState& d) { return d.device < 0 && d.stat[kAllocatedBytes][0].allocated == 0 &&
                                              d.stat[kReservedBytes][0].allocated == 0; }

void torch_table(std::string& out, const DeviceState& d) {
  if (host_only(d)) {
    out += kDouble + "\n";
    out += fmt::format(" {:^73} \n", "gpuheap host memory (no device)");
    out += kDouble + "\n";
    kinds_table(out, d);
    return;
  }
  out += kDouble + "\n";
  std::string title = fmt::format("gpuheap memory summary, device ID {} ({})", d.device,
                                  d.name.empty() ? "unknown" : text_safe(d.name));
  if (title.size() > 73) title = title.substr(0, 70) + "...)";
  out += fmt::format(" {:^73} \n", title);
  out += kRule + "\n";
  out += fmt::format("{:<75}\n", fmt::format("  {:9} CUDA OOMs: {:<12d} | {:6} cudaMalloc retries: {:<8d}", "",
                                             d.num_ooms, "", d.num_alloc_retries));
  out += kDouble + "\n";
  out += "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  \n";
  struct Row {
    Metric m;
    const char* name;
    bool bytes;
  };
  static const Row rows[] = {
      {kAllocatedBytes, "Allocated memory", true},     {kActiveBytes, "Active memory", true},
      {kRequestedBytes, "Requested memory", true},     {kReservedBytes, "GPU reserved memory", true},
      {kInactiveSplitBytes, "Non-releasable memory", true}, {kAllocations, "Allocations", false},
      {kActiveAllocs, "Active allocs", false},         {kSegments, "GPU reserved segments", false},
      {kInactiveSplit, "Non-releasable allocs", false},
  };
  auto cell = [](bool bytes, std::int64_t v, std::int64_t pref) {
    return bytes ? torch_size_cell(v, pref) : torch_count_cell(v, pref);
  };
  for (const auto& r : rows) {
    out += kRule + "\n";
    const auto& all = d.stat[r.m][kAllPools];
    const char* names[] = {r.name, "      from large pool", "      from small pool"};
    for (int p = 0; p < 3; ++p) {
      const auto& s = d.stat[r.m][p];
      out += fmt::format(" {:<21} | {} | {} | {} | {} \n", names[p], cell(r.bytes, s.current, all.current),
                         cell(r.bytes, s.peak, all.peak), cell(r.bytes, s.allocated, all.allocated),
                         cell(r.bytes, s.freed, all.freed));
    }
  }
  for (auto [m, name] : {std::pair{kOversizeAllocations, "Oversize allocations"},
                         std::pair{kOversizeSegments, "Oversize GPU segments"}}) {
    out += kRule + "\n";
    const auto& s = d.stat[m][kAllPools];
    out += fmt::format(" {:<21} | {} | {} | {} | {} \n", name, torch_count_cell(s.current, s.current),
                       torch_count_cell(s.peak, s.peak), torch_count_cell(s.allocated, s.allocated),
                       torch_count_cell(s.freed, s.freed));
  }
  out += kDouble + "\n";
  kinds_table(out, d);
}

void kinds_table(std::string& out, const DeviceState& d) {
  // Kinds the pool does not serve: own rows, never mixed into the pool's numbers.
  bool any = std::any_of(d.kinds.begin(), d.kinds.end(), [](const KindUsage& k) { return k.used; });
  if (!any) return;
  out += "  Not pooled           | Cur Usage  | Peak Usage | Tot Alloc  | Allocs now \n";
  out += kRule + "\n";
  static const std::pair<format::AllocKind, const char*> kinds[] = {
      {format::AllocKind::async, "Async (stream-ord.)"},  {format::AllocKind::managed, "Managed memory"},
      {format::AllocKind::vmm_physical, "VMM physical"},  {format::AllocKind::vmm_map, "VMM mapped"},
      {format::AllocKind::host_pinned, "Host pinned"},    {format::AllocKind::va_reserve, "VA reserved (addr)"},
  };
  for (auto [k, name] : kinds) {
    const auto& u = d.kinds[static_cast<int>(k)];
    if (!u.used) continue;
    out += fmt::format(" {:<21} | {} | {} | {} | {} \n", name, torch_size_cell(u.current, u.current),
                       torch_size_cell(u.peak, u.peak), torch_size_cell(u.total, u.total),
                       torch_count_cell(u.count, u.count));
  }
  out += kDouble + "\n";
}

void frag_text(std::string& out, const Fragmentation& f, const char* indent) {
  out += fmt::format("{}pool reserved {}, allocated {}, free {} in {} pieces, largest free block {}\n", indent,
                     human_bytes(f.reserved), human_bytes(f.allocated), human_bytes(f.free_bytes),
                     f.free_pieces, human_bytes(f.largest_free));
  out += fmt::format("{}unusable for a median-sized request ({}): {} = {:.1f}% of reserved\n", indent,
                     human_bytes(f.median_request), human_bytes(f.unusable_bytes), 100.0 * f.unusable_share);
}

void process_text(std::string& out, const Model& m, const SummaryOptions& opt) {
  const auto& in = m.info;
  StackResolver res(m, opt.all_frames);
  std::string cmd;
  for (const auto& c : in.command) cmd += (cmd.empty() ? "" : " ") + text_safe(c);
  out += fmt::format("gpuheap summary of {}\n", text_safe(in.path));
  out += fmt::format("  command:   {}\n", cmd.empty() ? "(unknown)" : cmd);
  out += fmt::format("  pid:       {} (ppid {}) on {}\n", in.pid, in.ppid, in.hostname.empty() ? "?" : text_safe(in.hostname));
  out += fmt::format("  duration:  {}\n", human_duration_ns(in.duration_ns()));
  for (const auto& d : m.devices)
    if (host_only(d)) out += "  host:      pinned host memory, no device\n";
    else out += fmt::format("  device {}:  {} ({})\n", d.device, d.name.empty() ? "unknown" : text_safe(d.name),
                       d.total_memory ? human_bytes(d.total_memory) : "total unknown");
  out += fmt::format("  events:    {} ({} records)\n", in.events, in.records);
  if (!opt.window.empty())
    out += fmt::format("  window:    {} (peaks, sites, leaks and OOMs inside it only; docs/cli.md)\n", opt.window);
  if (!opt.library.empty())
    out += fmt::format("  library:   {} (site lists show its sites only; totals are the whole trace's)\n",
                       text_safe(opt.library));
  if (!in.truncated) {
    out += "  truncated: no\n";
  } else {
    out += fmt::format("  truncated: yes ({}{}), ends at {} after start\n",
                       in.has_end ? "" : "no end record", in.cut_mid_record ? (in.has_end ? "cut mid-record" : "; cut mid-record") : "",
                       human_duration_ns(in.duration_ns()));
  }
  if (in.unmatched_frees)
    out += fmt::format("  unmatched frees: {} (memory allocated before tracing started; ignored)\n",
                       in.unmatched_frees);
  out += "\n";

  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    torch_table(out, d);
    out += "\n";
  }
  phases_text(out, m, opt);

  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    if (d.peak_held <= 0) continue;
    out += fmt::format("Peak memory consumers, device {}: peak {} requested ({} allocated) at {} after start\n",
                       d.device, human_bytes(static_cast<std::uint64_t>(d.peak_held)),
                       human_bytes(static_cast<std::uint64_t>(d.peak_held_allocated)),
                       human_duration_ns(d.peak_held_ts - std::min(d.peak_held_ts, in.mono_ns)));
    std::vector<SiteRow> rows;
    for (const auto& s : d.peak_consumers) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
    auto merged = merge_sites(rows, res);
    auto shown = shown_sites(merged, res, opt);
    for (std::size_t i = 0; i < shown.size(); ++i) {
      const auto& r = shown[i];
      out += fmt::format("  #{:<2} {} ({:.1f}% of peak) in {} allocation{} {}\n", i + 1, both_bytes(r.bytes, r.allocated),
                         100.0 * static_cast<double>(r.bytes) / static_cast<double>(d.peak_held), r.count,
                         r.count == 1 ? "" : "s", site_tag(res, r.stack));
      append_stack(out, res, r.stack, opt);
    }
    auto libs = peak_by_library(merged, res);
    if (libs.size() > 1) {
      out += fmt::format("  by library at the peak:");
      for (const auto& l : libs)
        out += fmt::format(" {} {} ({:.1f}%);", text_safe(l.library), human_bytes(l.bytes),
                           100.0 * static_cast<double>(l.bytes) / static_cast<double>(d.peak_held));
      out.back() = '\n';
    }
    out += "\n";
  }

  std::vector<SiteRow> by_count, temps;
  for (std::uint32_t id = 0; id < m.sites.size(); ++id) {
    const auto& s = m.sites[id];
    if (s.allocs) by_count.push_back({id, s.alloc_bytes, s.allocs, s.alloc_allocated});
    if (s.temporaries) temps.push_back({id, s.temporary_bytes, s.temporaries, s.temporary_allocated});
  }
  auto list = [&](const char* title, const std::vector<SiteRow>& rows, const char* what) {
    if (rows.empty()) return;
    out += fmt::format("{}\n", title);
    auto shown = shown_sites(merge_sites(rows, res, true), res, opt);
    for (std::size_t i = 0; i < shown.size(); ++i) {
      out += fmt::format("  #{:<2} {} {} ({} requested, {} allocated in total) {}\n", i + 1, shown[i].count, what,
                         human_bytes(shown[i].bytes), human_bytes(shown[i].allocated), site_tag(res, shown[i].stack));
      // Counts, not bytes: one line per site unless frames are asked for (--depth, --full).
      if (opt.depth_given || opt.full) append_stack(out, res, shown[i].stack, opt);
    }
    out += "\n";
  };
  list("Most allocations (by count)", by_count, "allocations");
  list("Most temporary allocations (freed before the thread's next allocation)", temps, "temporary allocations");

  if (!m.leaks.empty()) {
    out += fmt::format("Leaks (live at the end of the trace{}): {} requested ({} allocated) in {} allocations\n",
                       in.truncated ? "; truncated trace, so the process may have freed them later" : "",
                       human_bytes(m.leaked_bytes), human_bytes(m.leaked_allocated_bytes), m.leaked_count);
    std::vector<SiteRow> rows;
    for (const auto& l : m.leaks) rows.push_back({l.stack, l.bytes, l.count, l.allocated});
    auto shown = shown_sites(merge_sites(rows, res), res, opt);
    for (std::size_t i = 0; i < shown.size(); ++i) {
      out += fmt::format("  #{:<2} {} in {} allocation{} {}\n", i + 1, both_bytes(shown[i].bytes, shown[i].allocated),
                         shown[i].count, shown[i].count == 1 ? "" : "s", site_tag(res, shown[i].stack));
      append_stack(out, res, shown[i].stack, opt);
    }
    out += "\n";
  } else {
    out += "Leaks: none (every allocation was freed)\n\n";
  }

  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    const auto& f = d.frag_peak;
    if (!f.valid) continue;
    out += fmt::format("Fragmentation at peak allocated, device {} ({} after start):\n", d.device,
                       human_duration_ns(f.ts - std::min(f.ts, in.mono_ns)));
    frag_text(out, f, "  ");
    out += "\n";
  }
  for (const auto& o : m.ooms) {
    if (opt.device >= 0 && o.rec.device != opt.device) continue;
    const auto& r = o.rec;
    out += fmt::format("OOM on device {} at {} after start: {} request of {} failed\n", r.device,
                       human_duration_ns(r.ts - std::min(r.ts, in.mono_ns)), format::alloc_kind_name(r.kind),
                       human_bytes(r.requested));
    out += fmt::format("  device free {} of {}, limit {}\n", human_bytes(r.device_free), human_bytes(r.device_total),
                       r.limit ? human_bytes(r.limit) : "none");
    out += fmt::format("  pool (recorded): reserved {}, allocated {}, largest free block {}\n",
                       human_bytes(r.reserved), human_bytes(r.allocated), human_bytes(r.largest_free));
    const OomAdvice adv = oom_advice(o);
    out += fmt::format("  held by this process {}; pool reserved but unused {}\n", human_bytes(adv.held),
                       human_bytes(adv.reserved_unused));
    out += fmt::format("  {}\n", adv.fit);
    out += fmt::format("  suggestion: {}\n", adv.suggestion);
    frag_text(out, o.frag, "  replay: ");
    out += "  failing call:\n";
    append_stack(out, res, r.stack, opt);
    if (!o.top_live.empty()) out += "  largest live sites at the OOM:\n";
    std::vector<SiteRow> rows;
    for (const auto& s : o.top_live) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
    for (const auto& s : shown_sites(merge_sites(rows, res), res, opt)) {
      out += fmt::format("    {} in {} allocation{} {}\n", both_bytes(s.bytes, s.allocated), s.count,
                         s.count == 1 ? "" : "s", site_tag(res, s.stack));
      append_stack(out, res, s.stack, opt);
    }
    out += "\n";
  }
  std::uint64_t more = 0;
  for (const auto& d : m.devices) more += d.num_ooms;
  if (more > m.ooms.size())
    out += fmt::format("({} more OOMs not detailed)\n\n", more - m.ooms.size());
}

}  // namespace

std::string summary_text(const Analysis& a, const SummaryOptions& opt) {
  std::string out;
  for (std::size_t i = 0; i < a.traces.size(); ++i) {
    if (a.traces.size() > 1)
      out += fmt::format("##### process {} of {} (pid {}) #####\n", i + 1, a.traces.size(), a.traces[i]->info.pid);
    process_text(out, *a.traces[i], opt);
  }
  if (a.traces.size() > 1) {
    out += fmt::format("##### merged view of {} processes (aligned by wall clock) #####\n", a.traces.size());
    for (const auto& md : a.merged) {
      if (opt.device >= 0 && md.device != opt.device) continue;
      out += fmt::format("  device {}: peak allocated {} (sum of per-process peaks {}), peak reserved {} (sum {}), "
                         "peak requested {}\n",
                         md.device, human_bytes(static_cast<std::uint64_t>(md.allocated.peak)),
                         human_bytes(static_cast<std::uint64_t>(md.sum_of_peaks_allocated)),
                         human_bytes(static_cast<std::uint64_t>(md.reserved.peak)),
                         human_bytes(static_cast<std::uint64_t>(md.sum_of_peaks_reserved)),
                         human_bytes(static_cast<std::uint64_t>(md.requested.peak)));
    }
    out += "\n";
  }
  return out;
}

std::string diff_text(const std::vector<DiffRow>& rows, std::size_t top, const Model& a, const Model& b) {
  std::string out = fmt::format("gpuheap diff: A = {}\n              B = {}\n", text_safe(a.info.path),
                                text_safe(b.info.path));
  out += "Per-site change (B - A) in peak held and total requested bytes, largest first\n";
  if (rows.empty()) out += "  no differences\n";
  for (std::size_t i = 0; i < rows.size() && i < top; ++i) {
    const auto& r = rows[i];
    out += fmt::format("  #{:<2} peak {} ({} -> {}), total {} ({} -> {})\n", i + 1, signed_bytes(r.d_peak()),
                       human_bytes(static_cast<std::uint64_t>(r.peak_a)), human_bytes(static_cast<std::uint64_t>(r.peak_b)),
                       signed_bytes(r.d_total()), human_bytes(static_cast<std::uint64_t>(r.total_a)),
                       human_bytes(static_cast<std::uint64_t>(r.total_b)));
    if (r.frames.empty()) out += fmt::format("        {}\n", text_safe(r.key));
    for (std::size_t j = 0; j < r.frames.size() && j < 12; ++j)
      out += fmt::format("        at {}\n", Symbolizer::format_frame(r.frames[j]));
  }
  return out;
}

}  // namespace gpuheap
