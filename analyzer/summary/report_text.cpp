// Text summary. Section order: header, per-device torch-style tables (+ non-pooled kinds),
// peak consumers, most allocations / temporaries, leaks, fragmentation and OOMs; then, for
// several traces, the merged per-device view.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/model/fragmentation.h"
#include "analyzer/summary/ranks.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap {

namespace {

const std::string kRule(75, '-');
const std::string kDouble(75, '=');

std::string signed_bytes(std::int64_t v) {
  return (v < 0 ? "-" : "+") + human_bytes(static_cast<std::uint64_t>(v < 0 ? -v : v));
}

std::string count_of(std::size_t n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

std::string joined(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

// One site's stack. By default from the first frame below the allocator's own (labels.h;
// those are counted in one line), at most opt.depth frames; a stack through Python that is
// too long to show whole keeps its first frame and the Python lines, which say where in the
// program it was, counting the native frames between (the framework's operator dispatch).
// Frames that only pass the call on (labels.h Passthrough: nn.Module's __call__ machinery,
// the operator dispatcher) and a stripped library's unnamed frames after one of its frames
// already shown say nothing a person can act on: they are left out and counted in the last
// line, so the frames shown are the ones that differ between sites.
// --full: every frame. summary --json has every frame.
void append_frames(std::string& out, const std::vector<Frame>& fr, const SummaryOptions& opt) {
  auto line = [&](std::size_t i) { out += fmt::format("        at {}\n", Symbolizer::format_frame(fr[i])); };
  if (opt.full) {
    for (std::size_t i = 0; i < fr.size(); ++i) line(i);
    return;
  }
  const LabelPos pos = label_pos(fr);
  std::vector<std::string> above;
  if (pos.allocator > 0) above.push_back(count_of(pos.allocator, "allocator frame"));
  std::size_t next = pos.allocator, shown = 0;
  if (pos.python_from > next) {
    above.push_back(count_of(pos.python_from - next, "native frame"));
    next = pos.python_from;
  }
  if (!above.empty()) out += "        ... " + joined(above, ", ") + "\n";
  std::size_t first_py = next;
  while (first_py < fr.size() && fr[first_py].module != "python") ++first_py;
  if (first_py < fr.size() && fr.size() - next > opt.depth && first_py > next + 1 && opt.depth > 2) {
    line(next);
    out += fmt::format("        ... {}\n", count_of(first_py - next - 1, "native frame"));
    shown = 1, next = first_py;
  }
  std::size_t module_calls = 0, dispatch = 0, unnamed = 0;
  const Frame* last = nullptr;
  for (; next < fr.size() && shown < opt.depth; ++next) {
    const Frame& f = fr[next];
    if (next != pos.index) {  // the label's own frame is always shown
      const Passthrough kind = passthrough_kind(f);
      if (kind == Passthrough::module_call) {
        ++module_calls;
        continue;
      }
      if (kind == Passthrough::dispatch) {
        ++dispatch;
        continue;
      }
      if (last && f.function.empty() && f.module != "python" && f.module == last->module) {
        ++unnamed;
        continue;
      }
    }
    line(next);
    last = &f, ++shown;
  }
  std::vector<std::string> folded;
  if (module_calls) folded.push_back(fmt::format("{} module-call", module_calls));
  if (dispatch) folded.push_back(fmt::format("{} dispatch", dispatch));
  if (unnamed) folded.push_back(fmt::format("{} unnamed", unnamed));
  const std::size_t n_folded = module_calls + dispatch + unnamed;
  const std::string fold = folded.empty()
                               ? ""
                               : joined(folded, " + ") + (n_folded == 1 ? " frame folded" : " frames folded");
  if (next < fr.size())
    out += "        ... " + count_of(fr.size() - next, "more frame") + (fold.empty() ? "" : ", " + fold) + "\n";
  else if (!fold.empty()) out += "        ... " + fold + "\n";
}

void append_stack(std::string& out, StackResolver& res, std::uint32_t stack, const SummaryOptions& opt) {
  const auto& fr = res.frames(stack);
  if (fr.empty())
    out += stack == 0 ? "        (no stack recorded)\n" : fmt::format("        (stack {} not in trace)\n", stack);
  else append_frames(out, fr, opt);
}

// "[LIBRARY] LABEL (file:line)" after a site's numbers: what a person reads first.
// The default view elides a C++ label's template arguments (labels.h short_name): a site
// is one line, and a kernel's template name alone can be 300 characters; --full spells it out.
std::string site_tag(StackResolver& res, std::uint32_t stack, const SummaryOptions& opt) {
  return fmt::format("[{}] {}", text_safe(res.library(stack)), site_label_text(res.frames(stack), !opt.full));
}

void kinds_table(std::string& out, const DeviceState& d, const char* title = "Not pooled");

// "REQUESTED requested  ALLOCATED allocated": what the program asked for (the same every
// run of a deterministic program), then the pool's block bytes beside it.
std::string both_bytes(std::uint64_t requested, std::uint64_t allocated) {
  return fmt::format("{:>10} requested {:>10} allocated", human_bytes(requested), human_bytes(allocated));
}

// Records with no device (device < 0: host allocations) get only the non-pooled rows.
bool host_only(const DeviceState& d) {
  return d.device < 0 && d.stat[kAllocatedBytes][0].allocated == 0 && d.stat[kReservedBytes][0].allocated == 0;
}

// The pools' rows (large/small, PyTorch's 1 MiB split) only with --pools or --full: they
// matter when tuning the caching allocator's splitting; every figure a gate, the peak or a
// leak reads is in the all-pools rows, which keep torch.cuda.memory_summary()'s shape.
void torch_table(std::string& out, const DeviceState& d, const SummaryOptions& opt) {
  if (host_only(d)) {
    if (!opt.pools && !opt.full) return kinds_table(out, d, "Host (no device)");  // the rows are all there is
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
      {kAllocatedBytes, "Allocated memory", true},
      {kActiveBytes, "Active memory", true},
      {kRequestedBytes, "Requested memory", true},
      {kReservedBytes, "GPU reserved memory", true},
      {kInactiveSplitBytes, "Non-releasable memory", true},
      {kAllocations, "Allocations", false},
      {kActiveAllocs, "Active allocs", false},
      {kSegments, "GPU reserved segments", false},
      {kInactiveSplit, "Non-releasable allocs", false},
  };
  auto cell = [](bool bytes, std::int64_t v, std::int64_t pref) {
    return bytes ? torch_size_cell(v, pref) : torch_count_cell(v, pref);
  };
  const bool pools = opt.pools || opt.full;
  for (std::size_t i = 0; i < std::size(rows); ++i) {
    const auto& r = rows[i];
    // One row per metric without the pools: rules around the bytes rows and the counts rows.
    if (pools || i == 0 || rows[i].bytes != rows[i - 1].bytes) out += kRule + "\n";
    const auto& all = d.stat[r.m][kAllPools];
    const char* names[] = {r.name, "      from large pool", "      from small pool"};
    for (int p = 0; p < (pools ? 3 : 1); ++p) {
      const auto& s = d.stat[r.m][p];
      out += fmt::format(" {:<21} | {} | {} | {} | {} \n", names[p], cell(r.bytes, s.current, all.current),
                         cell(r.bytes, s.peak, all.peak), cell(r.bytes, s.allocated, all.allocated),
                         cell(r.bytes, s.freed, all.freed));
    }
  }
  // Oversize blocks exist only under a max_split_size policy: two rows of zeros otherwise,
  // left out of the default view.
  const bool oversize = pools || d.stat[kOversizeAllocations][kAllPools].allocated != 0 ||
                        d.stat[kOversizeSegments][kAllPools].allocated != 0;
  for (auto [m, name] : {std::pair{kOversizeAllocations, "Oversize allocations"},
                         std::pair{kOversizeSegments, "Oversize GPU segments"}}) {
    if (!oversize) break;
    if (pools || m == kOversizeAllocations) out += kRule + "\n";
    const auto& s = d.stat[m][kAllPools];
    out += fmt::format(" {:<21} | {} | {} | {} | {} \n", name, torch_count_cell(s.current, s.current),
                       torch_count_cell(s.peak, s.peak), torch_count_cell(s.allocated, s.allocated),
                       torch_count_cell(s.freed, s.freed));
  }
  out += kDouble + "\n";
  kinds_table(out, d);
}

void kinds_table(std::string& out, const DeviceState& d, const char* title) {
  // Kinds the pool does not serve: own rows, never mixed into the pool's numbers.
  bool any = std::any_of(d.kinds.begin(), d.kinds.end(), [](const KindUsage& k) { return k.used; });
  if (!any) return;
  out += fmt::format("  {:<21}| Cur Usage  | Peak Usage | Tot Alloc  | Allocs now \n", title);
  out += kRule + "\n";
  static const std::pair<format::AllocKind, const char*> kinds[] = {
      {format::AllocKind::async, "Async (stream-ord.)"}, {format::AllocKind::managed, "Managed memory"},
      {format::AllocKind::vmm_physical, "VMM physical"}, {format::AllocKind::vmm_map, "VMM mapped"},
      {format::AllocKind::host_pinned, "Host pinned"},   {format::AllocKind::va_reserve, "VA reserved (addr)"},
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

// The trace's header: command, process, devices, events, window and filters, truncation.
void header_text(std::string& out, const Model& m, const SummaryOptions& opt) {
  const auto& in = m.info;
  std::string cmd;
  for (const auto& c : in.command) cmd += (cmd.empty() ? "" : " ") + text_safe(c);
  out += fmt::format("gpuheap summary of {}\n", text_safe(in.path));
  out += fmt::format("  command:   {}\n", cmd.empty() ? "(unknown)" : cmd);
  out += fmt::format("  pid:       {} (ppid {}) on {}\n", in.pid, in.ppid,
                     in.hostname.empty() ? "?" : text_safe(in.hostname));
  out += fmt::format("  duration:  {}\n", human_duration_ns(in.duration_ns()));
  for (const auto& d : m.devices)
    if (!host_only(d))
      out += fmt::format("  device {}:  {} ({})\n", d.device, d.name.empty() ? "unknown" : text_safe(d.name),
                         d.total_memory ? human_bytes(d.total_memory) : "total unknown");
  if (std::any_of(m.devices.begin(), m.devices.end(), host_only)) out += "  host:      pinned host memory, no device\n";
  out += fmt::format("  events:    {} ({} records)\n", in.events, in.records);
  if (!opt.window.empty())
    out += fmt::format("  window:    {} (peaks, sites, leaks and OOMs inside it only; docs/cli.md)\n", opt.window);
  if (!opt.library.empty())
    out += fmt::format("  library:   {} (site lists show its sites only; totals are the whole trace's)\n",
                       text_safe(opt.library));
  if (in.window)
    out += fmt::format(
        "  rolling:   a window (gpuheap run --aggregate, segment {}): {} earlier events not in the file, only the "
        "state they left; peaks, live set at the peak, leaks, per-site allocation totals and the counts of OOMs, "
        "retries and empty_cache calls are exact, the timeline, phases, pool statistics, OOM details and "
        "temporaries cover the window from {} after start (docs/cli.md)\n",
        in.window_segment, in.events_before,
        human_duration_ns(in.window_start_ts > in.mono_ns ? in.window_start_ts - in.mono_ns : 0));
  if (!in.truncated) {
    out += "  truncated: no\n";
  } else {
    out += fmt::format("  truncated: yes ({}{}), ends at {} after start\n", in.has_end ? "" : "no end record",
                       in.cut_mid_record ? (in.has_end ? "cut mid-record" : "; cut mid-record") : "",
                       human_duration_ns(in.duration_ns()));
  }
  if (in.unmatched_frees)
    out += fmt::format("  unmatched frees: {} (memory allocated before tracing started; ignored)\n",
                       in.unmatched_frees);
  out += "\n";
}

// Stacks printed for peak consumers, by site key: a leak at the same site (a training job's
// weights and library workspaces are both) refers to it instead of repeating it (not --full).
using ShownStacks = std::unordered_map<std::string, std::string>;

// The ranges open at `ts` (outermost first) with each one's instance number among those of
// its name and depth: "step (#7 of 30) > forward (#7 of 30)"; "" when none is.
std::string phases_at(const Model& m, std::uint64_t ts) {
  std::map<std::pair<std::string, int>, std::uint64_t> seen, total;
  for (const auto& p : m.phases)
    if (!p.mark) ++total[{p.name, p.depth}];
  std::string out;
  for (const auto& p : m.phases) {
    if (p.mark) continue;
    const std::uint64_t n = ++seen[{p.name, p.depth}];
    if (p.start <= ts && (ts < p.end || p.open_at_end))
      out += fmt::format("{}{} (#{} of {})", out.empty() ? "" : " > ", text_safe(p.name), n, total[{p.name, p.depth}]);
  }
  return out;
}

// What tells sites of one label apart: the operator below the allocator (the first frame
// that is not a pass-through), "" when it is the label's own frame.
std::string site_operator(StackResolver& res, std::uint32_t stack) {
  const auto& fr = res.frames(stack);
  const LabelPos lp = label_pos(fr);
  for (std::size_t i = lp.allocator; i < lp.index && i < fr.size(); ++i)
    if (!fr[i].function.empty() && passthrough_kind(fr[i]) == Passthrough::none) {
      std::string op = short_name(qualified_name(fr[i].function));
      for (std::size_t at; (at = op.find("(anonymous namespace)::")) != std::string::npos;) op.erase(at, 23);
      return text_safe(op);
    }
  return "";
}

void grouped_peak_text(std::string& out, SiteLists& sites, std::size_t ti, std::size_t di, const SummaryOptions& opt) {
  const DeviceState& d = sites.analysis().traces[ti]->devices[di];
  const auto rows = peak_groups(sites, ti, di, opt);
  out += fmt::format("  by {}:\n", opt.group_by);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const PeakGroup& g = rows[i];
    out += fmt::format("  #{:<2} {} ({:.1f}% of peak) in {} allocation{} from {} site{} {}\n", i + 1,
                       both_bytes(g.bytes, g.allocated),
                       100.0 * static_cast<double>(g.bytes) / static_cast<double>(d.peak_held), g.count,
                       g.count == 1 ? "" : "s", g.sites, g.sites == 1 ? "" : "s", g.key);
  }
}

void peak_consumers_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt,
                         ShownStacks& shown_stacks) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& in = m.info;
  StackResolver& res = sites.res(ti);
  std::size_t devices_shown = 0;
  for (const auto& d : m.devices) devices_shown += (opt.device < 0 || d.device == opt.device) && d.peak_held > 0;
  for (std::size_t di = 0; di < m.devices.size(); ++di) {
    const auto& d = m.devices[di];
    if (opt.device >= 0 && d.device != opt.device) continue;
    if (d.peak_held <= 0) continue;
    out += fmt::format("Peak memory consumers, device {}: peak {} requested ({} allocated) at {} after start\n",
                       d.device, human_bytes(static_cast<std::uint64_t>(d.peak_held)),
                       human_bytes(static_cast<std::uint64_t>(d.peak_held_allocated)),
                       human_duration_ns(d.peak_held_ts - std::min(d.peak_held_ts, in.mono_ns)));
    if (std::string ph = phases_at(m, d.peak_held_ts); !ph.empty()) out += "  the peak fell in " + ph + "\n";
    if (!opt.group_by.empty()) {
      grouped_peak_text(out, sites, ti, di, opt);
      out += "\n";
      continue;
    }
    auto shown = shown_sites(sites.peak(ti, di), res, opt);
    std::map<std::string, int> same_tag;  // a label shown twice: its operators tell the sites apart
    for (const auto& r : shown) ++same_tag[site_tag(res, r.stack, opt)];
    for (std::size_t i = 0; i < shown.size(); ++i) {
      const auto& r = shown[i];
      std::string tag = site_tag(res, r.stack, opt);
      if (same_tag[tag] > 1)
        if (std::string op = site_operator(res, r.stack); !op.empty()) tag += " via " + op;
      out += fmt::format("  #{:<2} {} ({:.1f}% of peak) in {} allocation{} {}\n", i + 1,
                         both_bytes(r.bytes, r.allocated),
                         100.0 * static_cast<double>(r.bytes) / static_cast<double>(d.peak_held), r.count,
                         r.count == 1 ? "" : "s", tag);
      append_stack(out, res, r.stack, opt);
      shown_stacks.emplace(res.key(r.stack), devices_shown > 1
                                                 ? fmt::format("peak consumer #{} of device {}", i + 1, d.device)
                                                 : fmt::format("peak consumer #{}", i + 1));
    }
    const auto& libs = sites.peak_libraries(ti, di);
    if (libs.size() > 1) {
      out += fmt::format("  by library at the peak:");
      for (const auto& l : libs)
        out += fmt::format(" {} {} ({:.1f}%);", text_safe(l.library), human_bytes(l.bytes),
                           100.0 * static_cast<double>(l.bytes) / static_cast<double>(d.peak_held));
      out.back() = '\n';
    }
    out += "\n";
  }
}

// The lists merged by count; a list is empty exactly when no site has any.
void count_lists_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  StackResolver& res = sites.res(ti);
  auto list = [&](const char* title, const std::vector<SiteRow>& merged, const char* what) {
    if (merged.empty()) return;
    out += fmt::format("{}\n", title);
    auto shown = shown_sites(merged, res, opt);
    for (std::size_t i = 0; i < shown.size(); ++i) {
      out += fmt::format("  #{:<2} {} {} ({} requested, {} allocated in total) {}\n", i + 1, shown[i].count, what,
                         human_bytes(shown[i].bytes), human_bytes(shown[i].allocated),
                         site_tag(res, shown[i].stack, opt));
      // Counts, not bytes: one line per site unless frames are asked for (--depth, --full).
      if (opt.depth_given || opt.full) append_stack(out, res, shown[i].stack, opt);
    }
    out += "\n";
  };
  list("Most allocations (by count)", sites.most_allocations(ti), "allocations");
  list("Most temporary allocations (freed before the thread's next allocation)", sites.temporary(ti),
       "temporary allocations");
}

void leaks_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt,
                const ShownStacks& shown_stacks) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& in = m.info;
  StackResolver& res = sites.res(ti);
  // User memory only: a library's workspaces and handles live as long as the library does,
  // they are not a leak of the line that first used it (--include-library lists them).
  const auto rows = sites.shown_leaks(ti, opt.include_library);
  // The header's totals less the library sites' (the totals leave address space out, the
  // site list does not: subtracting keeps them the same when no site is a library's).
  SiteRow lib;
  for (const auto& r : sites.leaks(ti))
    if (!sites.traits(ti, r.stack).library.empty())
      lib.bytes += r.bytes, lib.allocated += r.allocated, lib.count += r.count;
  if (opt.include_library) lib = SiteRow{};
  SiteRow sum;
  sum.bytes = m.leaked_bytes - std::min(m.leaked_bytes, lib.bytes);
  sum.allocated = m.leaked_allocated_bytes - std::min(m.leaked_allocated_bytes, lib.allocated);
  sum.count = m.leaked_count - std::min(m.leaked_count, lib.count);
  const std::uint64_t lib_bytes = lib.bytes;
  const std::string lib_note = opt.include_library || !lib_bytes
                                   ? ""
                                   : fmt::format("; libraries hold {} more (--include-library lists them)",
                                                 human_bytes(lib_bytes));
  if (!rows.empty()) {
    out += fmt::format("Leaks (live at the end of the trace{}): {} requested ({} allocated) in {} allocations{}\n",
                       in.truncated ? "; truncated trace, so the process may have freed them later" : "",
                       human_bytes(sum.bytes), human_bytes(sum.allocated), sum.count, lib_note);
    auto shown = shown_sites(rows, res, opt);
    for (std::size_t i = 0; i < shown.size(); ++i) {
      auto same = opt.full ? shown_stacks.end() : shown_stacks.find(res.key(shown[i].stack));
      out += fmt::format("  #{:<2} {} in {} allocation{} {}{}\n", i + 1, both_bytes(shown[i].bytes, shown[i].allocated),
                         shown[i].count, shown[i].count == 1 ? "" : "s", site_tag(res, shown[i].stack, opt),
                         same == shown_stacks.end() ? "" : "; stack as " + same->second + " above");
      if (same == shown_stacks.end()) append_stack(out, res, shown[i].stack, opt);
    }
    out += "\n";
  } else if (!m.leaks.empty()) {
    out += fmt::format("Leaks: none of the program's own{}\n\n", lib_note);
  } else {
    out += "Leaks: none (every allocation was freed)\n\n";
  }
}

// One figure (model/fragmentation.h), the one replay and its sweep give: the free bytes in
// segments that hold a live block, at the first moment reserved reached its peak.
void fragmentation_text(std::string& out, const Model& m, const SummaryOptions& opt) {
  const auto& in = m.info;
  for (const auto& d : m.devices) {
    if (opt.device >= 0 && d.device != opt.device) continue;
    if (d.frag_reserved_peak <= 0) continue;
    const std::uint64_t ts = d.frag_reserved_ts;
    out += fmt::format("Fragmentation at peak reserved, device {} ({} after start):\n", d.device,
                       human_duration_ns(ts - std::min(ts, in.mono_ns)));
    out += fmt::format("  {}\n", fragmentation_at_peak(static_cast<std::uint64_t>(
                                                           std::max<std::int64_t>(d.frag_non_releasable, 0)),
                                                       static_cast<std::uint64_t>(d.frag_reserved_peak)));
    out +=
        "  (free bytes inside segments that hold a live block: no larger request and no empty_cache() can use "
        "them)\n\n";
  }
}

void ooms_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  const Model& m = *sites.analysis().traces[ti];
  const auto& in = m.info;
  StackResolver& res = sites.res(ti);
  for (std::size_t oi = 0; oi < m.ooms.size(); ++oi) {
    const auto& o = m.ooms[oi];
    if (opt.device >= 0 && o.rec.device != opt.device) continue;
    const auto& r = o.rec;
    out += fmt::format("OOM on device {} at {} after start: {} request of {} failed\n", r.device,
                       human_duration_ns(r.ts - std::min(r.ts, in.mono_ns)), format::alloc_kind_name(r.kind),
                       human_bytes(r.requested));
    out += fmt::format("  device free {} of {}, limit {}\n", human_bytes(r.device_free), human_bytes(r.device_total),
                       r.limit ? human_bytes(r.limit) : "none");
    out += fmt::format("  pool (recorded): reserved {}, allocated {}, largest free block {}\n", human_bytes(r.reserved),
                       human_bytes(r.allocated), human_bytes(r.largest_free));
    const OomAdvice adv = oom_advice(o);
    out += fmt::format("  held by this process {}; pool reserved but unused {}\n", human_bytes(adv.held),
                       human_bytes(adv.reserved_unused));
    out += fmt::format("  {}\n", adv.fit);
    out += fmt::format("  suggestion: {}\n", adv.suggestion);
    oom_categories_text(out, sites, ti, oi);
    out += "  failing call:\n";
    append_stack(out, res, r.stack, opt);
    if (!o.top_live.empty()) out += "  largest live sites at the OOM:\n";
    for (const auto& s : shown_sites(sites.oom_live(ti, oi), res, opt)) {
      out += fmt::format("    {} in {} allocation{} {}\n", both_bytes(s.bytes, s.allocated), s.count,
                         s.count == 1 ? "" : "s", site_tag(res, s.stack, opt));
      append_stack(out, res, s.stack, opt);
    }
    out += "\n";
  }
  std::uint64_t more = 0;
  for (const auto& d : m.devices) more += d.num_ooms;
  if (more > m.ooms.size()) out += fmt::format("({} more OOMs not detailed)\n\n", more - m.ooms.size());
}

void process_text(std::string& out, SiteLists& sites, std::size_t ti, const SummaryOptions& opt) {
  const Model& m = *sites.analysis().traces[ti];
  header_text(out, m, opt);
  // GPUs first: pinned host memory (a few bytes in most jobs) must not open the summary.
  for (const bool host : {false, true})
    for (const auto& d : m.devices) {
      if ((opt.device >= 0 && d.device != opt.device) || host_only(d) != host) continue;
      torch_table(out, d, opt);
      // A rolling window's pool statistics start at the window: say so where they are read,
      // not only in the header, and point at the run's exact peak.
      if (m.info.window && d.device >= 0)
        out += fmt::format("  (the window only, from {} after start; the whole run's peak: Peak memory consumers)\n",
                           human_duration_ns(
                               m.info.window_start_ts > m.info.mono_ns ? m.info.window_start_ts - m.info.mono_ns : 0));
      out += "\n";
    }
  phases_text(out, m, opt);
  ShownStacks shown_stacks;
  peak_consumers_text(out, sites, ti, opt, shown_stacks);
  categories_text(out, sites, ti, opt);
  count_lists_text(out, sites, ti, opt);
  leaks_text(out, sites, ti, opt, shown_stacks);
  fragmentation_text(out, m, opt);
  ooms_text(out, sites, ti, opt);
}

}  // namespace

std::string summary_text(const Analysis& a, const SummaryOptions& opt) {
  SiteLists sites(a, opt.all_frames);
  return summary_text(a, opt, sites);
}

std::string summary_text(const Analysis& a, const SummaryOptions& opt, SiteLists& sites) {
  if (&sites.analysis() != &a || sites.all_frames() != opt.all_frames)
    throw std::invalid_argument("summary_text: site lists of another analysis or frame view");
  std::string out = ranks_text(a, opt.device);
  for (std::size_t i = 0; i < a.traces.size(); ++i) {
    if (a.traces.size() > 1)
      out += fmt::format("##### process {} of {} (pid {}) #####\n", i + 1, a.traces.size(), a.traces[i]->info.pid);
    process_text(out, sites, i, opt);
  }
  if (a.traces.size() > 1) {
    out += fmt::format("##### merged view of {} processes (aligned by wall clock) #####\n", a.traces.size());
    for (const auto& md : a.merged) {
      if (opt.device >= 0 && md.device != opt.device) continue;
      out += fmt::format(
          "  {}: peak allocated {} (sum of per-process peaks {}), peak reserved {} (sum {}), "
          "peak requested {}\n",
          merged_device_name(a, md), human_bytes(static_cast<std::uint64_t>(md.allocated.peak)),
          human_bytes(static_cast<std::uint64_t>(md.sum_of_peaks_allocated)),
          human_bytes(static_cast<std::uint64_t>(md.reserved.peak)),
          human_bytes(static_cast<std::uint64_t>(md.sum_of_peaks_reserved)),
          human_bytes(static_cast<std::uint64_t>(md.requested.peak)));
    }
    out += "\n";
  }
  return out;
}

namespace {

// "moved: prog.cpp:12 -> 13 (make_weights)" per frame whose line changed, the first three.
void append_moves(std::string& out, const DiffRow& r) {
  constexpr std::size_t kShown = 3;
  for (std::size_t i = 0; i < r.moved.size() && i < kShown; ++i) {
    const auto& mv = r.moved[i];
    const auto& f = r.frames[mv.frame];
    out += fmt::format("        moved: {}:{} -> {} ({})\n", text_safe(base_name(f.file)), mv.line_a, mv.line_b,
                       text_safe(f.function.empty() ? std::string("?") : f.function));
  }
  if (r.moved.size() > kShown) out += fmt::format("        moved: {} more frames\n", r.moved.size() - kShown);
}

}  // namespace

std::string diff_text(const std::vector<DiffRow>& rows, std::size_t top, const Model& a, const Model& b) {
  std::string out = fmt::format("gpuheap diff: A = {}\n              B = {}\n", text_safe(a.info.path),
                                text_safe(b.info.path));
  out += "Per-site change (B - A) in peak held and total requested bytes, largest first\n";
  const std::size_t changed = static_cast<std::size_t>(
      std::count_if(rows.begin(), rows.end(), [](const DiffRow& r) { return r.changed(); }));
  const std::size_t moved_unchanged = rows.size() - changed;  // last in rows
  if (changed == 0) out += "  no differences\n";
  for (std::size_t i = 0; i < changed && i < top; ++i) {
    const auto& r = rows[i];
    out += fmt::format("  #{:<2} peak {} ({} -> {}), total {} ({} -> {})\n", i + 1, signed_bytes(r.d_peak()),
                       human_bytes(static_cast<std::uint64_t>(r.peak_a)),
                       human_bytes(static_cast<std::uint64_t>(r.peak_b)), signed_bytes(r.d_total()),
                       human_bytes(static_cast<std::uint64_t>(r.total_a)),
                       human_bytes(static_cast<std::uint64_t>(r.total_b)));
    // Named and cut as summary's default view names and cuts its sites (labels.h).
    if (r.frames.empty()) {
      out += fmt::format("        {}\n", text_safe(r.key));
    } else {
      out += fmt::format("        [{}] {}\n", text_safe(library_label(r.frames)), site_label_text(r.frames, true));
      append_moves(out, r);
      append_frames(out, r.frames, SummaryOptions{});
    }
  }
  if (moved_unchanged)
    out += fmt::format("  {} more site(s) moved (same functions and files, other lines) with no change in bytes\n",
                       moved_unchanged);
  return out;
}

}  // namespace gpuheap
