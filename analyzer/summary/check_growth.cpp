// `check --baseline`: which sites grew over the baseline's. A failing gate names them, paired
// with the baseline's sites as `diff` pairs sites (site_match.h), instead of the largest site,
// which after a small regression is usually the unchanged weights.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"
#include "analyzer/summary/site_match.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap {

namespace {

struct GrowSite {
  std::vector<Frame> frames;
  std::int64_t bytes = 0;
};

std::string key_of(const std::vector<Frame>& fr) {
  std::string k;
  for (const auto& f : fr) k += fmt::format("{}|{}|{}|{}+{:#x};", f.function, f.file, f.line, f.module, f.offset);
  return k;
}

// A SITE's stack (docs/summary-json.md) as frames; the frames summary hid are left out unless
// `all_frames`, as the trace's own stacks are.
std::vector<Frame> frames_of(const nlohmann::json& stack, bool all_frames) {
  std::vector<Frame> out;
  for (const auto& j : stack) {
    if (!all_frames && j.value("hidden", false)) continue;
    Frame f;
    f.function = j.value("function", ""), f.file = j.value("file", ""), f.line = j.value("line", 0);
    f.module = j.value("module", ""), f.offset = j.value("offset", std::uint64_t{0});
    out.push_back(std::move(f));
  }
  return out;
}

// The baseline's sites of one list ("peak_consumers" of `device`, or "leaks" for device < 0),
// merged over its processes. `complete`: the list holds every site (they add up to the
// device's peak_held or to leaked_bytes, and no stack was cut with --depth); otherwise a
// site missing from it may have been cut, and its growth is not known.
std::map<std::string, GrowSite> baseline_sites(const nlohmann::json& doc, int device, const std::string& host,
                                               bool all_frames, bool& complete) {
  std::map<std::string, GrowSite> out;
  complete = true;
  std::vector<const nlohmann::json*> docs;
  auto host_of = [](const nlohmann::json& p) {
    const auto t = p.find("trace");
    return t != p.end() && t->is_object() ? t->value("host", std::string()) : std::string();
  };
  if (doc.contains("processes")) {
    for (const auto& p : doc["processes"])
      if (device < 0 || host.empty() || host_of(p) == host) docs.push_back(&p);
  } else {
    docs.push_back(&doc);
  }
  for (const auto* d : docs) {
    std::int64_t listed = 0, total = -1;
    if (device < 0) {
      total = d->value("leaked_bytes", std::int64_t{-1});
    } else {
      for (const auto& dev : d->value("devices", nlohmann::json::array()))
        if (dev.value("device", -2) == device && dev.contains("peak_held"))
          total = dev["peak_held"].value("bytes", std::int64_t{-1});
    }
    for (const auto& s : d->value(device < 0 ? "leaks" : "peak_consumers", nlohmann::json::array())) {
      if (device >= 0 && s.value("device", -2) != device) continue;
      if (s.contains("frames_hidden")) complete = false;
      auto fr = frames_of(s.value("stack", nlohmann::json::array()), all_frames);
      auto& site = out[key_of(fr)];
      site.frames = std::move(fr);
      site.bytes += s.value("bytes", std::int64_t{0});
      listed += s.value("bytes", std::int64_t{0});
    }
    if (listed != total) complete = false;
  }
  return out;
}

// This run's sites of the same list, merged over its traces (of `host` at a device's peak).
std::map<std::string, GrowSite> current_sites(const Analysis& a, int device, const std::string& host, bool all_frames) {
  std::map<std::string, GrowSite> out;
  for (const auto& t : a.traces) {
    if (device >= 0 && !host.empty() && t->info.hostname != host) continue;
    std::vector<SiteRow> rows;
    if (device < 0) {
      for (const auto& l : t->leaks) rows.push_back({l.stack, l.bytes, l.count, l.allocated});
    } else {
      for (const auto& d : t->devices)
        if (d.device == device)
          for (const auto& s : d.peak_consumers) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
    }
    if (rows.empty()) continue;
    StackResolver res(*t, all_frames);
    for (const auto& r : merge_sites(rows, res)) {
      const auto& fr = res.frames(r.stack);
      auto& site = out[key_of(fr)];
      site.frames = fr;
      site.bytes += static_cast<std::int64_t>(r.bytes);
    }
  }
  return out;
}

struct Growth {
  const GrowSite* now = nullptr;
  std::int64_t before = 0;
  bool known = true, moved = false, is_new = false;
  std::int64_t delta() const { return now->bytes - before; }
};

std::string growth_text(const Growth& g) {
  const auto& fr = g.now->frames;
  const std::string at = fr.empty() ? std::string("<no stack>")
                                    : fmt::format("{} [{}]", site_label_text(fr, true), text_safe(library_label(fr)));
  if (!g.known)
    return fmt::format("{} at {} (growth unknown: not among the sites the baseline lists)",
                       human_bytes(static_cast<std::uint64_t>(g.now->bytes)), at);
  return fmt::format("+{} at {} ({} -> {}{})", human_bytes(static_cast<std::uint64_t>(g.delta())), at,
                     human_bytes(static_cast<std::uint64_t>(g.before)),
                     human_bytes(static_cast<std::uint64_t>(g.now->bytes)),
                     g.is_new  ? ", new"
                     : g.moved ? ", moved"
                               : "");
}

}  // namespace

std::string grown_sites(const Analysis& a, const nlohmann::json& baseline, const GrowthGpu& gpu, bool all_frames) {
  bool complete = true;
  const auto base = baseline_sites(baseline, gpu.device, gpu.base_host, all_frames, complete);
  const auto now = current_sites(a, gpu.device, gpu.host, all_frames);
  std::vector<const GrowSite*> bs, ns;
  std::vector<const std::vector<Frame>*> bf, nf;
  for (const auto& [k, s] : base) bs.push_back(&s), bf.push_back(&s.frames);
  for (const auto& [k, s] : now) ns.push_back(&s), nf.push_back(&s.frames);
  std::vector<Growth> grown;
  for (auto p : match_sites(bf, nf)) {
    if (p.b < 0) continue;  // gone: it did not grow
    Growth g;
    g.now = ns[static_cast<std::size_t>(p.b)];
    if (p.a >= 0) {
      const GrowSite* was = bs[static_cast<std::size_t>(p.a)];
      g.before = was->bytes;
      g.moved = !line_moves(was->frames, g.now->frames).empty();
    } else {
      g.known = complete, g.is_new = true;
    }
    if (!g.known || g.delta() > 0) grown.push_back(g);
  }
  // Largest known growth first, then those of unknown growth by their bytes now; then by stack.
  std::sort(grown.begin(), grown.end(), [](const Growth& x, const Growth& y) {
    if (x.known != y.known) return x.known;
    const auto vx = x.known ? x.delta() : x.now->bytes, vy = y.known ? y.delta() : y.now->bytes;
    if (vx != vy) return vx > vy;
    return key_of(x.now->frames) < key_of(y.now->frames);
  });
  if (grown.empty()) return {};
  constexpr std::size_t kShown = 3;
  std::string out = "grew: ";
  for (std::size_t i = 0; i < grown.size() && i < kShown; ++i) out += (i ? "; " : "") + growth_text(grown[i]);
  if (grown.size() > kShown) {
    // How many of the rest are of unknown growth: with a cut baseline they may hold the most.
    const auto unknown = std::count_if(grown.begin() + kShown, grown.end(), [](const Growth& g) { return !g.known; });
    out += fmt::format("; and {} more site(s)", grown.size() - kShown);
    if (unknown) out += fmt::format(", {} of them not among the sites the baseline lists", unknown);
  }
  return out;
}

}  // namespace gpuheap
