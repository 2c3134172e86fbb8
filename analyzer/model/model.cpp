#include "analyzer/model/model.h"

#include <algorithm>

#include <fmt/format.h>

#include "analyzer/base/error.h"

namespace gpuheap {

using format::AllocKind;

Model::Model(std::string path, std::size_t timeline_buckets) : timeline_buckets_(timeline_buckets) {
  info.path = std::move(path);
  sites.resize(1);
}

std::uint16_t Model::new_dev(int device) {
  // A trace names a handful of devices; tens of thousands of distinct ordinals (the i32
  // field of a damaged device record) would cost a DeviceState each and a linear scan per
  // event (quadratic time). Refuse them as corruption.
  if (dev_ids_.size() >= kMaxDevices)
    throw InputError(fmt::format("{}: more than {} distinct device ordinals (device {}): corrupt trace", info.path,
                                 kMaxDevices, device));
  dev_ids_.push_back(device);
  devices.emplace_back();
  devices.back().device = device;
  devices.back().timeline = Timeline(timeline_buckets_);
  if (windowed_) {
    dev_win_.emplace_back();
    if (!in_window_) freeze_device(devices.size() - 1);
  }
  return static_cast<std::uint16_t>(devices.size() - 1);
}

DeviceState& Model::dev(int device) { return devices[dev_index(device)]; }

Site& Model::site_grow(std::uint32_t stack) {
  // Stack ids are dense from 1 and defined before use, so a real id is at most the number
  // of stacks seen. A wild id (corrupt or hostile trace) must not allocate by its value:
  // 1 << 26 alone cost 3.7 GB. Bounded by the stacks defined, memory follows the file size.
  if (stack > (1u << 26) || stack > 2 * stacks.size() + 1024) return sites[0];
  sites.resize(std::max<std::size_t>(stack + 1, sites.size() * 2));
  return sites[stack];
}

Model::Totals Model::totals(int device) const {
  for (std::size_t i = 0; i < dev_ids_.size(); ++i) {
    if (dev_ids_[i] != device) continue;
    const auto& s = devices[i].stat;
    return {s[kRequestedBytes][0].current, s[kAllocatedBytes][0].current, s[kReservedBytes][0].current};
  }
  return {};
}

void Model::feed(const format::Record& r) {
  using format::RecordType;
  flush_site_drops();  // every reader of the sites but on_alloc's is behind another record
  switch (r.type) {
    case RecordType::process: {
      const auto& p = r.process;
      info.have_process = true;
      info.pid = p.pid, info.ppid = p.ppid, info.wall_ns = p.wall_ns, info.mono_ns = p.mono_ns;
      info.hostname = p.hostname, info.version = p.version, info.exe = p.exe;
      info.command.clear();
      std::string_view c = p.cmdline;
      while (!c.empty()) {
        auto z = c.find('\0');
        info.command.emplace_back(c.substr(0, z));
        if (z == std::string_view::npos) break;
        c.remove_prefix(z + 1);
      }
      break;
    }
    case RecordType::identity:
      info.rank = r.identity.rank, info.local_rank = r.identity.local_rank;
      info.world_size = r.identity.world_size, info.rank_source = r.identity.source;
      break;
    case RecordType::device: {
      auto& d = dev(r.device.device);
      d.name = r.device.name;
      d.total_memory = r.device.total_memory;
      break;
    }
    case RecordType::module:
      modules.push_back(
          {r.module.base, r.module.lo, r.module.hi, std::string(r.module.path), std::string(r.module.build_id)});
      break;
    case RecordType::module_unload: touch_ts(r.module_unload.ts); break;
    case RecordType::py_code: {
      const auto& c = r.py_code;
      py_codes[c.id] = {c.py_major,          c.py_minor,
                        c.firstlineno,       std::string(c.filename),
                        std::string(c.name), std::string(c.linetable)};
      break;
    }
    case RecordType::stack: {
      auto& v = stacks[r.stack.id];
      v.resize(r.stack.depth);
      for (std::size_t i = 0; i < r.stack.depth; ++i) v[i] = r.stack.ip(i);
      break;
    }
    case RecordType::alloc: ++info.events, on_alloc(r.alloc); break;
    case RecordType::free: ++info.events, on_free(r.free); break;
    case RecordType::free_completed: ++info.events, on_free_completed(r.free_completed); break;
    case RecordType::segment_alloc: ++info.events, on_segment(r.segment, false); break;
    case RecordType::segment_free: ++info.events, on_segment(r.segment, true); break;
    case RecordType::oom: ++info.events, on_oom(r.oom); break;
    case RecordType::retry: {
      ++info.events;
      touch_ts(r.retry.ts);
      if (counting()) dev(r.retry.device).num_alloc_retries++;
      break;
    }
    case RecordType::empty_cache: {
      ++info.events;
      touch_ts(r.empty_cache.ts);
      auto& d = dev(r.empty_cache.device);
      if (!counting()) break;
      d.empty_cache_calls++;
      d.empty_cache_released += r.empty_cache.released;
      break;
    }
    case RecordType::thread: threads[r.thread.tid] = std::string(r.thread.name); break;
    case RecordType::phase: touch_ts(r.phase.ts), on_phase(r.phase); break;
    case RecordType::symbol_string: symbols.add(r.symbol_string); break;
    case RecordType::symbol_frames: symbols.add(r.symbol_frames); break;
    case RecordType::snapshot: on_snapshot(r.snapshot); break;
    case RecordType::event_block: break;  // never decoded: the reader expands blocks into their events
    case RecordType::end:
      info.end_ts = r.end.ts;
      info.end_reason = r.end.reason;
      touch_ts(r.end.ts);
      complete_pending();
      break;
  }
}

std::uint32_t Model::find_segment_slow(std::uint64_t ptr) const {
  // Last segment starting at or before ptr: branchless binary search (the outcome of each
  // step is unpredictable, a mispredicted branch per step would cost more than the loads).
  const std::uint64_t* base = seg_starts_.data();
  std::size_t n = seg_starts_.size();
  if (n == 0 || ptr < base[0]) return kNoSeg;
  while (n > 1) {
    std::size_t half = n / 2;
    base = base[half] <= ptr ? base + half : base;
    n -= half;
  }
  std::uint32_t slot = seg_slots_[static_cast<std::size_t>(base - seg_starts_.data())];
  const auto& s = segs_[slot];
  return ptr - s.ptr < s.size ? slot : kNoSeg;
}

void Model::on_segment(const format::SegmentRecord& r, bool is_free) {
  touch_ts(r.ts);
  auto di = dev_index(r.device);
  auto& d = devices[di];
  bool small = r.flags & format::kFlagSmallPool;
  bool oversize = r.flags & format::kFlagOversize;
  int pool = small ? kSmallPool : kLargePool;
  auto s = static_cast<std::int64_t>(r.size);
  if (!is_free) {
    if (find_segment(r.ptr) != kNoSeg) return;  // duplicate: keep the first
    std::uint32_t slot;
    if (!free_segs_.empty()) {
      slot = free_segs_.back();
      free_segs_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(segs_.size());
      segs_.emplace_back();
    }
    // A segment's birth takes a sequence number too, so the layout at an earlier moment
    // (frag_seq) can tell the segments that existed then from later ones.
    segs_[slot] = Segment{};
    auto& sg = segs_[slot];
    sg.ptr = r.ptr, sg.size = r.size, sg.born = ++seq_, sg.dev = di, sg.small = small, sg.oversize = oversize;
    sg.alive = true;
    auto at = std::lower_bound(seg_starts_.begin(), seg_starts_.end(), r.ptr) - seg_starts_.begin();
    {
      // find_segment's hints hold while segments are disjoint and not empty.
      auto ui = static_cast<std::size_t>(at);
      bool overlap = r.size == 0 || r.ptr + r.size < r.ptr;
      if (ui > 0) {
        const auto& p = segs_[seg_slots_[ui - 1]];
        overlap = overlap || p.ptr + p.size > r.ptr || p.ptr + p.size < p.ptr;
      }
      if (ui < seg_starts_.size()) overlap = overlap || r.ptr + r.size > seg_starts_[ui];
      if (overlap) {
        seg_overlap_ = true;
        if (!bits_off_) edges_to_hash();  // a block edge may now lie inside another segment
      }
    }
    bits_birth(slot);
    seg_starts_.insert(seg_starts_.begin() + at, r.ptr);
    seg_slots_.insert(seg_slots_.begin() + at, slot);
    pool_stats(d, pool, kReservedBytes, s);
    pool_stats(d, pool, kSegments, 1);
    pool_stats(d, pool, kDeviceAllocs, 1);
    if (oversize) pool_stats(d, pool, kOversizeSegments, 1);
  } else {
    auto slot = find_segment(r.ptr);
    if (slot == kNoSeg || segs_[slot].ptr != r.ptr) return;  // segment from before tracing
    auto& sg = segs_[slot];
    if (sg.active_blocks > 0) {
      // Blocks still active in a released segment: the writer lost their frees. Detach them.
      const bool in_edges = sg.bits == nullptr;  // else their edges go with the bitmap
      live_.for_each_mut([&](std::uint64_t k, Live& e) {
        if (e.seg != slot) return;
        frag_gone(e.dev, e.seq, k, e.size, false);
        e.seg = kNoSeg;
        for (int end = 0; end < 2 && in_edges; ++end) {
          std::uint64_t at = end ? k + e.size : k;
          if (auto* x = edges_.find(at)) {
            (end ? x->ends : x->starts)--;
            if (x->starts == 0 && x->ends == 0) edges_.erase(at);
          }
        }
      });
      sg.active_blocks = 0, sg.active_bytes = 0, sg.touches = 0;
    }
    sg.active_blocks = 0;
    if (sg.bits) bits_drop(sg, false);
    seg_update(sg);
    pool = sg.small ? kSmallPool : kLargePool;
    pool_stats(d, pool, kReservedBytes, -static_cast<std::int64_t>(sg.size));
    pool_stats(d, pool, kSegments, -1);
    pool_stats(d, pool, kDeviceAllocs, -1);
    if (sg.oversize) pool_stats(d, pool, kOversizeSegments, -1);
    sg.alive = false;
    seg_hints_forget(slot);
    frag_gone(di, sg.born, sg.ptr, sg.size, true);
    auto at = std::lower_bound(seg_starts_.begin(), seg_starts_.end(), r.ptr) - seg_starts_.begin();
    while (seg_slots_[at] != slot) ++at;  // equal starts (a zero-size duplicate): erase this one
    seg_starts_.erase(seg_starts_.begin() + at);
    seg_slots_.erase(seg_slots_.begin() + at);
    free_segs_.push_back(slot);
  }
  sample(d, r.ts);
}

void Model::on_oom(const format::OomRecord& o) {
  touch_ts(o.ts);
  auto di = dev_index(o.device);
  auto& d = devices[di];
  if (!counting()) return;
  d.num_ooms++;
  if (ooms.size() >= kMaxOomDetails) return;
  OomInfo oi;
  oi.rec = o;
  oi.model_reserved = static_cast<std::uint64_t>(d.stat[kReservedBytes][0].current);
  oi.model_allocated = static_cast<std::uint64_t>(d.stat[kAllocatedBytes][0].current);
  oi.model_held = static_cast<std::uint64_t>(d.stat[kReservedBytes][0].current + d.held -
                                             d.stat[kAllocatedBytes][0].current);
  oi.frag = snapshot(di, o.ts);
  base::FlatMap<SiteBytes> by;
  live_.for_each([&](std::uint64_t, const Live& e) {
    if (e.dev != di || pending(e) || !format::holds_device_memory(static_cast<AllocKind>(e.kind))) return;
    auto& s = by.get(e.stack);
    s.stack = e.stack, s.bytes += e.requested, s.allocated += e.size, s.count++;
  });
  by.for_each([&](std::uint64_t, const SiteBytes& s) { oi.top_live.push_back(s); });
  model::sort_sites(oi.top_live);
  if (oi.top_live.size() > kOomTopSites) oi.top_live.resize(kOomTopSites);
  ooms.push_back(std::move(oi));
}

}  // namespace gpuheap
