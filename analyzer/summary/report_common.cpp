#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "analyzer/base/units.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"
#include "analyzer/symbolize/pyframes.h"

namespace gpuheap {

StackResolver::StackResolver(const Model& m, bool all_frames) : m_(m), all_frames_(all_frames) {
  for (const auto& mod : m.modules) {
    format::ModuleRecord r;
    r.base = mod.base, r.lo = mod.lo, r.hi = mod.hi, r.path = mod.path, r.build_id = mod.build_id;
    sym_.add_module(r);
  }
  sym_.use_stored(&m.symbols);
}

const std::vector<Frame>& StackResolver::frames(std::uint32_t stack) {
  auto it = frames_.find(stack);
  if (it != frames_.end()) return it->second;
  std::vector<Frame> f;
  auto s = m_.stacks.find(stack);
  if (s != m_.stacks.end() && !s->second.empty()) {
    // Native frames first (innermost first), then the Python frames the preload found in
    // place of the interpreter's (format/trace.h kPyFrameTag).
    const auto& ips = s->second;
    std::size_t npy = 0;
    while (npy < ips.size() && format::is_py_frame(ips[ips.size() - 1 - npy])) ++npy;
    if (npy == 0) {
      f = sym_.symbolize(ips, all_frames_);
    } else {
      std::vector<std::uint64_t> native(ips.begin(), ips.end() - static_cast<std::ptrdiff_t>(npy));
      if (!native.empty()) f = sym_.symbolize(native, all_frames_);
      while (!all_frames_ && !f.empty() && is_interpreter_frame(f.back())) f.pop_back();
      for (std::size_t i = ips.size() - npy; i < ips.size(); ++i) f.push_back(py_frame_of(m_.py_codes, ips[i]));
    }
  }
  return frames_.emplace(stack, std::move(f)).first->second;
}

const std::string& StackResolver::key(std::uint32_t stack) {
  auto it = keys_.find(stack);
  if (it != keys_.end()) return it->second;
  std::string k;
  auto out = std::back_inserter(k);  // straight into k: no string per frame
  const auto& fr = frames(stack);
  if (fr.empty()) k = stack == 0 ? "<no stack>" : fmt::format("<unknown stack {}>", stack);
  for (const auto& f : fr) {
    if (!f.function.empty() || !f.file.empty())
      fmt::format_to(out, FMT_COMPILE("{}|{}|{};"), f.function, f.file, f.line);
    else if (!f.module.empty()) fmt::format_to(out, FMT_COMPILE("{}+{:#x};"), base_name(f.module), f.offset);
    else fmt::format_to(out, FMT_COMPILE("{:#x};"), f.ip);  // no module: only the raw address identifies it
  }
  return keys_.emplace(stack, std::move(k)).first->second;
}

const std::string& StackResolver::library(std::uint32_t stack) {
  auto it = libraries_.find(stack);
  if (it != libraries_.end()) return it->second;
  return libraries_.emplace(stack, library_label(frames(stack))).first->second;
}

std::vector<SiteRow> merge_sites(const std::vector<SiteRow>& rows, StackResolver& res, bool by_count) {
  // Keys by view: the resolver's keys stay where they are (unordered_map nodes) while it lives.
  std::unordered_map<std::string_view, std::size_t> idx;
  std::vector<SiteRow> out;
  for (const auto& r : rows) {
    const std::string_view k = res.key(r.stack);
    auto [it, fresh] = idx.try_emplace(k, out.size());
    if (fresh) {
      out.push_back(r);
    } else {
      out[it->second].bytes += r.bytes;
      out[it->second].count += r.count;
      out[it->second].allocated += r.allocated;
    }
  }
  std::sort(out.begin(), out.end(), [by_count](const SiteRow& a, const SiteRow& b) {
    if (by_count && a.count != b.count) return a.count > b.count;
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.count != b.count) return a.count > b.count;
    return a.stack < b.stack;
  });
  return out;
}

namespace {
bool library_matches(const std::string& lib, const SummaryOptions& opt) {
  if (opt.library.empty()) return true;
  return lib.size() == opt.library.size() &&
         std::equal(lib.begin(), lib.end(), opt.library.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         });
}
}  // namespace

std::vector<SiteRow> shown_sites(const std::vector<SiteRow>& merged, StackResolver& res, const SummaryOptions& opt) {
  std::vector<SiteRow> out;
  for (const auto& r : merged) {
    if (!opt.full && out.size() >= opt.top) break;
    if (opt.library.empty() || library_matches(res.library(r.stack), opt)) out.push_back(r);
  }
  return out;
}

std::vector<LibraryRow> peak_by_library(const std::vector<SiteRow>& sites, StackResolver& res) {
  std::vector<LibraryRow> rows;
  for (const auto& s : sites) {
    const std::string& lib = res.library(s.stack);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const LibraryRow& r) { return r.library == lib; });
    if (it == rows.end()) it = rows.insert(rows.end(), LibraryRow{lib, 0, 0});
    it->bytes += s.bytes;
    it->count += s.count;
  }
  std::sort(rows.begin(), rows.end(), [](const LibraryRow& a, const LibraryRow& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.library < b.library;
  });
  return rows;
}

struct SiteLists::Lists {
  std::vector<std::optional<std::vector<SiteRow>>> peak, oom;     // per device, per OOM
  std::vector<std::optional<std::vector<LibraryRow>>> libraries;  // per device
  std::optional<std::vector<SiteRow>> by_count, temporary, leaks;
  std::unordered_map<std::uint32_t, StackTraits> traits;
  std::optional<CategoryReport> categories;
  bool category_timelines = false;  // categories has its timelines
  bool category_finals = false;     // categories has its finals (where decided_anything())
};

SiteLists::SiteLists(const Analysis& a, bool all_frames) : a_(a), all_frames_(all_frames) {
  for (const auto& m : a.traces) {
    res_.push_back(std::make_unique<StackResolver>(*m, all_frames));
    lists_.push_back(std::make_unique<Lists>());
    lists_.back()->peak.resize(m->devices.size());
    lists_.back()->libraries.resize(m->devices.size());
    lists_.back()->oom.resize(m->ooms.size());
  }
}
SiteLists::~SiteLists() = default;

SiteLists::Lists& SiteLists::lists(std::size_t trace) { return *lists_.at(trace); }

const std::vector<SiteRow>& SiteLists::peak(std::size_t trace, std::size_t device) {
  auto& slot = lists(trace).peak.at(device);
  if (!slot) {
    std::vector<SiteRow> rows;
    for (const auto& s : a_.traces[trace]->devices[device].peak_consumers)
      rows.push_back({s.stack, s.bytes, s.count, s.allocated});
    slot = merge_sites(rows, res(trace));
  }
  return *slot;
}

const std::vector<LibraryRow>& SiteLists::peak_libraries(std::size_t trace, std::size_t device) {
  auto& slot = lists(trace).libraries.at(device);
  if (!slot) slot = peak_by_library(peak(trace, device), res(trace));
  return *slot;
}

const std::vector<SiteRow>& SiteLists::most_allocations(std::size_t trace) {
  auto& slot = lists(trace).by_count;
  if (!slot) {
    const Model& m = *a_.traces[trace];
    std::vector<SiteRow> rows;
    for (std::uint32_t id = 0; id < m.sites.size(); ++id)
      if (m.sites[id].allocs)
        rows.push_back({id, m.sites[id].alloc_bytes, m.sites[id].allocs, m.sites[id].alloc_allocated});
    slot = merge_sites(rows, res(trace), true);
  }
  return *slot;
}

const std::vector<SiteRow>& SiteLists::temporary(std::size_t trace) {
  auto& slot = lists(trace).temporary;
  if (!slot) {
    const Model& m = *a_.traces[trace];
    std::vector<SiteRow> rows;
    for (std::uint32_t id = 0; id < m.sites.size(); ++id) {
      const auto& s = m.sites[id];
      if (s.temporaries) rows.push_back({id, s.temporary_bytes, s.temporaries, s.temporary_allocated});
    }
    slot = merge_sites(rows, res(trace), true);
  }
  return *slot;
}

const std::vector<SiteRow>& SiteLists::leaks(std::size_t trace) {
  auto& slot = lists(trace).leaks;
  if (!slot) {
    std::vector<SiteRow> rows;
    for (const auto& l : a_.traces[trace]->leaks) rows.push_back({l.stack, l.bytes, l.count, l.allocated});
    slot = merge_sites(rows, res(trace));
  }
  return *slot;
}

const StackTraits& SiteLists::traits(std::size_t trace, std::uint32_t stack) {
  auto& t = lists(trace).traits;
  auto it = t.find(stack);
  if (it != t.end()) return it->second;
  const auto& frames = res(trace).frames(stack);
  std::vector<FrameRef> refs;
  refs.reserve(frames.size());
  for (const auto& f : frames) refs.push_back({f.function, f.file, f.module, f.line, f.module == "python"});
  return t.emplace(stack, stack_traits(refs)).first->second;
}

const CategoryReport& SiteLists::categories(std::size_t trace, bool timelines) {
  auto& l = lists(trace);
  if (!l.categories || (timelines && !l.category_timelines)) {
    l.categories = categorize(
        *a_.traces.at(trace), [&](std::uint32_t stack) -> const StackTraits& { return traits(trace, stack); },
        timelines ? CategoryTimelines::read : CategoryTimelines::none);
    l.category_timelines = timelines, l.category_finals = false;
  }
  return *l.categories;
}

const std::vector<MergedCategoryTimeline>& SiteLists::merged_categories() {
  if (merged_categories_) return *merged_categories_;
  std::vector<CategoryReport*> reps;
  for (std::size_t ti = 0; ti < a_.traces.size(); ++ti) {
    auto& l = lists(ti);
    if (!l.categories || !l.category_finals) {
      l.categories = categorize(
          *a_.traces[ti], [&](std::uint32_t stack) -> const StackTraits& { return traits(ti, stack); },
          CategoryTimelines::finals);
      l.category_timelines = false, l.category_finals = true;
    }
    reps.push_back(&*l.categories);
  }
  merged_categories_ = category_timelines(a_, reps);
  for (std::size_t ti = 0; ti < a_.traces.size(); ++ti) {
    auto& l = lists(ti);
    l.category_timelines = true, l.category_finals = false;
    l.categories->finals = {};  // one byte per allocation, needed no more
  }
  return *merged_categories_;
}

std::vector<SiteRow> SiteLists::shown_leaks(std::size_t trace, bool include_library) {
  std::vector<SiteRow> rows;
  for (const auto& r : leaks(trace))
    if (include_library || traits(trace, r.stack).library.empty()) rows.push_back(r);
  return rows;
}

const std::vector<SiteRow>& SiteLists::oom_live(std::size_t trace, std::size_t oom) {
  auto& slot = lists(trace).oom.at(oom);
  if (!slot) {
    std::vector<SiteRow> rows;
    for (const auto& s : a_.traces[trace]->ooms[oom].top_live) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
    slot = merge_sites(rows, res(trace));
  }
  return *slot;
}

nlohmann::json stack_json(const std::vector<Frame>& frames) {
  auto arr = nlohmann::json::array();
  for (const auto& f : frames) {
    nlohmann::json j;
    j["function"] = f.function;
    j["file"] = f.file;
    j["line"] = f.line;
    j["module"] = f.module;
    if (f.module != "python") {  // a Python frame has no address
      j["ip"] = fmt::format("{:#x}", f.ip);
      if (!f.module.empty()) j["offset"] = f.offset;
    }
    if (f.inlined) j["inlined"] = true;
    if (f.hidden) j["hidden"] = true;
    arr.push_back(std::move(j));
  }
  return arr;
}

namespace {

// One run's sites merged by key, in key order.
struct DiffSide {
  std::string_view key;                        // the resolver's
  const std::vector<Frame>* frames = nullptr;  // the resolver's: copied only into the rows shown
  std::int64_t peak = 0, total = 0, count = 0;
};

// `res` (of `m`) must outlive the result.
std::vector<DiffSide> diff_side(const Model& m, StackResolver& res) {
  std::map<std::string_view, DiffSide> by_key;
  for (std::uint32_t id = 0; id < m.sites.size(); ++id) {
    const auto& s = m.sites[id];
    if (s.allocs == 0) continue;
    const auto& k = res.key(id);
    auto& r = by_key[k];
    if (!r.frames) r.key = k, r.frames = &res.frames(id);
    // Sites that merge under one key: peaks may not coincide, so the sum is an upper bound.
    r.peak += s.max_live_bytes;
    r.total += static_cast<std::int64_t>(s.alloc_bytes);
    r.count += static_cast<std::int64_t>(s.allocs);
  }
  std::vector<DiffSide> out;
  out.reserve(by_key.size());
  for (auto& [k, r] : by_key) out.push_back(r);
  return out;
}

// The pairs of sites of A and B: those without frames (no stack, unknown stack) by their
// key, the others by site_match.h.
std::vector<SitePair> pair_sides(const std::vector<DiffSide>& a, const std::vector<DiffSide>& b) {
  std::vector<SitePair> out;
  std::map<std::string, SitePair> bare;
  std::vector<const std::vector<Frame>*> fa, fb;
  std::vector<long> ia, ib;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].frames->empty()) bare[std::string(a[i].key)].a = static_cast<long>(i);
    else fa.push_back(a[i].frames), ia.push_back(static_cast<long>(i));
  }
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b[i].frames->empty()) bare[std::string(b[i].key)].b = static_cast<long>(i);
    else fb.push_back(b[i].frames), ib.push_back(static_cast<long>(i));
  }
  auto matched = match_sites(fa, fb);
  out.reserve(bare.size() + matched.size());
  for (auto& [k, p] : bare) out.push_back(p);
  for (auto p : matched)
    out.push_back({p.a < 0 ? -1 : ia[static_cast<std::size_t>(p.a)], p.b < 0 ? -1 : ib[static_cast<std::size_t>(p.b)]});
  return out;
}

}  // namespace

std::vector<DiffRow> diff_sites(const Model& a, const Model& b, bool all_frames) {
  StackResolver ra(a, all_frames), rb(b, all_frames);
  return diff_sites(a, b, ra, rb);
}

std::vector<DiffRow> diff_sites(const Model& a, const Model& b, StackResolver& ra, StackResolver& rb) {
  const auto sa = diff_side(a, ra), sb = diff_side(b, rb);
  std::vector<DiffRow> out;
  for (auto p : pair_sides(sa, sb)) {
    DiffRow r;
    const DiffSide* x = p.a >= 0 ? &sa[static_cast<std::size_t>(p.a)] : nullptr;
    const DiffSide* y = p.b >= 0 ? &sb[static_cast<std::size_t>(p.b)] : nullptr;
    if (x) r.peak_a = x->peak, r.total_a = x->total, r.count_a = x->count;
    if (y) r.peak_b = y->peak, r.total_b = y->total, r.count_b = y->count;
    if (x && y) r.moved = line_moves(*x->frames, *y->frames);
    if (!r.changed() && r.moved.empty()) continue;  // the same site, the same bytes
    const DiffSide* named = x ? x : y;
    r.key = named->key, r.frames = *named->frames;
    if (x && y) r.key_b = y->key;
    out.push_back(std::move(r));
  }
  auto mag = [](std::int64_t v) { return v < 0 ? -v : v; };
  std::sort(out.begin(), out.end(), [&](const DiffRow& x, const DiffRow& y) {
    if (x.changed() != y.changed()) return x.changed();
    if (mag(x.d_peak()) != mag(y.d_peak())) return mag(x.d_peak()) > mag(y.d_peak());
    if (mag(x.d_total()) != mag(y.d_total())) return mag(x.d_total()) > mag(y.d_total());
    if (x.key != y.key) return x.key < y.key;
    return x.key_b < y.key_b;
  });
  return out;
}

bool passes_through(const Frame& f) { return passthrough_kind(f) != Passthrough::none; }

// The preload's `held` is its budget (pool segments + pass-through kinds); here the replayed
// holdings stand in for it. Rule and words: format/rules.h, shared with preload/core/oom.cpp.
OomAdvice oom_advice(const OomInfo& o) {
  const format::OomFacts f = format::oom_facts(o.rec, o.model_held);
  const format::OomDiagnosis d = format::diagnose_oom(f);
  format::OomText text;
  format::oom_text(f, d, &text);
  OomAdvice a;
  a.held = f.held;
  a.reserved_unused = f.cached_unused;
  a.fits_without_fragmentation = d.fits_without_fragmentation;
  a.cause = format::oom_cause_name(d.cause);
  a.fit = text.fit;
  a.suggestion = text.suggestion;
  return a;
}

}  // namespace gpuheap
