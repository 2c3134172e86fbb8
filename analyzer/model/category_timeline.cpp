// category_timelines(): live requested bytes by category on each device's timeline. A third
// read of the trace, once every allocation's final category is known (the second read decides
// it only when the allocation is freed or its phase ends). It replays the requested bytes the
// way Model does for its timeline (the kinds of its torch-style table, sampled at the same
// records) and keeps, for every bucket of Model's final grid, the categories at the moment
// the bucket's requested maximum was reached: the stacked areas the report draws then sum to
// its requested line at every point.
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "analyzer/base/flat_map.h"
#include "analyzer/model/category_pass.h"
#include "analyzer/model/merge_order.h"
#include "analyzer/trace/reader.h"
#include "format/rules.h"

namespace gpuheap {

namespace {

// The kinds Model's requested series counts (model_events.cpp: table_kind).
bool table_kind(format::AllocKind k) {
  return k == format::AllocKind::device_pooled || k == format::AllocKind::device_passthrough ||
         k == format::AllocKind::pitch;
}

// Live bytes by category on a timeline's grid of buckets, sampled as the timeline was.
struct Grid {
  using Live = CategoryReport::Live;
  std::uint64_t t0 = 0, width = 1;
  struct Bucket {
    bool used = false;
    std::uint64_t total = 0;
    Live at{}, last{};  // at the bucket's maximum; after its last sample
  };
  std::vector<Bucket> b;
  std::uint64_t cur = ~0ull;  // the bucket of the last sample (its `last` is the live state, kept on leaving)
  std::map<std::uint64_t, std::uint64_t> segments;  // live segments: ptr -> size (Model::on_segment)

  // The grid of `tl` (none for an empty timeline).
  void cover(const Timeline& tl) {
    const auto pts = tl.points();
    if (pts.empty()) return;
    t0 = tl.start(), width = tl.bucket_ns();
    b.resize(pts.back().t / tl.bucket_ns() + 1);
  }
  std::uint64_t index(std::uint64_t t) const { return (t > t0 ? t - t0 : 0) / width; }
  // As Timeline::sample: the bucket of t keeps its maximum (the first moment that reached it).
  void sample(std::uint64_t t, std::uint64_t total, const Live& live) {
    const std::uint64_t idx = index(t);
    if (idx >= b.size()) return;
    auto& x = b[idx];
    if (!x.used || total > x.total) x.total = total, x.at = live;
    x.used = true, cur = idx;
  }
  // Before a change of the live bytes at t: leaving the bucket of the last sample, that
  // bucket's state after its last sample is the live state now.
  void leave(std::uint64_t t, const Live& live) {
    if (cur >= b.size()) return;
    if (index(t) != cur) b[cur].last = live, cur = ~0ull;
  }
  // The state at each of the timeline's points (`live`: the state at the end): a bucket it has
  // and this grid did not sample (none, but for a damaged trace) reads the state after the
  // bucket before it.
  std::vector<Live> at_points(const std::vector<Timeline::Point>& pts, const Live& live) {
    std::vector<Live> out;
    if (cur < b.size()) b[cur].last = live;
    Live carry{};
    std::size_t next = 0;
    for (const auto& p : pts) {
      const std::size_t idx = static_cast<std::size_t>(p.t / width);
      for (; next < idx && next < b.size(); ++next)
        if (b[next].used) carry = b[next].last;
      out.push_back(idx < b.size() && b[idx].used ? b[idx].at : carry);
    }
    return out;
  }
};

struct TimelinePass {
  const Model& m;
  const std::vector<Category>& finals;
  std::vector<Grid> grids;  // index-aligned with m.devices; empty b: no timeline
  std::vector<CategoryReport::Live> live_by;
  std::vector<std::uint64_t> live_total;
  std::vector<int> dev_ids;  // m.devices' device numbers: a few, scanned (a hash costs a division)
  struct Entry {
    std::uint64_t bytes = 0;
    std::size_t dev = 0;
    Category cat = Category::unknown;
    bool counted = false;  // a table kind: in the requested series
  };
  base::FlatMap<Entry> live;
  std::uint64_t allocs = 0;

  // Without `grids` it only follows the live bytes by category (the merged timelines' part).
  TimelinePass(const Model& model, const std::vector<Category>& f, bool with_grids = true)
      : m(model),
        finals(f),
        grids(model.devices.size()),
        live_by(model.devices.size()),
        live_total(model.devices.size(), 0) {
    for (std::size_t i = 0; i < m.devices.size(); ++i) {
      const auto& tl = m.devices[i].timeline;
      dev_ids.push_back(m.devices[i].device);
      if (with_grids) grids[i].cover(tl);
    }
  }

  std::size_t dev(int device) {
    return static_cast<std::size_t>(std::find(dev_ids.begin(), dev_ids.end(), device) - dev_ids.begin());
  }

  void sample(std::size_t di, std::uint64_t ts) {
    if (di < grids.size()) grids[di].sample(ts, live_total[di], live_by[di]);
  }
  void leave(std::size_t di, std::uint64_t ts) { grids[di].leave(ts, live_by[di]); }

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
    if (di >= grids.size() || grids[di].b.empty()) return;
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

  // Starts loading the live entry a record will look up (MergeOrder::next's `ahead`).
  void prefetch(const format::Record& r) const {
    if (r.type == format::RecordType::alloc) live.prefetch(format::space_key(r.alloc.ptr, r.alloc.kind));
    else if (r.type == format::RecordType::free) live.prefetch(format::space_key(r.free.ptr, r.free.kind));
  }

  // One record of the trace, in its order.
  void feed(const format::Record& r) {
    switch (r.type) {
      case format::RecordType::alloc: on_alloc(r.alloc); break;
      case format::RecordType::free:
        if (!(r.free.flags & format::kFlagFailed)) release(format::space_key(r.free.ptr, r.free.kind), r.free.ts);
        break;
      case format::RecordType::segment_alloc: on_segment(r.segment, false); break;
      case format::RecordType::segment_free: on_segment(r.segment, true); break;
      default: break;
    }
  }

  void finish(CategoryReport& rep) {
    rep.timelines.assign(m.devices.size(), {});
    for (std::size_t di = 0; di < m.devices.size(); ++di)
      if (!grids[di].b.empty()) rep.timelines[di] = grids[di].at_points(m.devices[di].timeline.points(), live_by[di]);
  }
};

// The merged GPUs' timelines by category (Analysis::merged): the merge's records in its order
// (merge_order.h), each trace's live bytes by category followed by its TimelinePass, and on
// each GPU what an event changed of its trace's live bytes there, as analyze() adds what it
// changed of the trace's totals (analysis.cpp: feed_merged_event), sampled where that samples.
struct MergedPass {
  const Analysis& a;
  std::vector<std::unique_ptr<TimelinePass>> traces;
  std::vector<std::vector<std::pair<int, std::size_t>>> gpu_of;  // per trace: (device, index in a.merged)
  struct Gpu {
    bool on = false;  // some process on it decided something
    std::uint64_t total = 0;
    CategoryReport::Live live{};
    Grid grid;
    std::size_t released = 0;  // how much of released_at_end was replayed
  };
  std::vector<Gpu> gpus;

  MergedPass(const Analysis& an, const std::vector<CategoryReport*>& reps) : a(an), gpu_of(an.traces.size()) {
    for (const auto* r : reps)
      if (r->decided_anything() && r->finals.empty())  // their bytes would be drawn as unknown
        throw std::invalid_argument("category_timelines: a trace's categories have no finals");
    gpus.resize(a.merged.size());
    for (std::size_t g = 0; g < a.merged.size(); ++g) {
      const auto& md = a.merged[g];
      for (std::size_t ti = 0; ti < a.traces.size(); ++ti)
        if (a.traces[ti]->info.hostname == md.host) gpu_of[ti].emplace_back(md.device, g);
      for (auto ti : md.traces) gpus[g].on = gpus[g].on || reps[ti]->decided_anything();
      if (gpus[g].on && md.device >= 0) gpus[g].grid.cover(md.timeline);
      gpus[g].on = gpus[g].on && !gpus[g].grid.b.empty();
    }
    for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
      const bool grids = reps[ti]->decided_anything() && reps[ti]->timelines.empty();
      traces.push_back(std::make_unique<TimelinePass>(*a.traces[ti], reps[ti]->finals, grids));
    }
  }

  // The merged timeline's clock: since the earliest process start.
  std::uint64_t since_start(std::uint64_t bw) const { return bw - std::min(bw, a.merged_start_wall_ns); }

  // An event of trace ti about `device` (merged_event_device).
  void on_event(std::size_t ti, const format::Record& r, int device, std::uint64_t bw) {
    auto& p = *traces[ti];
    const std::size_t di = p.dev(device);
    const CategoryReport::Live before = di < p.live_by.size() ? p.live_by[di] : CategoryReport::Live{};
    p.feed(r);
    auto it = std::find_if(gpu_of[ti].begin(), gpu_of[ti].end(), [&](const auto& x) { return x.first == device; });
    if (it == gpu_of[ti].end() || !gpus[it->second].on) return;
    auto& g = gpus[it->second];
    g.grid.leave(since_start(bw), g.live);
    if (di < p.live_by.size())
      for (std::size_t c = 0; c < kNumCategories; ++c) {  // what changed, wrapping as the totals' sums do
        const std::uint64_t d = p.live_by[di][c] - before[c];
        g.live[c] += d, g.total += d;
      }
    g.grid.sample(since_start(bw), g.total, g.live);
  }

  // The trace's end record: its leftovers leave the GPUs where analyze() took them off
  // (analysis.cpp: release_at_end).
  void on_end(std::size_t ti, std::uint64_t bw) {
    auto& p = *traces[ti];
    for (std::size_t gi = 0; gi < gpus.size(); ++gi) {
      auto& g = gpus[gi];
      const auto& rel = a.merged[gi].released_at_end;
      if (g.released >= rel.size() || rel[g.released] != ti) continue;
      ++g.released;
      if (!g.on) continue;
      const std::size_t di = p.dev(a.merged[gi].device);
      g.grid.leave(since_start(bw), g.live);
      if (di < p.live_by.size())
        for (std::size_t c = 0; c < kNumCategories; ++c) g.live[c] -= p.live_by[di][c], g.total -= p.live_by[di][c];
      g.grid.sample(since_start(bw), g.total, g.live);
    }
  }

  // As TimelinePass::finish, on the merged timeline's points; and checked: a GPU whose
  // entries do not sum to its requested line at every point (a trace that changed since
  // analyze() read it) shows none rather than wrong ones.
  MergedCategoryTimeline finish(std::size_t gi, const std::vector<CategoryReport*>& reps) {
    MergedCategoryTimeline out;
    const auto& md = a.merged[gi];
    for (auto ti : md.traces) {
      if (!reps[ti]->decided_anything()) ++out.undecided;
      else out.saw_training = out.saw_training || reps[ti]->saw_training;
    }
    auto& g = gpus[gi];
    if (!g.on) return out;
    const auto pts = md.timeline.points();
    out.at = g.grid.at_points(pts, g.live);
    for (std::size_t k = 0; k < out.at.size(); ++k) {
      const auto& at = out.at[k];
      const auto& p = pts[k];
      std::uint64_t sum = 0;
      for (auto v : at) sum += v;
      if (sum != static_cast<std::uint64_t>(p.requested)) {
        spdlog::warn(
            "device {} of host {}: the bytes by category do not add up to the merged timeline ({} and {}): "
            "its categories are left out (did a trace change since it was read?)",
            md.device, md.host, sum, p.requested);
        out.at.clear();
        return out;
      }
    }
    return out;
  }
};

}  // namespace

std::vector<MergedCategoryTimeline> category_timelines(const Analysis& a, const std::vector<CategoryReport*>& reps) {
  MergedPass p(a, reps);
  if (std::none_of(reps.begin(), reps.end(), [](const CategoryReport* r) { return r->decided_anything(); })) {
    std::vector<MergedCategoryTimeline> none;  // nothing to draw: no read
    for (std::size_t gi = 0; gi < a.merged.size(); ++gi) none.push_back(p.finish(gi, reps));
    return none;
  }
  std::vector<std::unique_ptr<TraceReader>> readers;
  for (const auto& m : a.traces) readers.push_back(std::make_unique<TraceReader>(m->info.path));
  MergeOrder order(readers);
  order.start([&](std::size_t i, const format::Record& r) { p.traces[i]->feed(r); });
  std::size_t ti = 0;
  const format::Record* r = nullptr;
  std::uint64_t bw = 0;
  auto ahead = [&](std::size_t i, const format::Record& next) { p.traces[i]->prefetch(next); };
  while (order.next(ti, r, bw, ahead)) {
    if (const int device = merged_event_device(*r); device != INT32_MIN) p.on_event(ti, *r, device, bw);
    else if (r->type == format::RecordType::end) p.on_end(ti, bw);
  }
  std::vector<MergedCategoryTimeline> out;
  for (std::size_t gi = 0; gi < a.merged.size(); ++gi) out.push_back(p.finish(gi, reps));
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti)
    if (reps[ti]->decided_anything() && reps[ti]->timelines.empty()) p.traces[ti]->finish(*reps[ti]);
  return out;
}

void category_timelines(const Model& m, const std::vector<Category>& finals, CategoryReport& rep) {
  TimelinePass p(m, finals);
  TraceReader reader(m.info.path);
  format::Record r;
  while (reader.next(r)) p.feed(r);
  p.finish(rep);
}

}  // namespace gpuheap
