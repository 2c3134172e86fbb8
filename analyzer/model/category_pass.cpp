// categorize(): the second read of a trace that gives every allocation its category.
#include "analyzer/model/category_pass.h"

#include <algorithm>
#include <tuple>

#include "analyzer/trace/reader.h"
#include "format/rules.h"

namespace gpuheap {

std::uint64_t CategoryBytes::total() const {
  std::uint64_t t = 0;
  for (auto b : bytes) t += b;
  return t;
}

Category CategoryBytes::dominant() const {
  std::size_t best = static_cast<std::size_t>(Category::unknown);
  for (std::size_t i = 0; i < kNumCategories; ++i)
    if (bytes[i] > bytes[best] || (count[i] && !count[best])) best = i;
  return static_cast<Category>(best);
}

Category CategoryReport::site_category(std::uint32_t stack) const {
  auto it = by_stack.find(stack);
  return it == by_stack.end() ? Category::unknown : it->second.dominant();
}

bool CategoryReport::decided_anything() const {
  if (saw_training) return true;
  for (const auto& [stack, b] : by_stack)
    if (b.total() != b.of(Category::unknown)) return true;
  return false;
}

namespace {

constexpr std::size_t kMaxMarked = 64;  // moments an allocation can be marked live at (the devices' peaks)

struct Pass {
  const Model& m;
  const TraitsFn& traits;
  CategoryReport rep;
  Classifier cls;
  struct Entry {
    std::uint32_t stack = 0;
    std::uint64_t bytes = 0;
    std::uint64_t marks = 0;           // bit i: live at moment i (moments_)
    std::uint64_t ord = 0;             // its alloc record's number, from 0
    Category cat = Category::unknown;  // what live_by_cat counts it as
    int dev = 0;
    bool device = false;  // holds device memory (format::holds_device_memory)
  };
  std::unordered_map<std::uint64_t, Entry> live;
  std::vector<CategoryMoment*> moments;  // bit i of Entry::marks
  std::map<std::tuple<std::size_t, Category, std::uint32_t>, std::pair<std::uint64_t, std::uint64_t>> site_acc;
  CategoryBytes live_by_cat;
  std::uint64_t live_device = 0, allocs = 0;
  std::map<std::uint32_t, bool> autograd;
  std::vector<std::pair<std::uint64_t, std::size_t>> peak_at;  // (alloc record number, device index)
  std::size_t next_oom = 0;
  std::vector<Category>* finals = nullptr;  // by alloc record number, when timelines are asked for
  // Per device with an OOM: the categories as known just before the current step began.
  std::map<int, CategoryMoment> step_start;

  Pass(const Model& model, const TraitsFn& t) : m(model), traits(t) {
    rep.peaks.resize(m.devices.size());
    rep.ooms.resize(m.ooms.size());
    rep.oom_since.resize(m.ooms.size());
    for (const auto& o : m.ooms) {
      auto& mo = step_start[o.rec.device];
      mo.valid = true, mo.device = o.rec.device, mo.ts = m.info.mono_ns;  // before any step: nothing live
    }
    for (std::size_t i = 0; i < m.devices.size(); ++i) {
      if (m.devices[i].peak_alloc) peak_at.push_back({m.devices[i].peak_alloc, i});
      rep.peaks[i].device = m.devices[i].device;
    }
    std::sort(peak_at.begin(), peak_at.end());
    for (const auto& [tid, name] : m.threads) autograd[tid] = is_autograd_thread(name);
    cls.decided = [this](std::uint64_t id, Category c) { recount(id, c); };
    cls.moved = [this](std::uint64_t id, Category c) { recount(id, c); };
  }

  void recount(std::uint64_t id, Category c) {
    auto it = live.find(id);
    if (it == live.end() || it->second.cat == c) return;
    auto& e = it->second;
    if (e.device) {
      live_by_cat.bytes[static_cast<std::size_t>(e.cat)] -= e.bytes;
      live_by_cat.bytes[static_cast<std::size_t>(c)] += e.bytes;
    }
    e.cat = c;
  }

  // A moment: every live device allocation (of `device`, or all with -1) is marked.
  void mark(CategoryMoment& mo, int device, std::uint64_t ts) {
    if (moments.size() >= kMaxMarked) return;
    mo.valid = true, mo.ts = ts, mo.phase = cls.phase(), mo.step = cls.step();
    const std::uint64_t bit = std::uint64_t{1} << moments.size();
    moments.push_back(&mo);
    for (auto& [k, e] : live) {
      (void)k;
      if (e.device && (device < 0 || e.dev == device)) e.marks |= bit;
    }
  }

  // The categories of `device`'s live allocations as known now (provisional where undecided),
  // with their sites when `sites`: an OOM, or the start of a step to compare one with.
  void snapshot(CategoryMoment& mo, int device, std::uint64_t ts, bool sites) {
    mo = CategoryMoment{};
    mo.valid = true, mo.device = device, mo.ts = ts, mo.phase = cls.phase(), mo.step = cls.step();
    std::map<std::pair<Category, std::uint32_t>, std::pair<std::uint64_t, std::uint64_t>> acc;
    for (const auto& [k, e] : live) {
      (void)k;
      if (!e.device || e.dev != device) continue;
      mo.totals.add(e.cat, e.bytes);
      if (!sites) continue;
      auto& a = acc[{e.cat, e.stack}];
      a.first += e.bytes, a.second++;
      if (e.cat == Category::library) mo.libraries[library_of_stack(e.stack)] += e.bytes;
    }
    for (const auto& [key, v] : acc) mo.sites.push_back({key.second, key.first, v.first, v.second});
    sort_sites(mo);
  }
  static void sort_sites(CategoryMoment& mo) {
    std::sort(mo.sites.begin(), mo.sites.end(), [](const auto& a, const auto& b) {
      if (a.cat != b.cat) return a.cat < b.cat;
      if (a.bytes != b.bytes) return a.bytes > b.bytes;
      return a.stack < b.stack;
    });
  }

  void phase_track(std::uint64_t ts) {
    const TrainPhase p = cls.phase();
    if (rep.phases.empty() || rep.phases.back().phase != p || rep.phases.back().step != cls.step()) {
      if (!rep.phases.empty()) rep.phases.back().end = ts;
      rep.phases.push_back({cls.step(), p, ts, ts, 0, {}});
    }
    auto& f = rep.phases.back();
    f.end = ts;
    if (live_device > f.peak) f.peak = live_device, f.at_peak = live_by_cat;
  }

  void on_alloc(const format::AllocRecord& a) {
    const std::uint64_t k = format::space_key(a.ptr, a.kind);
    if (live.count(k)) release(k);  // a lost free: retire the old one first (as Model does)
    ++allocs;
    const StackTraits& t = traits(a.stack);
    auto ag = autograd.find(a.tid);
    Classifier::Alloc ca{k, a.ts, ag != autograd.end() && ag->second, &t};
    const std::uint32_t step_before = cls.step();
    const Category c = cls.on_alloc(ca);
    // A step began: what was live then (the end of the previous step) is what an OOM in it
    // is compared with. Taken after the classifier decided what the last phase left.
    if (cls.step() != step_before)
      for (auto& [dev, mo] : step_start) snapshot(mo, dev, a.ts, false);
    const bool device = format::holds_device_memory(a.kind);
    live[k] = Entry{a.stack, a.requested, 0, allocs - 1, c, a.device, device};
    if (finals) finals->push_back(c);
    if (device) live_device += a.requested, live_by_cat.bytes[static_cast<std::size_t>(c)] += a.requested;
    if (ca.autograd_thread && !cls.backward_caller().empty())
      rep.backward_caller.try_emplace(a.stack, cls.backward_caller());
    while (!peak_at.empty() && peak_at.front().first == allocs) {
      auto i = peak_at.front().second;
      mark(rep.peaks[i], m.devices[i].device, a.ts);
      peak_at.erase(peak_at.begin());
    }
    phase_track(a.ts);
  }

  void account(const Entry& e, Category c) {
    if (finals) (*finals)[e.ord] = c;
    rep.by_stack[e.stack].add(c, e.bytes);
    if (!e.device) return;
    for (std::size_t i = 0; i < moments.size(); ++i) {
      if (!(e.marks >> i & 1)) continue;
      moments[i]->totals.add(c, e.bytes);
      auto& s = site_acc[{i, c, e.stack}];
      s.first += e.bytes, s.second++;
      if (c == Category::library) moments[i]->libraries[library_of_stack(e.stack)] += e.bytes;
    }
  }
  std::string library_of_stack(std::uint32_t stack) { return traits(stack).library; }

  void release(std::uint64_t k) {
    auto it = live.find(k);
    if (it == live.end()) return;
    const Category c = cls.on_free(k);
    const Entry e = it->second;
    if (e.device) live_device -= e.bytes, live_by_cat.bytes[static_cast<std::size_t>(e.cat)] -= e.bytes;
    live.erase(it);
    account(e, c);
  }

  void on_oom(const format::OomRecord& o) {
    if (next_oom < rep.ooms.size()) {
      snapshot(rep.ooms[next_oom], o.device, o.ts, true);
      rep.oom_since[next_oom] = step_start[o.device];
    }
    ++next_oom;
  }

  // No forward, backward or step anywhere (a CUDA C program, a framework without these
  // frames): the lifetime rules have no phase to go by, so what they would call temporary or
  // other is unknown; the stack rules (library, framework_cache, ...) stand.
  static Category without_phases(Category c) {
    return c == Category::temporary || c == Category::other ? Category::unknown : c;
  }
  static void without_phases(CategoryBytes& b) {
    for (auto c : {Category::temporary, Category::other}) {
      const auto i = static_cast<std::size_t>(c), u = static_cast<std::size_t>(Category::unknown);
      b.bytes[u] += b.bytes[i], b.count[u] += b.count[i], b.bytes[i] = 0, b.count[i] = 0;
    }
  }
  void remap_without_phases() {
    for (auto* mo : moments) without_phases(mo->totals);
    for (auto* v : {&rep.ooms, &rep.oom_since})
      for (auto& mo : *v) {
        without_phases(mo.totals);
        std::map<std::pair<Category, std::uint32_t>, std::pair<std::uint64_t, std::uint64_t>> acc;
        for (const auto& st : mo.sites) {
          auto& a = acc[{without_phases(st.cat), st.stack}];
          a.first += st.bytes, a.second += st.count;
        }
        mo.sites.clear();
        for (const auto& [key, v] : acc) mo.sites.push_back({key.second, key.first, v.first, v.second});
        sort_sites(mo);
      }
    for (auto& [k, b] : rep.by_stack) without_phases(b);
    for (auto& [k, b] : rep.leaked_by_stack) without_phases(b);
    if (finals)
      for (auto& c : *finals) c = without_phases(c);
    without_phases(rep.leaked);
    for (auto& [dev, b] : rep.leaked_by_device) without_phases(b);
    decltype(site_acc) merged;
    for (const auto& [key, v] : site_acc) {
      auto& m2 = merged[{std::get<0>(key), without_phases(std::get<1>(key)), std::get<2>(key)}];
      m2.first += v.first, m2.second += v.second;
    }
    site_acc = std::move(merged);
  }

  void finish() {
    cls.finish();
    for (auto& [k, e] : live) {
      const Category c = cls.on_free(k);
      account(e, c);
      rep.leaked_by_stack[e.stack].add(c, e.bytes);
      if (e.device) rep.leaked.add(c, e.bytes), rep.leaked_by_device[e.dev].add(c, e.bytes);
    }
    if (!cls.saw_training()) remap_without_phases();
    for (auto& [key, v] : site_acc) {
      auto& mo = *moments[std::get<0>(key)];
      mo.sites.push_back({std::get<2>(key), std::get<1>(key), v.first, v.second});
    }
    for (auto* mo : moments) sort_sites(*mo);
    rep.steps = cls.step();
    rep.saw_training = cls.saw_training();
  }
};

}  // namespace

CategoryReport categorize(const Model& m, const TraitsFn& traits, CategoryTimelines timelines) {
  Pass p(m, traits);
  std::vector<Category> finals;
  if (timelines != CategoryTimelines::none) p.finals = &finals;
  TraceReader reader(m.info.path);
  format::Record r;
  while (reader.next(r)) {
    switch (r.type) {
      case format::RecordType::alloc: p.on_alloc(r.alloc); break;
      case format::RecordType::free:
        // A failed call freed nothing (Model::on_free).
        if (!(r.free.flags & format::kFlagFailed)) p.release(format::space_key(r.free.ptr, r.free.kind));
        break;
      case format::RecordType::oom: p.on_oom(r.oom); break;
      case format::RecordType::thread: p.autograd[r.thread.tid] = is_autograd_thread(r.thread.name); break;
      default: break;
    }
  }
  p.finish();
  if (timelines == CategoryTimelines::read && p.rep.decided_anything()) category_timelines(m, finals, p.rep);
  if (timelines == CategoryTimelines::finals && p.rep.decided_anything()) p.rep.finals = std::move(finals);
  return std::move(p.rep);
}

}  // namespace gpuheap
