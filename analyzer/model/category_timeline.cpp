// category_timelines(): live requested bytes by category on each device's timeline. A third
// read of the trace, once every allocation's final category is known (the second read decides
// it only when the allocation is freed or its phase ends). It replays the requested bytes the
// way Model does for its timeline (the kinds of its torch-style table, sampled at the same
// records) and keeps, for every bucket of Model's final grid, the categories at the moment
// the bucket's requested maximum was reached: the stacked areas the report draws then sum to
// its requested line at every point.
#include <iterator>
#include <map>
#include <unordered_map>

#include "analyzer/base/flat_map.h"
#include "analyzer/model/category_pass.h"
#include "analyzer/trace/reader.h"
#include "format/rules.h"

namespace gpuheap {

namespace {

// The kinds Model's requested series counts (model_events.cpp: table_kind).
bool table_kind(format::AllocKind k) {
  return k == format::AllocKind::device_pooled || k == format::AllocKind::device_passthrough ||
         k == format::AllocKind::pitch;
}

struct Grid {
  std::uint64_t t0 = 0, width = 1;
  struct Bucket {
    bool used = false;
    std::uint64_t total = 0;
    CategoryReport::Live at{}, last{};  // at the bucket's maximum; after its last sample
  };
  std::vector<Bucket> b;
  std::uint64_t cur = ~0ull;  // the bucket of the last sample (its `last` is live_by, kept on leaving)
  std::map<std::uint64_t, std::uint64_t> segments;  // live segments: ptr -> size (Model::on_segment)
};

struct TimelinePass {
  const Model& m;
  const std::vector<Category>& finals;
  std::vector<Grid> grids;  // index-aligned with m.devices; empty b: no timeline
  std::vector<CategoryReport::Live> live_by;
  std::vector<std::uint64_t> live_total;
  std::unordered_map<int, std::size_t> dev_index;
  struct Entry {
    std::uint64_t bytes = 0;
    std::size_t dev = 0;
    Category cat = Category::unknown;
    bool counted = false;  // a table kind: in the requested series
  };
  base::FlatMap<Entry> live;
  std::uint64_t allocs = 0;

  TimelinePass(const Model& model, const std::vector<Category>& f)
      : m(model),
        finals(f),
        grids(model.devices.size()),
        live_by(model.devices.size()),
        live_total(model.devices.size(), 0) {
    for (std::size_t i = 0; i < m.devices.size(); ++i) {
      const auto& tl = m.devices[i].timeline;
      dev_index[m.devices[i].device] = i;
      const auto pts = tl.points();
      if (pts.empty()) continue;
      grids[i].t0 = tl.start(), grids[i].width = tl.bucket_ns();
      grids[i].b.resize(pts.back().t / tl.bucket_ns() + 1);
    }
  }

  std::size_t dev(int device) {
    auto it = dev_index.find(device);
    return it == dev_index.end() ? m.devices.size() : it->second;
  }

  // As Timeline::sample: the bucket of ts keeps its maximum (the first moment that reached it).
  void sample(std::size_t di, std::uint64_t ts) {
    if (di >= grids.size() || grids[di].b.empty()) return;
    auto& g = grids[di];
    const std::uint64_t idx = (ts > g.t0 ? ts - g.t0 : 0) / g.width;
    if (idx >= g.b.size()) return;
    auto& x = g.b[idx];
    if (!x.used || live_total[di] > x.total) x.total = live_total[di], x.at = live_by[di];
    x.used = true, g.cur = idx;
  }
  // Before a change of device di's live bytes at ts: leaving the bucket of its last sample, that
  // bucket's state after its last sample is the live state now.
  void leave(std::size_t di, std::uint64_t ts) {
    auto& g = grids[di];
    if (g.cur >= g.b.size()) return;
    const std::uint64_t idx = (ts > g.t0 ? ts - g.t0 : 0) / g.width;
    if (idx != g.cur) g.b[g.cur].last = live_by[di], g.cur = ~0ull;
  }

  void release(std::uint64_t k, std::uint64_t ts) {
    Entry e;
    if (!live.take(k, &e) || !e.counted) return;
    leave(e.dev, ts);
    live_total[e.dev] -= e.bytes, live_by[e.dev][static_cast<std::size_t>(e.cat)] -= e.bytes;
    sample(e.dev, ts);
  }

  void on_alloc(const format::AllocRecord& a) {
    const std::uint64_t k = format::space_key(a.ptr, a.kind);
    release(k, a.ts);  // a lost free: the old one retires first (as Model does)
    const Category c = allocs < finals.size() ? finals[allocs] : Category::unknown;
    ++allocs;
    const std::size_t di = dev(a.device);
    const bool counted = table_kind(a.kind) && di < grids.size();
    live.get(k) = Entry{a.requested, di, c, counted};
    if (!counted) return;
    leave(di, a.ts);
    live_total[di] += a.requested, live_by[di][static_cast<std::size_t>(c)] += a.requested;
    sample(di, a.ts);
  }

  // Model samples a segment record unless it ignores it: a segment inside one it has, a free
  // of one it never saw.
  void on_segment(const format::SegmentRecord& r, bool is_free) {
    const std::size_t di = dev(r.device);
    if (di >= grids.size()) return;
    auto& segs = grids[di].segments;
    if (is_free) {
      if (!segs.erase(r.ptr)) return;
    } else {
      auto it = segs.upper_bound(r.ptr);
      if (it != segs.begin() && r.ptr - std::prev(it)->first < std::prev(it)->second) return;
      segs[r.ptr] = r.size;
    }
    leave(di, r.ts);
    sample(di, r.ts);
  }

  // Model's points: a bucket it has and this pass did not sample (none, but for a damaged
  // trace) reads the state after the bucket before it.
  void finish(CategoryReport& rep) {
    rep.timelines.assign(m.devices.size(), {});
    for (std::size_t di = 0; di < m.devices.size(); ++di) {
      auto& g = grids[di];
      if (g.b.empty()) continue;
      if (g.cur < g.b.size()) g.b[g.cur].last = live_by[di];
      CategoryReport::Live carry{};
      std::size_t next = 0;
      for (const auto& p : m.devices[di].timeline.points()) {
        const std::size_t idx = static_cast<std::size_t>(p.t / g.width);
        for (; next < idx && next < g.b.size(); ++next)
          if (g.b[next].used) carry = g.b[next].last;
        const bool used = idx < g.b.size() && g.b[idx].used;
        rep.timelines[di].push_back(used ? g.b[idx].at : carry);
      }
    }
  }
};

}  // namespace

void category_timelines(const Model& m, const std::vector<Category>& finals, CategoryReport& rep) {
  TimelinePass p(m, finals);
  TraceReader reader(m.info.path);
  format::Record r;
  while (reader.next(r)) {
    switch (r.type) {
      case format::RecordType::alloc: p.on_alloc(r.alloc); break;
      case format::RecordType::free:
        if (!(r.free.flags & format::kFlagFailed)) p.release(format::space_key(r.free.ptr, r.free.kind), r.free.ts);
        break;
      case format::RecordType::segment_alloc: p.on_segment(r.segment, false); break;
      case format::RecordType::segment_free: p.on_segment(r.segment, true); break;
      default: break;
    }
  }
  p.finish(rep);
}

}  // namespace gpuheap
