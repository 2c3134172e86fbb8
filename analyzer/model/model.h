// Replay of one trace into the state a caching allocator reports (torch.cuda.memory_stats()
// definitions), per device and pool, plus per-site statistics, peak consumers, leaks,
// fragmentation and OOM context. One pass, O(1) hash operations per event; memory grows
// with live allocations and distinct stacks only. Segment layouts (largest free block, free
// pieces) are not kept ordered per event: the per-event stats need only counts and
// neighbour checks, and the layout is rebuilt from the live blocks when a snapshot is taken.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "analyzer/base/flat_map.h"
#include "analyzer/model/stats.h"
#include "analyzer/trace/tables.h"
#include "format/trace.h"

namespace gpuheap {

// Per-site byte counts are what the program asked for (`bytes`, requested): the same for
// the same program every run. `allocated` is the rounded block bytes beside them, which
// depend on which cached block the pool happened to find (fence timing).
struct SiteBytes {
  std::uint32_t stack = 0;
  std::uint64_t bytes = 0, allocated = 0, count = 0;
};

namespace model {
// Largest requested bytes first, then by stack id, so equal sites list in a stable order.
void sort_sites(std::vector<SiteBytes>& v);
}  // namespace model

// Usage of a kind the pool does not serve (async, managed, vmm, host pinned, ...).
struct KindUsage {
  bool used = false;
  std::int64_t current = 0, peak = 0, total = 0;  // bytes; total = cumulative allocated
  std::int64_t count = 0, peak_count = 0, total_count = 0;
};

struct Fragmentation {
  bool valid = false;
  std::uint64_t ts = 0;                                   // trace clock
  std::uint64_t reserved = 0, allocated = 0, active = 0;  // pool (segment) bytes at the moment
  std::uint64_t free_bytes = 0, largest_free = 0, free_pieces = 0;
  // Filled at finish (needs the whole trace's median request):
  std::uint64_t median_request = 0, unusable_bytes = 0;
  double unusable_share = 0;               // unusable_bytes / reserved
  std::vector<std::uint64_t> piece_sizes;  // internal: free piece sizes, kept until finish
};

struct OomInfo {
  format::OomRecord rec;                                  // as recorded by the preload (stack id included)
  std::uint64_t model_reserved = 0, model_allocated = 0;  // replayed pool state
  std::uint64_t model_held = 0;  // replayed: reserved + async + managed + VMM physical (device bytes held)
  Fragmentation frag;
  std::vector<SiteBytes> top_live;  // live sites on that device at the OOM, largest first
};

struct DeviceState {
  int device = 0;
  std::string name;
  std::uint64_t total_memory = 0;
  DeviceStats stat;
  std::array<KindUsage, format::kNumAllocKinds> kinds{};
  std::uint64_t num_ooms = 0, num_alloc_retries = 0, empty_cache_calls = 0, empty_cache_released = 0;
  // This device's share of Model::leaked_bytes (requested bytes live at the end), for diff.
  std::uint64_t leaked_bytes = 0;

  // "Held" device memory (allocated pooled/pass-through/pitch + async + managed + vmm
  // physical). `held` counts block bytes (what a cap is charged); `held_requested` the
  // requested bytes of the same allocations, whose peak defines the peak consumers (so the
  // moment and the bytes do not move with the pool's block choice). peak_held is that peak,
  // peak_held_allocated the block bytes held at the same moment.
  std::int64_t held = 0, held_requested = 0, peak_held = 0, peak_held_allocated = 0;
  std::uint64_t peak_held_ts = 0, peak_seq = 0;
  // The peak's alloc record: the number of alloc records read up to and including it (a
  // second read of the trace finds the same moment by counting them: category_pass.h).
  std::uint64_t peak_alloc = 0;
  std::uint32_t epoch = 0;
  std::vector<SiteBytes> peak_consumers;  // at finish, largest first

  // Pool layout at the peak of allocated memory (the moment the layout matters; a reserved
  // plateau can outlast it by hours). The layout is not kept per event: at a new peak the
  // moment is remembered (frag_seq: blocks and segments born up to it were there) and,
  // while it stays the peak (frag_open), what has left the layout since (completed blocks,
  // released segments) is logged, so the layout at the peak = the live map and segments
  // born by frag_seq, plus the log; finish() rebuilds it once. The log holds only what was
  // there at the peak, so it never outgrows the live map at the peak (O(1) per event).
  Fragmentation frag_peak;
  // The fragmentation figure (fragmentation.h): non-releasable bytes (inactive_split_bytes)
  // at the first moment reserved reached its peak, as replay measures it.
  std::int64_t frag_reserved_peak = 0, frag_non_releasable = 0;
  std::uint64_t frag_reserved_ts = 0;
  bool frag_open = false;
  std::uint64_t frag_seq = 0, frag_ts = 0;
  struct Gone {
    std::uint64_t ptr = 0, size = 0;
    bool is_segment = false;
  };
  std::vector<Gone> frag_log;
  Timeline timeline;
  // Requested/allocated maxima since the last phase record (model_phases.cpp).
  std::int64_t phase_peak_requested = 0, phase_peak_allocated = 0;
  // A sampled series rose without a sample since the last one: a completion of a block whose
  // size reads negative (a damaged trace). Frees skip their sample only while this is clear.
  bool unsampled_rise = false;

  struct Acc {
    std::uint32_t epoch = 0;
    std::uint64_t bytes = 0, allocated = 0, count = 0;
  };
  // stack -> allocations live at the peak and freed since: indexed by stack id (ids are dense)
  // on the per-event path; `acc_wild` holds ids beyond the stacks seen (corrupt traces).
  std::vector<Acc> acc;
  base::FlatMap<Acc> acc_wild;
};

// Bytes are requested bytes; *_allocated the block bytes of the same allocations.
// Line-aligned, what every alloc and free of the replay touches first: one cache line per
// event (the one the replay prefetches), where the unaligned 72-byte layout put the live_*
// counters across two lines for every site.
struct alignas(64) Site {
  std::uint64_t allocs = 0, alloc_bytes = 0, alloc_allocated = 0;
  std::int64_t live_bytes = 0, live_count = 0, max_live_bytes = 0;
  std::uint64_t temporaries = 0, temporary_bytes = 0, temporary_allocated = 0;  // rarer: a second line
};

// One instance of a phase (analyzer/model/model_phases.cpp): a push..pop range on one thread, or
// a mark (start == end). Figures per device, index-aligned with Model::devices after finish.
struct PhaseDevice {
  int device = 0;
  std::int64_t peak_requested = 0, peak_allocated = 0;  // max of current inside the instance
  std::int64_t end_requested = 0, end_allocated = 0;    // live bytes at its end (growth)
  std::uint64_t allocs = 0;                             // allocations made inside it
  std::uint64_t allocs_base = 0;                        // internal: count at the start
};
struct PhaseInstance {
  std::string name;
  std::uint32_t tid = 0;
  int depth = 0;  // open ranges of the same thread around it
  bool mark = false, open_at_end = false;
  format::PhaseSource source = format::PhaseSource::api;
  std::uint64_t start = 0, end = 0;  // trace clock; a range is [start, end)
  std::vector<PhaseDevice> devices;
};

struct Leak {
  std::uint32_t stack = 0;
  std::uint64_t bytes = 0, allocated = 0, count = 0;  // requested, block bytes
};

class Model {
 public:
  explicit Model(std::string path = {}, std::size_t timeline_buckets = 2048);

  void feed(const format::Record& r);
  // The replay's fast path (model_events.cpp): the same as feed() of the equivalent Record,
  // for records that TraceReader::next_any decoded in place.
  void feed(const format::EventRecord& e);
  // Starts loading the hash slots that feed(e) will touch, for a record fed a few records
  // later: the replay's cost is cache misses on the live map, and independent misses overlap.
  // e: an alloc, free or free_completed (what TraceReader::next_events gives).
  void prefetch(const format::EventRecord& e) const;
  // feed() of e[0..n) with prefetch() of ahead[0..n_ahead) interleaved, a prefetch before
  // each record (the replay loop's batches: one call per batch; the prefetches spread out,
  // not 16 records' worth in a burst beyond the core's outstanding misses).
  void feed_batch(const format::EventRecord* e, std::size_t n, const format::EventRecord* ahead, std::size_t n_ahead);
  static bool batchable(format::RecordType t) {
    return t == format::RecordType::alloc || t == format::RecordType::free || t == format::RecordType::free_completed;
  }
  // Call once after the last record; completes peak consumers, leaks, fragmentation.
  void finish(bool cut_mid_record, bool has_end, std::uint64_t records);

  // Device totals used by the multi-trace merge (0 for a device never seen).
  struct Totals {
    std::int64_t requested = 0, allocated = 0, reserved = 0;
  };
  Totals totals(int device) const;

  TraceInfo info;
  std::vector<DeviceState> devices;  // sorted by device index at finish
  std::vector<Site> sites;           // indexed by stack id (0 = no stack)
  std::unordered_map<std::uint32_t, std::vector<std::uint64_t>> stacks;
  std::vector<OwnedModule> modules;
  std::unordered_map<std::uint32_t, PyCode> py_codes;  // by id
  StoredSymbols symbols;                               // frames stored by `gpuheap symbolize` (symbol_* records)
  std::map<std::uint32_t, std::string> threads;
  std::vector<OomInfo> ooms;
  std::vector<Leak> leaks;  // by site, largest (requested) first
  // Requested bytes live at the end (what check --max-leaked gates), and their block bytes.
  std::uint64_t leaked_bytes = 0, leaked_allocated_bytes = 0, leaked_count = 0;
  SizeHistogram requests;              // pooled / pass-through requested sizes
  std::vector<PhaseInstance> phases;   // in order of start (marks and ranges)
  std::uint64_t unmatched_pops = 0;    // pops with no open range on their thread (ignored)
  std::uint64_t untracked_ranges = 0;  // pushed while kMaxOpenPhases were open (matched, not kept)
  // Every phase record folds the maxima into each open range: the bound keeps a hostile
  // trace of nested pushes linear (real jobs nest a handful deep per thread).
  static constexpr std::size_t kMaxOpenPhases = 256;

  // Restricts peaks, sites, leaks, OOM counts to the union of [start, end) intervals of the
  // trace clock (summary --phase/--time/--after; analyzer/model/model_window.cpp). Call before
  // feeding. Phases and the timeline still cover the whole trace.
  void set_window(std::vector<std::pair<std::uint64_t, std::uint64_t>> intervals);
  bool windowed() const { return windowed_; }
  // Tests: keep every block edge in the hash map (the bitmaps' reference). Call before
  // feeding. One way: a damaged trace may have turned the bitmaps off for good.
  void disable_edge_bitmaps() { bits_off_ = true; }
  const std::vector<std::pair<std::uint64_t, std::uint64_t>>& window() const { return window_; }

  static constexpr std::size_t kMaxOomDetails = 64;
  static constexpr std::size_t kOomTopSites = 5;
  static constexpr std::size_t kMaxDevices = 1024;  // distinct ordinals; more is corruption
  // Block edges are tracked in bitmaps at 512-byte boundaries (model_edges.cpp).
  static constexpr unsigned kGranuleShift = 9;
  static constexpr std::uint64_t kGranuleMask = (std::uint64_t{1} << kGranuleShift) - 1;

 private:
  // One live allocation, 40 bytes (a 64-byte slot with its key): the live map is the
  // replay's working set, so its size is what the cache misses per event cost. The map key
  // is key(ptr, kind) (format::space_key: an xor of the address space's bits, its own inverse).
  struct Live {
    std::uint64_t size = 0, requested = 0, seq = 0;
    std::uint32_t stack = 0, tid = 0, seg = kNoSeg;
    std::uint16_t dev = 0;
    std::uint8_t kind = 0, flags = 0;  // flags: record flags; kPending marks a freed pooled block
  };
  static constexpr std::uint8_t kPending = 0x80;  // pooled: freed, waiting for free_completed
  // Line-aligned, what an event reads (find_segment, seg_add_block, seg_account) in its first
  // line: one line to prefetch and miss, not two (the unaligned 72-byte layout split most
  // segments across lines).
  struct alignas(64) Segment {
    std::uint64_t ptr = 0, size = 0;
    // The segment's block edges as a bitmap (model_edges.cpp), or null: they are in edges_.
    std::uint64_t* bits = nullptr;
    std::uint64_t active_bytes = 0;
    std::uint32_t active_blocks = 0, touches = 0;
    std::int64_t contrib_bytes = 0, contrib_count = 0;
    std::uint16_t dev = 0;
    bool small = false, oversize = false, alive = false;
    std::uint64_t born = 0;  // read at snapshots only
  };
  static constexpr std::uint32_t kNoSeg = ~0u;

  DeviceState& dev(int device);
  // Inline (several times per event), the rare paths out of line.
  std::uint16_t dev_index(int device) {
    if (std::int64_t{device} == last_dev_id_) return last_dev_index_;  // nearly every event: one device
    std::size_t i = 0;
    while (i < dev_ids_.size() && dev_ids_[i] != device) ++i;
    const std::uint16_t di = i < dev_ids_.size() ? static_cast<std::uint16_t>(i) : new_dev(device);
    last_dev_id_ = device, last_dev_index_ = di;
    return di;
  }
  std::int64_t last_dev_id_ = INT64_MIN;  // no int's value: none yet
  std::uint16_t last_dev_index_ = 0;
  std::uint16_t new_dev(int device);  // dev_index of a device not seen before
  Site& site(std::uint32_t stack) { return stack < sites.size() ? sites[stack] : site_grow(stack); }
  Site& site_grow(std::uint32_t stack);
  // Inline: hashed several times per event, also from model_events.cpp's prefetch.
  static std::uint64_t key(std::uint64_t ptr, format::AllocKind k) {
    // Each address space (format/rules.h, the preload's registry follows the same rule) in its
    // own key range: cuMemMap's address is inside a cuMemAddressReserve range and may equal its start.
    return format::space_key(ptr, k);
  }
  static bool pending(const Live& e) { return e.flags & kPending; }
  void touch_ts(std::uint64_t ts) {
    if (!info.have_ts) info.first_ts = ts, info.have_ts = true;
    if (ts > info.last_ts) info.last_ts = ts;
    if (ts >= next_edge_) cross_edges(ts);  // UINT64_MAX without a window: never
  }
  void on_phase(const format::PhaseRecord& p);
  void fold_phase_peaks();
  void finish_phases();
  void cross_edges(std::uint64_t ts);
  void enter_window(std::uint64_t ts);
  void leave_window();
  void freeze_device(std::size_t i);
  void finish_window();
  bool counting() const { return !windowed_ || in_window_; }

  void feed_rest(const format::EventRecord& e);  // feed(e), kept out of feed_batch's loop
  void on_alloc(const format::AllocRecord& a);
  void on_free(const format::FreeRecord& f);
  void on_free_completed(const format::FreeCompletedRecord& f);
  void on_segment(const format::SegmentRecord& s, bool is_free);
  void on_oom(const format::OomRecord& o);
  // Snapshot records (model_seed.cpp): collected until the `end` part, then seeded.
  void on_snapshot(const format::SnapshotRecord& r);
  void seed_window();
  struct Seed {
    std::vector<format::SnapshotRecord> devices;  // device parts (no entries)
    std::vector<format::SnapLive> live;
    std::vector<format::SnapFreed> freed;
    std::vector<format::SnapSite> sites;
    bool open = false;
  };
  Seed seed_;
  void release(std::uint64_t k, Live& e, std::uint64_t ts, bool completes);
  void complete(std::uint64_t k, Live& e);
  void seg_add_block(std::uint64_t ptr, const Live& e, int sign);
  void seg_edges_hash(std::uint64_t ptr, const Live& e, int sign);  // its edges_ path
  // A block of `size` bytes touching t boundaries joins (sign > 0) or leaves its segment.
  void seg_account(Segment& s, std::uint64_t size, std::uint32_t t, int sign) {
    if (sign > 0) {
      s.active_bytes += size, s.active_blocks++, s.touches += t;
    } else {
      s.active_bytes -= size, s.active_blocks--, s.touches -= t;
    }
    seg_update(s);
  }
  // Inline: twice per pooled event. Recomputes a segment's share of the non-releasable
  // stats: a segment with at least one active block cannot be released, so all its free
  // bytes (and free pieces) count.
  void seg_update(Segment& s) {
    std::int64_t nb = 0, nc = 0;
    if (s.active_blocks > 0) {
      nb = static_cast<std::int64_t>(s.size - s.active_bytes);
      // Free pieces = gaps between active blocks: k blocks leave k+1 candidate gaps, minus
      // every boundary where a block touches its neighbour or the segment edge.
      nc = static_cast<std::int64_t>(s.active_blocks) + 1 - static_cast<std::int64_t>(s.touches);
    }
    auto& d = devices[s.dev];
    int pool = s.small ? kSmallPool : kLargePool;
    if (nb != s.contrib_bytes) pool_stats(d, pool, kInactiveSplitBytes, nb - s.contrib_bytes);
    if (nc != s.contrib_count) pool_stats(d, pool, kInactiveSplit, nc - s.contrib_count);
    s.contrib_bytes = nb, s.contrib_count = nc;
  }
  // Block-edge bitmaps (model_edges.cpp; bits_add/bits_remove in model_events.cpp).
  // Boundary p's two bits (2p: a block starts there, 2p+1: one ends there) as kEdgeStart and
  // kEdgeEnd: one load for both (an even bit and the next never straddle a word).
  static constexpr unsigned kEdgeStart = 1, kEdgeEnd = 2;
  static unsigned edge_pair(const std::uint64_t* w, std::uint64_t p) {
    return static_cast<unsigned>(w[p >> 5] >> ((2 * p) & 63)) & 3;
  }
  int bits_add(Segment& s, std::uint64_t a, std::uint64_t b);
  int bits_remove(Segment& s, std::uint64_t a, std::uint64_t b);
  void bits_birth(std::uint32_t slot);
  void bits_drop(Segment& s, bool to_edges);
  void edges_to_hash();
  std::uint32_t find_segment(std::uint64_t ptr);
  // Inline: called up to a dozen times per event. Stat::add less its `freed` (allocated -
  // current, for every Stat of the model: derive_freed() fills it in where it is read), to
  // `all` and to the pool together, one sign test for both.
  void pool_stats(DeviceState& d, int pool, Metric m, std::int64_t delta) {
    if (delta > 0) {
      rise(d.stat.pool(kAllPools), d.stat.pool(pool), m, delta);
    } else {
      fall(d.stat.pool(kAllPools), d.stat.pool(pool), m, delta);
    }
  }
  // pool_stats of a delta known to be >= 0 (0 changes nothing: peak >= current holds while
  // events are fed, kParked outside a window included): current, allocated, peak.
  static void rise(DeviceStats::Pool& all, DeviceStats::Pool& pool, Metric m, std::int64_t d) {
    all[m].current += d, all[m].allocated += d;
    pool[m].current += d, pool[m].allocated += d;
    if (all[m].current > all[m].peak) all[m].peak = all[m].current;
    if (pool[m].current > pool[m].peak) pool[m].peak = pool[m].current;
  }
  // pool_stats of a delta known to be <= 0: only current moves.
  static void fall(DeviceStats::Pool& all, DeviceStats::Pool& pool, Metric m, std::int64_t d) {
    all[m].current += d, pool[m].current += d;
  }
  void derive_freed();
  void sample(DeviceState& d, std::uint64_t ts);
  Fragmentation snapshot(std::uint16_t dev_idx, std::uint64_t ts) const;
  // Layout of the blocks and segments born by max_seq that are still there, plus `gone`.
  Fragmentation layout(std::uint16_t dev_idx, std::uint64_t max_seq, const std::vector<DeviceState::Gone>& gone) const;
  Fragmentation peak_layout(std::uint16_t dev_idx) const;
  // A block or segment leaves the layout: logged while it was there at the open peak (inline:
  // once per completed block, nearly always a test that fails).
  void frag_gone(std::uint16_t dev_idx, std::uint64_t seq, std::uint64_t ptr, std::uint64_t size, bool segment) {
    auto& d = devices[dev_idx];
    if (d.frag_open && seq <= d.frag_seq) d.frag_log.push_back({ptr, size, segment});
  }
  void complete_pending();
  void finish_fragmentation(Fragmentation& f) const;

  void add_acc(DeviceState& d, const Live& e);

  base::FlatMap<Live> live_;
  // Address -> number of active segment blocks starting / ending there: answers "does a
  // neighbour touch this block" in O(1) for the free-piece count, one slot per block edge,
  // for the segments without a bitmap (below).
  struct Edges {
    std::uint32_t starts = 0, ends = 0;
  };
  base::FlatMap<Edges, 2> edges_;  // entries come and go every event: kept at most 1/4 full
  // Segments of up to kBitsMaxSegment bytes keep their block edges in a bitmap instead
  // (model_edges.cpp says when and why): two bits per 512-byte boundary, owned here by slot.
  static constexpr std::uint64_t kBitsMaxSegment = std::uint64_t{32} << 20;
  static constexpr std::uint64_t kBitsBudget = std::uint64_t{16} << 20;  // bytes, all segments
  std::vector<std::unique_ptr<std::uint64_t[]>> seg_bits_;
  std::uint64_t bits_bytes_ = 0;
  bool bits_off_ = false;  // a damaged trace (or a test): every edge in edges_ from now on
  // tid -> seq of its last allocation, looked up at every alloc and release: a direct-mapped
  // table (tid & 63; key tid + 1, 0 empty) in front of a hash map for the tids whose entry
  // another tid holds. Entries are never removed, so a tid is always where it was first put.
  struct ThreadLast {
    std::uint64_t key = 0, seq = 0;
  };
  static constexpr std::size_t kThreadSlots = 64;  // power of two
  std::array<ThreadLast, kThreadSlots> thread_slots_{};
  base::FlatMap<std::uint64_t> thread_last_;
  std::uint64_t& thread_last(std::uint32_t tid) {
    auto& t = thread_slots_[tid & (kThreadSlots - 1)];
    const std::uint64_t key = std::uint64_t{tid} + 1;
    if (t.key == key) return t.seq;
    if (t.key == 0) {
      t.key = key;
      return t.seq;
    }
    return thread_last_.get(tid);
  }
  const std::uint64_t* find_thread_last(std::uint32_t tid) const {
    const auto& t = thread_slots_[tid & (kThreadSlots - 1)];
    if (t.key == std::uint64_t{tid} + 1) return &t.seq;
    return t.key == 0 ? nullptr : thread_last_.find(tid);
  }
  // What a release takes off its site (live bytes and count, temporaries), applied a few
  // releases later: the site is known only from the live entry that the release itself has
  // just loaded, too late to prefetch, and its line was one of the replay's costliest cache
  // misses. A release queues its drop and prefetches the line; the drop is applied when
  // kSiteDrops later ones have been queued, or before anything reads the sites
  // (flush_site_drops: every record that feed(const format::Record&) takes, window edges,
  // finish, and an alloc whose site's live bytes exceed its maximum, the one reader on the
  // way; segment records, which read no site, go by feed(const EventRecord&) without it).
  // Drops of kSiteDropMax bytes or more (a damaged trace's sizes) are applied at once, and
  // on_alloc applies the queue first where sizes or live bytes leave the range in which its
  // test of the maximum is exact (kSiteLiveMax).
  static constexpr std::uint64_t kSiteDropMax = std::uint64_t{1} << 48;
  static constexpr std::int64_t kSiteLiveMax = std::int64_t{1} << 61;
  struct SiteDrop {
    std::uint64_t requested = 0, allocated = 0;
    std::uint32_t site = 0;  // index into sites (site() resolved at the release)
    bool temporary = false;
  };
  static constexpr std::size_t kSiteDrops = 16;  // power of two
  std::array<SiteDrop, kSiteDrops> site_drops_{};
  std::size_t site_drops_head_ = 0, n_site_drops_ = 0;
  void apply_site_drop(const SiteDrop& x) {
    auto& st = sites[x.site];
    st.live_bytes -= static_cast<std::int64_t>(x.requested), st.live_count--;
    if (x.temporary) st.temporaries++, st.temporary_bytes += x.requested, st.temporary_allocated += x.allocated;
  }
  void queue_site_drop(const SiteDrop& x) {
    if (n_site_drops_ == kSiteDrops) {
      apply_site_drop(site_drops_[site_drops_head_]);
      site_drops_head_ = (site_drops_head_ + 1) & (kSiteDrops - 1);
      --n_site_drops_;
    }
    site_drops_[(site_drops_head_ + n_site_drops_) & (kSiteDrops - 1)] = x;
    ++n_site_drops_;
    base::prefetch_line(&sites[x.site]);
  }
  void flush_site_drops() {
    for (; n_site_drops_; --n_site_drops_) {
      apply_site_drop(site_drops_[site_drops_head_]);
      site_drops_head_ = (site_drops_head_ + 1) & (kSiteDrops - 1);
    }
  }
  std::vector<Segment> segs_;
  std::vector<std::uint32_t> free_segs_;
  // Live segments sorted by start: starts and slots in parallel arrays, so the per-alloc
  // search runs over a dense array of u64 (a few KB, cache resident).
  std::vector<std::uint64_t> seg_starts_;
  std::vector<std::uint32_t> seg_slots_;
  // find_segment's cache: 2 MiB granule of an address -> the segment last found for it. A
  // hit needs only that the segment is still alive and contains the address: that identifies
  // find_segment's answer while live segments neither overlap nor have size 0 (a segment
  // born or released since cannot change it, so no generation to invalidate: the replay of a
  // growing pool kept missing). The first segment that overlaps or is empty (a damaged
  // trace) turns the cache off (seg_overlap_).
  // That hit test reads the segment, never what follows.
  // A hint also holds, for prefetch() alone, where its segment starts and its bitmap (with
  // the bytes it covers; 0 without one), as when the hint was set: prefetch() then finds the
  // bitmap word without loading the segment (a dependent load that often missed the cache),
  // and only prefetches the segment's line. A hint is forgotten
  // whenever its slot's segment or bitmap changes (seg_hints_forget), so these stay true;
  // nothing but prefetches reads them.
  struct SegHint {
    std::uint64_t granule = ~std::uint64_t{0};  // no address's granule (ptr >> 21)
    std::uint64_t seg_ptr = 0;
    const std::uint64_t* bits = nullptr;
    std::uint32_t slot = kNoSeg;
    std::uint32_t bits_span = 0;  // bitmaps cover segments of at most kBitsMaxSegment bytes
  };
  static constexpr std::size_t kSegHints = 1024;  // power of two
  std::vector<SegHint> seg_hints_ = std::vector<SegHint>(kSegHints);
  bool seg_overlap_ = false;
  std::uint32_t find_segment_slow(std::uint64_t ptr) const;
  void seg_hints_forget(std::uint32_t slot);
  // prefetch(): the hint for ptr's granule, or null.
  const SegHint* seg_hint(std::uint64_t ptr) const {
    const auto& h = seg_hints_[(ptr >> 21) & (kSegHints - 1)];
    return h.granule == ptr >> 21 ? &h : nullptr;
  }
  // prefetch(): the bitmap word of ptr's boundary, in the segment hint h names for it (null
  // when ptr is outside, or there is no bitmap).
  static const std::uint64_t* bits_word(const SegHint& h, std::uint64_t ptr) {
    if (ptr - h.seg_ptr >= h.bits_span) return nullptr;
    return h.bits + ((ptr - h.seg_ptr) >> (kGranuleShift + 5));  // 2 bits per boundary, 64 a word
  }
  std::vector<int> dev_ids_;  // device index per DeviceState (parallel to devices)
  // Phases: open instances (indexes into phases) per thread, innermost last; kUntracked for
  // a push beyond kMaxOpenPhases. open_phases_: the tracked open ones, for the fold.
  static constexpr std::size_t kUntracked = ~std::size_t{0};
  std::map<std::uint32_t, std::vector<std::size_t>> phase_stack_;
  std::vector<std::size_t> open_phases_;
  // Window (model_window.cpp): edges of the merged intervals; state saved while outside.
  struct DevWin {
    DeviceStats acc;   // peak: saved; allocated/freed: summed inside
    DeviceStats base;  // allocated/freed at the last entry
    std::array<KindUsage, format::kNumAllocKinds> kacc{}, kbase{};
    std::int64_t peak_held = 0;
  };
  std::vector<std::pair<std::uint64_t, std::uint64_t>> window_;
  std::size_t edge_ = 0;  // index of the next edge: interval edge_/2, start if even
  std::uint64_t next_edge_ = ~std::uint64_t{0};
  bool windowed_ = false, in_window_ = false;
  std::uint64_t entry_seq_ = 0;
  std::vector<DevWin> dev_win_;
  std::vector<Site> site_acc_, site_base_;
  base::FlatMap<Leak> win_leaks_;
  std::uint64_t win_leaked_bytes_ = 0, win_leaked_allocated_ = 0, win_leaked_count_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t allocs_ = 0;  // alloc records read (DeviceState::peak_alloc)
  std::size_t timeline_buckets_;
  bool finished_ = false;
};

}  // namespace gpuheap
