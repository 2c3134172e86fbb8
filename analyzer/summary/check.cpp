#include "analyzer/summary/check.h"

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/model/phases.h"
#include "analyzer/summary/ranks.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap {

namespace {

// A summary --json document is a few KiB to a few MiB; anything far larger is not one.
constexpr std::uint64_t kMaxBaselineBytes = std::uint64_t{256} << 20;

std::string bytes_both(std::int64_t v) {
  return fmt::format("{} ({} B)", human_bytes(static_cast<std::uint64_t>(v < 0 ? 0 : v)), v);
}

// The largest of `rows` (non-empty) after merging equal stacks, as one line for a message.
std::string largest_site(const Model& m, const std::vector<SiteRow>& rows, bool all_frames) {
  StackResolver res(m, all_frames);
  auto merged = merge_sites(rows, res);
  const auto& fr = res.frames(merged[0].stack);
  // Named by its label (labels.h): the first frame below the allocator's own, which says
  // which tensor it is; the allocator's frames are the same for every site. Template
  // arguments elided, as in summary's default view: the message is one line.
  return fmt::format("{} in {} allocations at {} [{}]", human_bytes(merged[0].bytes), merged[0].count,
                     site_label_text(fr, true), text_safe(library_label(fr)));
}

// The site most responsible for the peak of `device` (of `host`; "": any): the top peak
// consumer in the process with the largest peak on it.
std::string top_site(const Analysis& a, int device, const std::string& host, bool all_frames) {
  const Model* best = nullptr;
  const DeviceState* bd = nullptr;
  for (const auto& t : a.traces)
    for (const auto& d : t->devices)
      if (host.empty() || t->info.hostname == host)
        if (d.device == device && (!bd || d.peak_held > bd->peak_held)) best = t.get(), bd = &d;
  if (!bd || bd->peak_consumers.empty()) return "no live allocation recorded";
  std::vector<SiteRow> rows;
  for (const auto& s : bd->peak_consumers) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
  return largest_site(*best, rows, all_frames);
}

std::string top_leak(const Analysis& a, bool all_frames) {
  const Model* best = nullptr;
  for (const auto& t : a.traces)
    if (!t->leaks.empty() && (!best || t->leaks[0].bytes > best->leaks[0].bytes)) best = t.get();
  if (!best) return "no leak";
  std::vector<SiteRow> rows;
  for (const auto& l : best->leaks) rows.push_back({l.stack, l.bytes, l.count, l.allocated});
  return largest_site(*best, rows, all_frames);
}

}  // namespace

CheckMeasures measure(const Analysis& a) {
  CheckMeasures m;
  auto take = [](std::int64_t v, int dev, std::int64_t& best, int& best_dev) {
    if (v <= best) return false;
    best = v, best_dev = dev;
    return true;
  };
  if (a.traces.size() > 1) {
    // Per GPU: a.merged holds one entry per (host, device).
    for (const auto& md : a.merged) {
      if (take(md.requested.peak, md.device, m.requested, m.requested_dev))
        m.requested_host = md.host, m.requested_at = merged_device_name(a, md);
      if (take(md.allocated.peak, md.device, m.allocated, m.allocated_dev))
        m.allocated_host = md.host, m.allocated_at = merged_device_name(a, md);
      if (take(md.reserved.peak, md.device, m.reserved, m.reserved_dev))
        m.reserved_host = md.host, m.reserved_at = merged_device_name(a, md);
    }
  } else {
    for (const auto& d : a.traces[0]->devices) {
      take(d.stat[kRequestedBytes][0].peak, d.device, m.requested, m.requested_dev);
      take(d.stat[kAllocatedBytes][0].peak, d.device, m.allocated, m.allocated_dev);
      take(d.stat[kReservedBytes][0].peak, d.device, m.reserved, m.reserved_dev);
    }
  }
  for (const auto& t : a.traces) m.leaked += static_cast<std::int64_t>(t->leaked_bytes);
  return m;
}

CheckMeasures measure_baseline(const nlohmann::json& doc) {
  // /1 documents count leaked_bytes in block bytes (a little above the requested bytes /2
  // counts); their peaks mean the same. Both are accepted as baselines.
  const std::string schema = doc.is_object() ? doc.value("schema", "") : "";
  if (schema != "gpuheap.summary/2" && schema != "gpuheap.summary/1")
    throw InputError("baseline is not a gpuheap summary --json document (schema gpuheap.summary/2 or /1)");
  CheckMeasures m;
  const nlohmann::json* devs = nullptr;
  const nlohmann::json* leaked = nullptr;
  if (doc.contains("merged")) {
    devs = &doc["merged"]["devices"];
    leaked = &doc["merged"]["leaked_bytes"];
  } else {
    devs = &doc["devices"];
    leaked = doc.contains("leaked_bytes") ? &doc["leaked_bytes"] : nullptr;
  }
  try {
    if (!devs->is_array()) throw InputError("baseline: 'devices' is not an array");
    for (const auto& d : *devs) {
      int dev = d.at("device").get<int>();
      const std::string host = d.value("host", std::string());  // a merged device: a GPU of one host
      auto pk = [&](const char* k) { return d.at(k).at("peak").get<std::int64_t>(); };
      if (pk("requested_bytes") > m.requested)
        m.requested = pk("requested_bytes"), m.requested_dev = dev, m.requested_host = host;
      if (pk("allocated_bytes") > m.allocated)
        m.allocated = pk("allocated_bytes"), m.allocated_dev = dev, m.allocated_host = host;
      if (pk("reserved_bytes") > m.reserved)
        m.reserved = pk("reserved_bytes"), m.reserved_dev = dev, m.reserved_host = host;
    }
    if (leaked) m.leaked = leaked->get<std::int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("baseline: malformed summary document: {}", e.what()));
  }
  return m;
}

std::string incompleteness(const TraceInfo& in) {
  if (!in.has_end && in.cut_mid_record) return "no end record, and the file is cut mid-record";
  if (!in.has_end) return "no end record: the process was killed or is still running";
  return "the file is cut mid-record";
}

CheckResult run_check(const Analysis& a, const CheckOptions& opt) {
  CheckResult r;
  bool incomplete = false;
  for (const auto& t : a.traces) {
    if (!t->info.truncated) continue;
    incomplete = true;
    if (opt.allow_truncated)
      r.notes.push_back(fmt::format("{} is incomplete ({}); checking what it holds (--allow-truncated)",
                                    text_safe(t->info.path), incompleteness(t->info)));
    else
      r.violations.push_back(
          fmt::format("{} is incomplete ({}), so its numbers cannot be trusted; "
                      "pass --allow-truncated to check what it holds",
                      text_safe(t->info.path), incompleteness(t->info)));
  }
  auto cur = measure(a);
  struct Item {
    const char* name;
    const char* flag;
    std::int64_t value;
    int dev;
    std::optional<std::uint64_t> limit;
    bool leaked;
    const std::string& host;  // of the GPU at the peak ("" with one trace)
    const std::string& at;    // its name in messages ("" = "device N")
  };
  const std::string none;
  Item items[] = {
      {"peak requested bytes", "--max-requested", cur.requested, cur.requested_dev, opt.max_requested, false,
       cur.requested_host, cur.requested_at},
      {"peak allocated bytes", "--max-allocated", cur.allocated, cur.allocated_dev, opt.max_allocated, false,
       cur.allocated_host, cur.allocated_at},
      {"peak reserved bytes", "--max-reserved", cur.reserved, cur.reserved_dev, opt.max_reserved, false,
       cur.reserved_host, cur.reserved_at},
      {"leaked bytes", "--max-leaked", cur.leaked, 0, opt.max_leaked, true, none, none},
  };
  auto site = [&](const Item& it) {
    return it.leaked ? top_leak(a, opt.all_frames) : top_site(a, it.dev, it.host, opt.all_frames);
  };
  auto where = [](const Item& it) {
    if (it.leaked) return std::string();
    return it.at.empty() ? fmt::format(" on device {}", it.dev) : " on " + it.at;
  };
  for (const auto& it : items) {
    if (!it.limit) continue;
    if (it.value > static_cast<std::int64_t>(*it.limit)) {
      r.violations.push_back(fmt::format("{} {}{} exceeds {} {}; top site: {}", it.name, bytes_both(it.value),
                                         where(it), it.flag, bytes_both(static_cast<std::int64_t>(*it.limit)),
                                         site(it)));
    } else {
      r.passed.push_back(fmt::format("{} {}{} within {} {}", it.name, bytes_both(it.value), where(it), it.flag,
                                     bytes_both(static_cast<std::int64_t>(*it.limit))));
    }
  }
  if (opt.max_growth) {
    const auto limit = static_cast<std::int64_t>(*opt.max_growth);
    for (const auto& t : a.traces) {
      auto g = phase_growth(*t, opt.growth_phase);
      if (!g.valid) {
        r.violations.push_back(fmt::format("{}: no growth measured for --max-growth: {}", text_safe(t->info.path),
                                           g.phase.empty() ? std::string("no top-level phase repeats")
                                                           : fmt::format("'{}' has {} instance(s), 2 are needed",
                                                                         text_safe(g.phase), g.instances)));
        continue;
      }
      std::string
          what = fmt::format("growth of live requested bytes over '{}' ({} instances, #{} vs #2) {} on device {}",
                             text_safe(g.phase), g.instances, g.instances, bytes_both(g.growth), g.growth_device);
      if (g.growth > limit) r.violations.push_back(fmt::format("{} exceeds --max-growth {}", what, bytes_both(limit)));
      else r.passed.push_back(fmt::format("{} within --max-growth {}", what, bytes_both(limit)));
    }
  }
  if (!opt.baseline.empty()) {
    // Through the regular-file guard: a FIFO or device named as the baseline must not hang.
    const std::string text = read_regular(opt.baseline, kMaxBaselineBytes, "a baseline");
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("{}: baseline is not valid JSON: {}", opt.baseline, e.what()));
    }
    auto base = measure_baseline(doc);
    std::int64_t bvals[] = {base.requested, base.allocated, base.reserved, base.leaked};
    const std::string* bhosts[] = {&base.requested_host, &base.allocated_host, &base.reserved_host, &none};
    // Name what grew, not what is largest; /1 documents count sites in block bytes, so their
    // sites are not compared with this run's requested bytes.
    std::unique_ptr<SiteLists> cat_sites;
    auto why = [&](const Item& it, const std::string& base_host) {
      std::string grew;
      std::string cat;
      if (doc.value("schema", "") == "gpuheap.summary/2") {
        grew = grown_sites(a, doc, GrowthGpu{it.leaked ? -1 : it.dev, it.host, base_host}, opt.all_frames);
        if (!cat_sites) cat_sites = std::make_unique<SiteLists>(a, opt.all_frames);  // one category pass
        cat = grown_category(*cat_sites, doc, it.leaked ? -1 : it.dev);
      }
      return (grew.empty() ? "top site: " + site(it) : grew) + (cat.empty() ? "" : "; " + cat);
    };
    for (int i = 0; i < 4; ++i) {
      const auto& it = items[i];
      double allowed = static_cast<double>(bvals[i]) * (1.0 + opt.tolerance_pct / 100.0);
      if (static_cast<double>(it.value) > allowed) {
        r.violations.push_back(
            fmt::format("{} {}{} exceeds baseline {} by more than {}% ({:+.1f}%); {}", it.name, bytes_both(it.value),
                        where(it), bytes_both(bvals[i]), opt.tolerance_pct,
                        bvals[i] ? 100.0 * (static_cast<double>(it.value) / static_cast<double>(bvals[i]) - 1) : 100.0,
                        why(it, *bhosts[i])));
      } else {
        r.passed.push_back(fmt::format("{} {} within {}% of baseline {}", it.name, bytes_both(it.value),
                                       opt.tolerance_pct, bytes_both(bvals[i])));
      }
    }
  }
  check_categories(a, opt, r);
  if (incomplete && !opt.allow_truncated) r.passed.clear();
  return r;
}

}  // namespace gpuheap
