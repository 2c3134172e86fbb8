// Model: fragmentation snapshots and the end-of-trace pass (peak consumers, leaks).
#include <algorithm>

#include "analyzer/model/model.h"

namespace gpuheap {

using format::AllocKind;

namespace {

// Leaked bytes count memory, not address space or mappings of already counted memory.
bool leak_counted(AllocKind k) { return k != AllocKind::va_reserve && k != AllocKind::vmm_map; }

}  // namespace

void model::sort_sites(std::vector<SiteBytes>& v) {
  std::sort(v.begin(), v.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack;
  });
}

// Pool layout of one device: free pieces of every segment (gaps between active blocks).
// The replay keeps no ordered block list per segment (per-event cost); the layout is
// rebuilt here from the live map: O(live log live) per rebuild. Rebuilds happen at OOM
// records and at finish.
Fragmentation Model::layout(std::uint16_t di, std::uint64_t max_seq, const std::vector<DeviceState::Gone>& gone) const {
  Fragmentation f;
  f.valid = true;
  struct Span {
    std::uint64_t ptr, size;
    bool operator<(const Span& o) const { return ptr != o.ptr ? ptr < o.ptr : size < o.size; }
  };
  std::vector<Span> segs, blocks;
  for (std::uint32_t slot : seg_slots_) {
    const auto& sg = segs_[slot];
    if (sg.dev == di && sg.born <= max_seq) segs.push_back({sg.ptr, sg.size});
  }
  live_.for_each([&](std::uint64_t k, const Live& e) {  // pooled: key = ptr
    if (e.seg != kNoSeg && e.seq <= max_seq && segs_[e.seg].dev == di) blocks.push_back({k, e.size});
  });
  for (const auto& g : gone) (g.is_segment ? segs : blocks).push_back({g.ptr, g.size});
  std::sort(segs.begin(), segs.end());
  std::sort(blocks.begin(), blocks.end());
  auto piece = [&](std::uint64_t n) {
    if (n == 0) return;
    f.free_bytes += n, f.free_pieces++;
    f.largest_free = std::max(f.largest_free, n);
    f.piece_sizes.push_back(n);
  };
  for (const auto& sg : segs) {
    f.reserved += sg.size;
    std::uint64_t cur = sg.ptr, end = sg.ptr + sg.size;
    // A block was admitted to a segment only if it fits inside it (on_alloc).
    auto it = std::lower_bound(blocks.begin(), blocks.end(), Span{sg.ptr, 0});
    for (; it != blocks.end() && it->ptr < end; ++it) {
      f.active += it->size;
      if (it->ptr > cur) piece(it->ptr - cur);
      cur = std::max(cur, it->ptr + it->size);
    }
    if (end > cur) piece(end - cur);
  }
  return f;
}

// The layout now (OOM records).
Fragmentation Model::snapshot(std::uint16_t di, std::uint64_t ts) const {
  static const std::vector<DeviceState::Gone> none;
  Fragmentation f = layout(di, ~std::uint64_t{0}, none);
  f.ts = ts;
  f.allocated = static_cast<std::uint64_t>(devices[di].stat[kAllocatedBytes][0].current);
  return f;
}

// The layout at the device's peak of allocated memory (see DeviceState::frag_seq).
Fragmentation Model::peak_layout(std::uint16_t di) const {
  const auto& d = devices[di];
  Fragmentation f = layout(di, d.frag_seq, d.frag_log);
  f.ts = d.frag_ts;
  f.allocated = static_cast<std::uint64_t>(d.stat[kAllocatedBytes][0].peak);  // reached at frag_seq
  f.valid = f.reserved > 0;  // a peak of pass-through memory only: no pool layout to describe
  return f;
}

// The end record is written as the process exits: no stream has work left, so every free
// waiting for its stream (pending) is complete. Without this, blocks freed after the last
// allocation stay "active" at the end (Active > Allocated) and inflate the layout.
void Model::complete_pending() {
  std::vector<std::uint64_t> keys;
  live_.for_each([&](std::uint64_t k, const Live& e) {
    if (pending(e)) keys.push_back(k);
  });
  // In address order: the counters (e.g. non-releasable bytes' total) depend on the order,
  // and it must not be the hash map's.
  std::sort(keys.begin(), keys.end());
  for (auto k : keys)
    if (Live* e = live_.find(k)) complete(k, *e);
}

void Model::finish_fragmentation(Fragmentation& f) const {
  if (!f.valid) return;
  f.median_request = requests.median();
  f.unusable_bytes = 0;
  for (auto n : f.piece_sizes)
    if (n < f.median_request) f.unusable_bytes += n;
  f.unusable_share = f.reserved ? static_cast<double>(f.unusable_bytes) / static_cast<double>(f.reserved) : 0;
  f.piece_sizes.clear();
  f.piece_sizes.shrink_to_fit();
}

void Model::finish(bool cut_mid_record, bool has_end, std::uint64_t records) {
  if (finished_) return;
  finished_ = true;
  flush_site_drops();
  info.cut_mid_record = cut_mid_record;
  info.has_end = has_end;
  info.truncated = cut_mid_record || !has_end;
  info.records = records;
  finish_phases();
  derive_freed();
  if (windowed_) finish_window();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    if (d.frag_open) d.frag_peak = peak_layout(static_cast<std::uint16_t>(i));
    d.frag_open = false;
    d.frag_log = {};
    finish_fragmentation(d.frag_peak);
  }
  for (auto& o : ooms) finish_fragmentation(o.frag);

  // Peak consumers: allocations live at the peak = (freed since, accumulated) + (still live).
  std::vector<base::FlatMap<SiteBytes>> peak(devices.size());
  base::FlatMap<Leak> leak_by;
  live_.for_each([&](std::uint64_t, const Live& e) {
    if (pending(e)) return;
    auto kind = static_cast<AllocKind>(e.kind);
    const auto& d = devices[e.dev];
    if (format::holds_device_memory(kind) && e.seq <= d.peak_seq) {
      auto& s = peak[e.dev].get(e.stack);
      s.stack = e.stack, s.bytes += e.requested, s.allocated += e.size, s.count++;
    }
    if (windowed_) return;  // the window's leaks were taken at each interval's end
    auto& l = leak_by.get(e.stack);
    l.stack = e.stack, l.bytes += e.requested, l.allocated += e.size, l.count++;
    if (leak_counted(kind)) {
      leaked_bytes += e.requested, leaked_allocated_bytes += e.size;
      devices[e.dev].leaked_bytes += e.requested;
    }
    leaked_count++;
  });
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    auto add = [&](std::uint64_t stack, const DeviceState::Acc& a) {
      if (a.epoch != d.epoch || a.count == 0) return;
      auto& s = peak[i].get(stack);
      s.stack = static_cast<std::uint32_t>(stack), s.bytes += a.bytes, s.allocated += a.allocated, s.count += a.count;
    };
    for (std::size_t st = 0; st < d.acc.size(); ++st) add(st, d.acc[st]);
    d.acc_wild.for_each(add);
    d.acc = {}, d.acc_wild = {};
    peak[i].for_each([&](std::uint64_t, const SiteBytes& s) { d.peak_consumers.push_back(s); });
    model::sort_sites(d.peak_consumers);
  }
  if (windowed_) {
    leak_by = std::move(win_leaks_);
    leaked_bytes = win_leaked_bytes_, leaked_allocated_bytes = win_leaked_allocated_, leaked_count = win_leaked_count_;
  }
  leak_by.for_each([&](std::uint64_t, const Leak& l) { leaks.push_back(l); });
  std::sort(leaks.begin(), leaks.end(),
            [](const Leak& a, const Leak& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack; });

  // Present devices in index order.
  std::vector<std::size_t> order(devices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return dev_ids_[a] < dev_ids_[b]; });
  std::vector<DeviceState> sorted;
  std::vector<int> ids;
  for (auto i : order) sorted.push_back(std::move(devices[i])), ids.push_back(dev_ids_[i]);
  devices.swap(sorted);
  dev_ids_.swap(ids);
}

}  // namespace gpuheap
