// Model: fragmentation snapshots and the end-of-trace pass (peak consumers, leaks).
#include <algorithm>

#include "analyzer/model.h"

namespace gpuheap {

using format::AllocKind;

namespace {

// Leaked bytes count memory, not address space or mappings of already counted memory.
bool leak_counted(AllocKind k) { return k != AllocKind::va_reserve && k != AllocKind::vmm_map; }

void sort_sites(std::vector<SiteBytes>& v) {
  std::sort(v.begin(), v.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack;
  });
}

}  // namespace

// Pool layout of one device now: free pieces of every segment (gaps between active blocks).
// The replay keeps no ordered block list per segment (per-event cost); the layout is
// rebuilt here from the live map: O(live log live) per snapshot, and snapshots are taken
// only when a peak-reserved plateau ends, at OOM records and at the end.
Fragmentation Model::snapshot(std::uint16_t di, std::uint64_t ts) const {
  Fragmentation f;
  f.valid = true;
  f.ts = ts;
  auto piece = [&](std::uint64_t n) {
    if (n == 0) return;
    f.free_bytes += n, f.free_pieces++;
    f.largest_free = std::max(f.largest_free, n);
    f.piece_sizes.push_back(n);
  };
  struct Block {
    std::uint32_t seg;
    std::uint64_t ptr, size;
  };
  std::vector<Block> blocks;
  live_.for_each([&](std::uint64_t k, const Live& e) {
    if (e.seg != kNoSeg && segs_[e.seg].dev == di) blocks.push_back({e.seg, k, e.size});  // pooled: key = ptr
  });
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) {
    return a.seg != b.seg ? a.seg < b.seg : a.ptr < b.ptr;
  });
  std::size_t i = 0;
  for (std::uint32_t slot : seg_slots_) {
    const auto& s = segs_[slot];
    if (s.dev != di) continue;
    f.reserved += s.size;
    f.active += s.active_bytes;
    std::uint64_t cur = s.ptr, end = s.ptr + s.size;
    // Blocks sorted by slot; live segments' slots are visited in address order, so find
    // this slot's run with a binary search rather than assuming the order.
    auto it = std::lower_bound(blocks.begin() + static_cast<std::ptrdiff_t>(i), blocks.end(), slot,
                               [](const Block& b, std::uint32_t v) { return b.seg < v; });
    if (it == blocks.end() || it->seg != slot)
      it = std::lower_bound(blocks.begin(), blocks.end(), slot,
                            [](const Block& b, std::uint32_t v) { return b.seg < v; });
    for (; it != blocks.end() && it->seg == slot; ++it) {
      if (it->ptr > cur) piece(it->ptr - cur);
      cur = std::max(cur, it->ptr + it->size);
    }
    i = static_cast<std::size_t>(it - blocks.begin());
    if (end > cur) piece(end - cur);
  }
  const auto& d = devices[di];
  f.allocated = static_cast<std::uint64_t>(d.stat[kAllocatedBytes][0].current);
  return f;
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
  info.cut_mid_record = cut_mid_record;
  info.has_end = has_end;
  info.truncated = cut_mid_record || !has_end;
  info.records = records;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    if (d.frag_pending) d.frag_peak_reserved = snapshot(static_cast<std::uint16_t>(i), info.last_ts);
    d.frag_pending = false;
    finish_fragmentation(d.frag_peak_reserved);
  }
  for (auto& o : ooms) finish_fragmentation(o.frag);

  // Peak consumers: allocations live at the peak = (freed since, accumulated) + (still live).
  std::vector<detail::FlatMap<SiteBytes>> peak(devices.size());
  detail::FlatMap<Leak> leak_by;
  live_.for_each([&](std::uint64_t, const Live& e) {
    if (pending(e)) return;
    auto kind = static_cast<AllocKind>(e.kind);
    const auto& d = devices[e.dev];
    if (format::holds_device_memory(kind) && e.seq <= d.peak_seq) {
      auto& s = peak[e.dev].get(e.stack);
      s.stack = e.stack, s.bytes += e.size, s.count++;
    }
    auto& l = leak_by.get(e.stack);
    l.stack = e.stack, l.bytes += e.size, l.count++;
    if (leak_counted(kind)) leaked_bytes += e.size;
    leaked_count++;
  });
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    auto add = [&](std::uint64_t stack, const DeviceState::Acc& a) {
      if (a.epoch != d.epoch || a.count == 0) return;
      auto& s = peak[i].get(stack);
      s.stack = static_cast<std::uint32_t>(stack), s.bytes += a.bytes, s.count += a.count;
    };
    for (std::size_t st = 0; st < d.acc.size(); ++st) add(st, d.acc[st]);
    d.acc_wild.for_each(add);
    d.acc = {}, d.acc_wild = {};
    peak[i].for_each([&](std::uint64_t, const SiteBytes& s) { d.peak_consumers.push_back(s); });
    sort_sites(d.peak_consumers);
  }
  leak_by.for_each([&](std::uint64_t, const Leak& l) { leaks.push_back(l); });
  std::sort(leaks.begin(), leaks.end(), [](const Leak& a, const Leak& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack;
  });

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
