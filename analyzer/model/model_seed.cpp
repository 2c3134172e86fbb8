// Model: a rolling window's segment (`gpuheap run --aggregate`, format v6) starts with the
// state the run had before it (format/trace.h, SnapshotPart; the preload's
// preload/record/aggregate.h keeps it by the rules of model_events.cpp). The model is seeded
// from it so that the events after it land where they would have in the full trace: the live
// allocations are fed as allocations (frees of them match), the peak of each device, the
// allocations live at it and since freed, and the per-site totals are set as the preload
// counted them.
#include <algorithm>

#include "analyzer/base/error.h"
#include "analyzer/model/model.h"

namespace gpuheap {

void Model::on_snapshot(const format::SnapshotRecord& r) {
  using P = format::SnapshotPart;
  if (r.part == P::begin) {
    // One snapshot per file, before every event: anything else is not what the preload writes.
    if (seed_.open || info.window || info.events)
      throw CorruptTraceError("a snapshot record where a rolling window's segment cannot have one", 0);
    seed_ = Seed{};
    seed_.open = true;
    info.window = true, info.window_segment = r.segment, info.window_start_ts = r.ts;
    info.events_before = r.events_before;
    if (r.first_ts) touch_ts(r.first_ts);
    return;
  }
  if (!seed_.open) throw CorruptTraceError("a snapshot record without its begin", 0);
  switch (r.part) {
    case P::device: seed_.devices.push_back(r); break;
    case P::live:
      for (std::uint32_t i = 0; i < r.count; ++i) seed_.live.push_back(r.live(i));
      break;
    case P::peak_freed:
      for (std::uint32_t i = 0; i < r.count; ++i) seed_.freed.push_back(r.freed(i));
      break;
    case P::site:
      for (std::uint32_t i = 0; i < r.count; ++i) seed_.sites.push_back(r.site(i));
      break;
    case P::end:
      if (r.n_live != seed_.live.size() || r.n_freed != seed_.freed.size() || r.n_sites != seed_.sites.size())
        throw CorruptTraceError("a rolling window's snapshot is not whole", 0);
      seed_window();
      seed_ = Seed{};
      break;
    case P::begin: break;
  }
}

void Model::seed_window() {
  auto& live = seed_.live;
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  const std::uint64_t base = seq_;
  std::vector<std::uint64_t> model_seq(live.size());  // the model's seq of each, fed in order
  for (std::size_t i = 0; i < live.size(); ++i) {
    const auto& e = live[i];
    format::AllocRecord a;
    a.ts = e.ts, a.tid = e.tid, a.device = e.device, a.kind = e.kind;
    a.flags = static_cast<std::uint8_t>(e.flags & ~format::kSnapPending);
    a.ptr = e.ptr, a.requested = e.requested, a.size = e.size, a.stream = e.stream, a.stack = e.stack;
    on_alloc(a);
    model_seq[i] = seq_;
    if (e.flags & format::kSnapPending) {  // freed by the program, its block not yet reusable
      format::FreeRecord f;
      f.ts = e.ts, f.tid = e.tid, f.device = e.device, f.kind = e.kind, f.ptr = e.ptr, f.size = e.size;
      f.stream = e.stream;
      on_free(f);
    }
  }
  flush_site_drops();
  for (const auto& p : seed_.devices) {
    auto& d = dev(p.device);
    d.peak_held = static_cast<std::int64_t>(p.peak_requested);
    d.peak_held_allocated = static_cast<std::int64_t>(p.peak_allocated);
    d.peak_held_ts = p.peak_ts;
    d.num_ooms += p.ooms, d.num_alloc_retries += p.retries;
    d.empty_cache_calls += p.empty_cache_calls, d.empty_cache_released += p.empty_cache_released;
    // The live allocations born by the peak are those fed up to the last one the preload
    // numbered at or before it.
    auto upto = std::upper_bound(live.begin(), live.end(), p.peak_seq,
                                 [](std::uint64_t s, const auto& e) { return s < e.seq; });
    d.peak_seq = upto == live.begin() ? base : model_seq[static_cast<std::size_t>(upto - live.begin()) - 1];
    d.peak_alloc = 0;  // before this file: a second read (category_pass.h) cannot find it
    d.frag_open = false;
    ++d.epoch;
    for (const auto& f : seed_.freed) {
      if (f.device != p.device) continue;
      Live gone;
      gone.size = f.size, gone.requested = f.requested, gone.stack = f.stack;
      add_acc(d, gone);
    }
  }
  for (const auto& s : seed_.sites) {
    auto& st = site(s.stack);
    st.allocs = s.allocs, st.alloc_bytes = s.alloc_bytes, st.alloc_allocated = s.alloc_allocated;
    st.max_live_bytes = std::max<std::int64_t>(st.live_bytes, static_cast<std::int64_t>(s.max_live_bytes));
  }
}

}  // namespace gpuheap
