#include "analyzer/model.h"

#include <algorithm>

#include <fmt/format.h>

#include "analyzer/error.h"

namespace gpuheap {

using format::AllocKind;

namespace {

// Kinds that the torch-style table accounts (pass-through counts as reserved = allocated).
bool table_kind(AllocKind k) {
  return k == AllocKind::device_pooled || k == AllocKind::device_passthrough || k == AllocKind::pitch;
}

}  // namespace

Model::Model(std::string path, std::size_t timeline_buckets) : timeline_buckets_(timeline_buckets) {
  info.path = std::move(path);
  sites.resize(1);
}

// The helpers below run several times per event: `inline` (GCC kept them out of line at -O2,
// a call each), with dev_index's rare new-device path out of line.
inline std::uint16_t Model::dev_index(int device) {
  for (std::size_t i = 0; i < dev_ids_.size(); ++i)
    if (dev_ids_[i] == device) return static_cast<std::uint16_t>(i);
  return new_dev(device);
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

Model::Totals Model::totals(int device) const {
  for (std::size_t i = 0; i < dev_ids_.size(); ++i) {
    if (dev_ids_[i] != device) continue;
    const auto& s = devices[i].stat;
    return {s[kRequestedBytes][0].current, s[kAllocatedBytes][0].current, s[kReservedBytes][0].current};
  }
  return {};
}

inline Site& Model::site(std::uint32_t stack) {
  if (stack >= sites.size()) {
    // Stack ids are dense from 1 and defined before use, so a real id is at most the number
    // of stacks seen. A wild id (corrupt or hostile trace) must not allocate by its value:
    // 1 << 26 alone cost 3.7 GB. Bounded by the stacks defined, memory follows the file size.
    if (stack > (1u << 26) || stack > 2 * stacks.size() + 1024) return sites[0];
    sites.resize(std::max<std::size_t>(stack + 1, sites.size() * 2));
  }
  return sites[stack];
}

std::uint64_t Model::ptr_of(std::uint64_t k, const Live& e) {
  return key(k, static_cast<AllocKind>(e.kind));  // the key-space xor is its own inverse
}

inline void Model::sample(DeviceState& d, std::uint64_t ts) {
  d.unsampled_rise = false;
  // The maximum since the last phase record (model_phases.cpp folds it into open phases).
  d.phase_peak_requested = std::max(d.phase_peak_requested, d.stat[kRequestedBytes][0].current);
  d.phase_peak_allocated = std::max(d.phase_peak_allocated, d.stat[kAllocatedBytes][0].current);
  d.timeline.sample(ts, d.stat[kRequestedBytes][0].current, d.stat[kAllocatedBytes][0].current,
                    d.stat[kReservedBytes][0].current, d.stat[kActiveBytes][0].current);
}

void Model::feed(const format::Record& r) {
  using format::RecordType;
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
    case RecordType::device: {
      auto& d = dev(r.device.device);
      d.name = r.device.name;
      d.total_memory = r.device.total_memory;
      break;
    }
    case RecordType::module:
      modules.push_back({r.module.base, r.module.lo, r.module.hi, std::string(r.module.path),
                         std::string(r.module.build_id)});
      break;
    case RecordType::module_unload: touch_ts(r.module_unload.ts); break;
    case RecordType::py_code: {
      const auto& c = r.py_code;
      py_codes[c.id] = {c.py_major, c.py_minor, c.firstlineno, std::string(c.filename), std::string(c.name),
                        std::string(c.linetable)};
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
    case RecordType::end:
      info.end_ts = r.end.ts;
      info.end_reason = r.end.reason;
      touch_ts(r.end.ts);
      complete_pending();
      break;
  }
}

std::uint32_t Model::find_segment(std::uint64_t ptr) {
  if (seg_overlap_) return find_segment_slow(ptr);
  auto& h = seg_hints_[(ptr >> 21) & (kSegHints - 1)];
  if (h.granule == ptr >> 21) {
    const auto& s = segs_[h.slot];
    if (s.alive && ptr - s.ptr < s.size) return h.slot;
  }
  std::uint32_t slot = find_segment_slow(ptr);
  if (slot != kNoSeg) h = {ptr >> 21, slot};
  return slot;
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

inline void Model::add_acc(DeviceState& d, const Live& e) {
  DeviceState::Acc* acc;
  if (e.stack < sites.size()) {
    if (d.acc.size() <= e.stack) d.acc.resize(sites.size());
    acc = &d.acc[e.stack];
  } else {
    acc = &d.acc_wild.get(e.stack);
  }
  if (acc->epoch != d.epoch) *acc = {d.epoch, 0, 0, 0};
  acc->bytes += e.requested, acc->allocated += e.size, acc->count++;
}

void Model::on_alloc(const format::AllocRecord& a) {
  touch_ts(a.ts);
  auto di = dev_index(a.device);
  auto& d = devices[di];
  auto k = key(a.ptr, a.kind);
  bool inserted = false;
  Live* e = &live_.get(k, &inserted);
  if (!inserted) {
    // The address is still tracked: a pooled block whose free_completed was not recorded,
    // or a lost free. Retire the old entry first so the stats stay consistent.
    ++info.reused_live_ptrs;
    release(k, *e, a.ts, true);
    e = &live_.get(k);
  }
  std::uint64_t size = a.size ? a.size : a.requested;
  *e = Live{size,  a.requested, ++seq_, a.stack, a.tid, kNoSeg, di, static_cast<std::uint8_t>(a.kind),
            static_cast<std::uint8_t>(a.flags & ~kPending)};
  auto& st = site(a.stack);
  st.allocs++, st.alloc_bytes += a.requested, st.alloc_allocated += size;
  st.live_bytes += static_cast<std::int64_t>(a.requested), st.live_count++;
  if (st.live_bytes > st.max_live_bytes) st.max_live_bytes = st.live_bytes;
  thread_last_.get(a.tid) = e->seq;

  auto s = static_cast<std::int64_t>(size);
  if (table_kind(a.kind)) {
    int pool = (a.flags & format::kFlagSmallPool) ? kSmallPool : kLargePool;
    const std::int64_t allocated_peak = d.stat[kAllocatedBytes][0].peak;
    const auto r = static_cast<std::int64_t>(a.requested);
    auto& all = d.stat.pool(kAllPools);
    auto& row = d.stat.pool(pool);
    if ((r | s) >= 0) {
      // Sizes that read non-negative (every real trace): one sign test for the five rises.
      rise(all, row, kRequestedBytes, r);
      rise(all, row, kAllocatedBytes, s);
      rise(all, row, kActiveBytes, s);
    } else {
      pool_stats(d, pool, kRequestedBytes, r);
      pool_stats(d, pool, kAllocatedBytes, s);
      pool_stats(d, pool, kActiveBytes, s);
    }
    rise(all, row, kAllocations, 1);
    rise(all, row, kActiveAllocs, 1);
    requests.add(a.requested);
    if (a.kind == AllocKind::device_pooled) {
      if (a.flags & format::kFlagOversize) pool_stats(d, pool, kOversizeAllocations, 1);
      e->seg = find_segment(a.ptr);
      if (e->seg != kNoSeg && a.ptr + size > segs_[e->seg].ptr + segs_[e->seg].size) e->seg = kNoSeg;
      if (size == 0) e->seg = kNoSeg;
      seg_add_block(a.ptr, *e, +1);
    } else {
      pool_stats(d, pool, kReservedBytes, s);  // the driver's allocation is the reservation
      pool_stats(d, pool, kDeviceAllocs, 1);
    }
    sample(d, a.ts);
    if (d.stat[kAllocatedBytes][0].peak > allocated_peak) {
      // A new peak of allocated memory: the moment whose pool layout the fragmentation
      // section describes. Remember it; what leaves the layout from here on is logged.
      d.frag_seq = e->seq, d.frag_ts = a.ts, d.frag_open = true;
      d.frag_log.clear();
    }
  } else {
    auto& u = d.kinds[static_cast<int>(a.kind)];
    u.used = true;
    u.current += s, u.total += s, u.count++, u.total_count++;
    u.peak = std::max(u.peak, u.current);
    u.peak_count = std::max(u.peak_count, u.count);
  }
  if (format::holds_device_memory(a.kind)) {
    d.held += s;
    d.held_requested += static_cast<std::int64_t>(a.requested);
    if (d.held_requested > d.peak_held) {
      // New peak: everything live now is the peak set. Frees of allocations with
      // seq <= peak_seq are accumulated per site from here on (epoch invalidates older ones).
      // Requested bytes decide the moment, so it does not move with the pool's block choice.
      d.peak_held = d.held_requested, d.peak_held_allocated = d.held;
      d.peak_held_ts = a.ts, d.peak_seq = e->seq, ++d.epoch;
    }
  }
}

// The program gave the allocation back (free record). Pooled blocks stay active until
// free_completed (or until `completes`: the block is retired outright).
void Model::release(std::uint64_t k, Live& e, std::uint64_t ts, bool completes) {
  auto& d = devices[e.dev];
  auto kind = static_cast<AllocKind>(e.kind);
  if (!pending(e)) {
    auto s = static_cast<std::int64_t>(e.size);
    auto& st = site(e.stack);
    st.live_bytes -= static_cast<std::int64_t>(e.requested), st.live_count--;
    if (auto* last = thread_last_.find(e.tid); last && *last == e.seq) {
      st.temporaries++;
      st.temporary_bytes += e.requested, st.temporary_allocated += e.size;
    }
    if (format::holds_device_memory(kind)) {
      d.held -= s;
      d.held_requested -= static_cast<std::int64_t>(e.requested);
      if (e.seq <= d.peak_seq) add_acc(d, e);
    }
    if (table_kind(kind)) {
      int pool = (e.flags & format::kFlagSmallPool) ? kSmallPool : kLargePool;
      const auto r = static_cast<std::int64_t>(e.requested);
      auto& all = d.stat.pool(kAllPools);
      auto& row = d.stat.pool(pool);
      if ((r | s) >= 0) {
        fall(all, row, kRequestedBytes, -r);
        fall(all, row, kAllocatedBytes, -s);
      } else {
        pool_stats(d, pool, kRequestedBytes, -r);
        pool_stats(d, pool, kAllocatedBytes, -s);
      }
      fall(all, row, kAllocations, -1);
      if (kind == AllocKind::device_pooled) {
        if (e.flags & format::kFlagOversize) pool_stats(d, pool, kOversizeAllocations, -1);
        e.flags |= kPending;
        // Its free_completed will look up the block's end edge, which that record's prefetch
        // cannot name (the record's size may be 0): start loading it now.
        if (e.seg != kNoSeg && !segs_[e.seg].bits) edges_.prefetch(k + e.size);
      } else {
        pool_stats(d, pool, kActiveBytes, -s);
        pool_stats(d, pool, kActiveAllocs, -1);
        pool_stats(d, pool, kReservedBytes, -s);
        pool_stats(d, pool, kDeviceAllocs, -1);
      }
      // A free only lowers the sampled series (by bytes that read non-negative), and nothing
      // raised one unsampled since the device's last sample: every maximum the sample would
      // fold (its timeline bucket, the phase peaks) is already at least the new value. Only a
      // sample in a new bucket records something then.
      if (s < 0 || static_cast<std::int64_t>(e.requested) < 0 || d.unsampled_rise || !d.timeline.in_last_bucket(ts))
        sample(d, ts);
    } else {
      auto& u = d.kinds[static_cast<int>(kind)];
      u.current -= s, u.count--;
    }
  }
  if (kind == AllocKind::device_pooled && !completes) return;
  if (kind == AllocKind::device_pooled) {
    complete(k, e);
  } else {
    live_.erase_found(k, &e);
  }
}

void Model::complete(std::uint64_t k, Live& e) {
  auto& d = devices[e.dev];
  int pool = (e.flags & format::kFlagSmallPool) ? kSmallPool : kLargePool;
  auto s = static_cast<std::int64_t>(e.size);
  auto& all = d.stat.pool(kAllPools);
  auto& row = d.stat.pool(pool);
  if (s >= 0) {
    fall(all, row, kActiveBytes, -s);
  } else {
    pool_stats(d, pool, kActiveBytes, -s);
    d.unsampled_rise = true;  // active rose, and no sample follows (Model::release)
  }
  fall(all, row, kActiveAllocs, -1);
  const auto di = e.dev;
  const auto seq = e.seq, size = e.size;
  const bool in_layout = e.seg != kNoSeg;
  seg_add_block(k, e, -1);  // pooled: the key is the address
  live_.erase_found(k, &e);  // e is the live entry (seg_add_block never touches live_)
  if (in_layout) frag_gone(di, seq, k, size, false);
}

void Model::on_free(const format::FreeRecord& f) {
  touch_ts(f.ts);
  if (f.flags & format::kFlagFailed) return;  // the call failed: nothing was freed
  auto k = key(f.ptr, f.kind);
  Live* e = live_.find(k);
  if (!e || pending(*e)) {
    // Allocated before tracing started (or freed twice): count it, change nothing.
    ++info.unmatched_frees;
    return;
  }
  release(k, *e, f.ts, false);
}

void Model::on_free_completed(const format::FreeCompletedRecord& f) {
  touch_ts(f.ts);
  auto k = key(f.ptr, AllocKind::device_pooled);
  Live* e = live_.find(k);
  if (!e || !pending(*e)) {
    ++info.unmatched_free_completed;
    return;
  }
  complete(k, *e);
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
    segs_[slot] = Segment{r.ptr, r.size, ++seq_, 0, 0, 0, 0, 0, di, small, oversize, true};
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
  detail::FlatMap<SiteBytes> by;
  live_.for_each([&](std::uint64_t, const Live& e) {
    if (e.dev != di || pending(e) || !format::holds_device_memory(static_cast<AllocKind>(e.kind))) return;
    auto& s = by.get(e.stack);
    s.stack = e.stack, s.bytes += e.requested, s.allocated += e.size, s.count++;
  });
  by.for_each([&](std::uint64_t, const SiteBytes& s) { oi.top_live.push_back(s); });
  detail::sort_sites(oi.top_live);
  if (oi.top_live.size() > kOomTopSites) oi.top_live.resize(kOomTopSites);
  ooms.push_back(std::move(oi));
}

}  // namespace gpuheap
