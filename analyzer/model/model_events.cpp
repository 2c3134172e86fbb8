// Model's per-event path: alloc, free and free_completed, the block-edge bitmaps they keep,
// and the replay loop's batches (feed_batch) with their prefetches. One translation unit so
// that feed_batch can take it all inline (flatten): out of line, the handlers and their
// helpers cost a sixth of the replay's instructions in calls, spills and reloads (the
// commit that made it so gives the figures). Out of line, in model.cpp and
// model_edges.cpp: a new device, a table's growth (FlatMap::rehash is noinline), the edges_
// hash map's path (segments over 32 MiB or beyond the bitmaps' budget, blocks a bitmap cannot
// hold) and a damaged trace's repairs. model.cpp feeds every other record, and these ones
// when they come in a format::Record.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "analyzer/model/model.h"

namespace gpuheap {

using format::AllocKind;
using format::RecordType;

namespace {

// Kinds that the torch-style table accounts (pass-through counts as reserved = allocated).
bool table_kind(AllocKind k) {
  return k == AllocKind::device_pooled || k == AllocKind::device_passthrough || k == AllocKind::pitch;
}

}  // namespace

void Model::sample(DeviceState& d, std::uint64_t ts) {
  d.unsampled_rise = false;
  // The maximum since the last phase record (model_phases.cpp folds it into open phases).
  d.phase_peak_requested = std::max(d.phase_peak_requested, d.stat[kRequestedBytes][0].current);
  d.phase_peak_allocated = std::max(d.phase_peak_allocated, d.stat[kAllocatedBytes][0].current);
  d.timeline.sample(ts, d.stat[kRequestedBytes][0].current, d.stat[kAllocatedBytes][0].current,
                    d.stat[kReservedBytes][0].current, d.stat[kActiveBytes][0].current);
}

std::uint32_t Model::find_segment(std::uint64_t ptr) {
  if (seg_overlap_) return find_segment_slow(ptr);
  auto& h = seg_hints_[(ptr >> 21) & (kSegHints - 1)];
  if (h.granule == ptr >> 21) {
    const auto& s = segs_[h.slot];
    if (s.alive && ptr - s.ptr < s.size) return h.slot;
  }
  std::uint32_t slot = find_segment_slow(ptr);
  if (slot != kNoSeg) {
    const auto& s = segs_[slot];
    h = {ptr >> 21, s.ptr, s.bits, slot, s.bits ? static_cast<std::uint32_t>(s.size) : 0};
  }
  return slot;
}

void Model::add_acc(DeviceState& d, const Live& e) {
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

// Block [a, b) of bitmap segment s becomes active: the boundaries it touches (0-2), or -1
// when the bitmap cannot hold it (then its edges, and perhaps all, are in edges_ now).
int Model::bits_add(Segment& s, std::uint64_t a, std::uint64_t b) {
  if (b < a) {  // wraps around: see seg_add_block
    edges_to_hash();
    return -1;
  }
  const std::uint64_t oa = a - s.ptr, ob = b - s.ptr;  // a in s (find_segment), b <= its end (on_alloc)
  const std::uint64_t pa = oa >> kGranuleShift, pb = ob >> kGranuleShift;  // boundaries in the bitmap
  std::uint64_t* w = s.bits;
  // Both read before the alignment test: in the bitmap whatever the offsets, since the block
  // lies inside its segment (a >= its start by find_segment, b <= its end by on_alloc).
  const unsigned at_a = edge_pair(w, pa), at_b = edge_pair(w, pb);
  if (((oa | ob) & kGranuleMask) || (at_a & kEdgeStart) || (at_b & kEdgeEnd)) {
    bits_drop(s, true);
    return -1;
  }
  int t = (oa == 0 || (at_a & kEdgeEnd)) ? 1 : 0;      // a block ends where this one starts
  t += (ob == s.size || (at_b & kEdgeStart)) ? 1 : 0;  // a block starts where this one ends
  w[pa >> 5] |= std::uint64_t{kEdgeStart} << ((2 * pa) & 63);
  w[pb >> 5] |= std::uint64_t{kEdgeEnd} << ((2 * pb) & 63);
  return t;
}

// Block [a, b) of bitmap segment s stops being active: bits_add admitted it, so both its
// bits are set and its own. The boundaries it touched.
int Model::bits_remove(Segment& s, std::uint64_t a, std::uint64_t b) {
  const std::uint64_t oa = a - s.ptr, ob = b - s.ptr;
  const std::uint64_t pa = oa >> kGranuleShift, pb = ob >> kGranuleShift;
  std::uint64_t* w = s.bits;
  int t = (oa == 0 || (edge_pair(w, pa) & kEdgeEnd)) ? 1 : 0;
  t += (ob == s.size || (edge_pair(w, pb) & kEdgeStart)) ? 1 : 0;
  w[pa >> 5] &= ~(std::uint64_t{kEdgeStart} << ((2 * pa) & 63));
  w[pb >> 5] &= ~(std::uint64_t{kEdgeEnd} << ((2 * pb) & 63));
  return t;
}

// sign=+1: block [ptr, ptr+size) becomes active in its segment; -1: stops being active.
// The free-piece count needs only whether each edge of the block touches a neighbour (or
// the segment edge): a block ending where it starts, a block starting where it ends. The
// segment's bitmap answers both (model_edges.cpp says when a segment has one), else edges_
// (seg_edges_hash, two slots per block). The layout itself is rebuilt at snapshots.
void Model::seg_add_block(std::uint64_t ptr, const Live& e, int sign) {
  if (e.seg == kNoSeg) return;
  auto& s = segs_[e.seg];
  if (s.bits) {
    // The segment's bitmap answers, unless the block is one it cannot hold: then
    // bits_add has moved the edges to edges_ (this segment's, or all of them) and the
    // hash map takes the block.
    const int t = sign > 0 ? bits_add(s, ptr, ptr + e.size) : bits_remove(s, ptr, ptr + e.size);
    if (t >= 0) {
      seg_account(s, e.size, static_cast<std::uint32_t>(t), sign);
      return;
    }
  }
  seg_edges_hash(ptr, e, sign);
}

void Model::on_alloc(const format::AllocRecord& a) {
  touch_ts(a.ts);
  ++allocs_;
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
  *e = Live{size,
            a.requested,
            ++seq_,
            a.stack,
            a.tid,
            kNoSeg,
            di,
            static_cast<std::uint8_t>(a.kind),
            static_cast<std::uint8_t>(a.flags & ~kPending)};
  auto& st = site(a.stack);
  // Queued drops (model.h: SiteDrop) may hold this site's: its live bytes read at least what
  // they are, by less than 2^52, and no sum below wraps around while the live bytes stay in
  // [-kSiteLiveMax, kSiteLiveMax) and requests below kSiteDropMax (one test: the bits above
  // each range, the live bytes offset to start at 0). Outside (a damaged trace's sizes) the
  // queue is applied first, as it is when the live bytes read above the site's maximum, so
  // the maximum is the same as without a queue.
  const auto live_off = static_cast<std::uint64_t>(st.live_bytes) + static_cast<std::uint64_t>(kSiteLiveMax);
  if ((live_off / (2 * static_cast<std::uint64_t>(kSiteLiveMax))) | (a.requested / kSiteDropMax))
    flush_site_drops();  // does not move sites: st stays valid
  st.allocs++, st.alloc_bytes += a.requested, st.alloc_allocated += size;
  st.live_bytes += static_cast<std::int64_t>(a.requested), st.live_count++;
  if (st.live_bytes > st.max_live_bytes) {
    flush_site_drops();
    if (st.live_bytes > st.max_live_bytes) st.max_live_bytes = st.live_bytes;
  }
  thread_last(a.tid) = e->seq;

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
    if (const std::int64_t reserved = d.stat[kReservedBytes][0].current; reserved > d.frag_reserved_peak) {
      // After the allocation, as replay.cpp takes its snapshot: one moment for both.
      d.frag_reserved_peak = reserved, d.frag_reserved_ts = a.ts;
      d.frag_non_releasable = d.stat[kInactiveSplitBytes][0].current;
    }
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
      d.peak_held_ts = a.ts, d.peak_seq = e->seq, d.peak_alloc = allocs_, ++d.epoch;
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
    // The site's share, queued (model.h: SiteDrop). site() resolves the index, not the line
    // (and may grow sites: called before sites.data() is read).
    const auto* last = find_thread_last(e.tid);
    const Site& st = site(e.stack);
    const SiteDrop drop{e.requested, e.size, static_cast<std::uint32_t>(&st - sites.data()), last && *last == e.seq};
    if (e.requested < kSiteDropMax) {
      queue_site_drop(drop);
    } else {  // a damaged trace's size: applied now, after the queue (on_alloc's bound)
      flush_site_drops();
      apply_site_drop(drop);
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
  seg_add_block(k, e, -1);   // pooled: the key is the address
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

void Model::feed(const format::EventRecord& e) {
  switch (e.type) {
    case RecordType::alloc: ++info.events, on_alloc(e.alloc); break;
    case RecordType::free: ++info.events, on_free(e.free); break;
    case RecordType::free_completed: ++info.events, on_free_completed(e.free_completed); break;
    case RecordType::segment_alloc: ++info.events, on_segment(e.segment, false); break;
    case RecordType::segment_free: ++info.events, on_segment(e.segment, true); break;
    default: break;
  }
}

// flatten: the handlers and their helpers inline, once, in the loop over a batch (where a
// whole batch is prefetched and replayed: every batch but the last of a run).
__attribute__((flatten)) void Model::feed_batch(const format::EventRecord* e, std::size_t n,
                                                const format::EventRecord* ahead, std::size_t n_ahead) {
  const std::size_t both = n < n_ahead ? n : n_ahead;
  info.events += both;  // every batched record is an event (alloc, free, free_completed)
  for (std::size_t i = 0; i < both; ++i) {
    prefetch(ahead[i]);
    switch (e[i].type) {
      case RecordType::alloc: on_alloc(e[i].alloc); break;
      case RecordType::free: on_free(e[i].free); break;
      default: on_free_completed(e[i].free_completed); break;
    }
  }
  for (std::size_t i = both; i < n_ahead; ++i) prefetch(ahead[i]);
  for (std::size_t i = both; i < n; ++i) feed_rest(e[i]);
}

// A batch's records beyond its prefetches (the last batch of a run): feed(e), not inlined a
// second time into feed_batch.
__attribute__((noinline)) void Model::feed_rest(const format::EventRecord& e) { feed(e); }

// Inlined into feed_batch: the prefetches are prefetch_line's asm statements, which GCC
// cannot delete as it deleted __builtin_prefetch calls in a function of loads (flat_map.h).
// Without a branch on the record's type (but on the edges_ path, which few traces take):
// alloc, free and free_completed come in an order no predictor learns, and the switch here
// mispredicted about a third of the records (format::decode_batch_event says the same of
// the decoding; both measurably shortened the replay). Whether a site is an
// alloc's is computed, not branched on; a free's bitmap prefetch, which it does not need, is
// the line its free_completed will.
void Model::prefetch(const format::EventRecord& e) const {
  const std::uint64_t ptr = e.ptr();
  const AllocKind kind = e.kind();
  const bool is_alloc = e.type == RecordType::alloc, is_fc = e.type == RecordType::free_completed;
  live_.prefetch(key(ptr, kind));
  // An alloc's site counters (a line each: thousands of sites outgrow L1); another record's
  // prefetch loads the first site's line instead.
  const std::uint32_t stack = e.alloc_stack();
  const std::size_t site_idx = stack & (std::size_t{0} - static_cast<std::size_t>(is_alloc & (stack < sites.size())));
  base::prefetch_line(sites.data() + site_idx);
  if (kind != AllocKind::device_pooled) return;
  const SegHint* h = seg_hint(ptr);
  // Its segment's first line (find_segment, seg_add_block).
  if (h) base::prefetch_line(segs_.data() + h->slot);
  if (const auto* w = h ? bits_word(*h, ptr) : nullptr) {
    // The block's edges in its segment's bitmap (model_edges.cpp): a line covers 128 KiB
    // of the segment, so usually both edges.
    base::prefetch_line(w);
  } else if (edges_.size()) {
    // The block's edges (seg_add_block), when some segment keeps them in the hash map.
    if (is_alloc) {
      edges_.prefetch(ptr);
      edges_.prefetch(ptr + (e.alloc.size ? e.alloc.size : e.alloc.requested));
    } else if (is_fc) {
      edges_.prefetch(ptr);
      if (e.free_completed.size) edges_.prefetch(ptr + e.free_completed.size);  // the writer's size
    }
  }
}

}  // namespace gpuheap
