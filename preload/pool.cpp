// The caching pool (see pool.h). Follows PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) for sizes, pools, best fit, splitting and the OOM
// retry, but with cudaMalloc/cudaFree semantics instead of per-stream pools: cudaFree
// implicitly synchronizes the device, so a freed block is only reusable once every stream's
// work enqueued before the free has finished. We get that without synchronizing on every
// free by batching frees behind upstream fences (see seal() / reclaim_done()).
//
// Data structures (all under one mutex per Pool, so observer callbacks see pool order):
//   - Block nodes: address-ordered doubly linked list per segment (for coalescing), recycled
//     through a free list so steady-state alloc/free does not call malloc.
//   - Free (reusable) blocks: one std::set per pool kind ordered by (size, address) = best
//     fit in O(log n); set nodes come from a recycling arena.
//   - Live blocks: open-addressing hash map start address -> Block (O(1) free lookup).
//   - Segments: std::map base -> Segment, only for find() and bulk release.
//   - Pending blocks: an unsealed FIFO, then FIFO batches each guarded by one fence.
#include "preload/pool.h"
#include "preload/pool_containers.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <set>

namespace gpuheap {
namespace detail {
namespace {

using pool_impl::ArenaAlloc;
using pool_impl::NodeArena;
using pool_impl::PtrMap;
using Lock = std::lock_guard<pool_impl::SpinFutexMutex>;

constexpr int kOomRetryReason = 2;  // format::EmptyCacheReason::oom_retry
constexpr unsigned kClockEvery = 8;  // deallocate: frees between two clock reads

// false on overflow
bool round_up(std::size_t n, std::size_t m, std::size_t* out) noexcept {
  if (m == 0) m = 1;
  std::size_t r = n % m;
  if (r == 0) return *out = n, true;
  if (n > SIZE_MAX - (m - r)) return false;
  *out = n + (m - r);
  return true;
}

struct Segment;
enum class State : std::uint8_t { free_, live, pending };

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Segment* seg = nullptr;
  Block* prev = nullptr;  // address neighbours inside seg
  Block* next = nullptr;
  Block* link = nullptr;  // pending FIFO / batch list / recycling list
  State state = State::free_;
  std::uint32_t tag = 0;  // caller's tag of a live block (the preload: its stack id)
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool small = false;
  Block* first = nullptr;
};

struct Batch {
  Upstream::Fence fence = 0;
  Block* head = nullptr;
  Batch* next = nullptr;
};

struct BySizeAddr {
  bool operator()(const Block* a, const Block* b) const noexcept {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
};
using FreeSet = std::set<Block*, BySizeAddr, ArenaAlloc<Block*>>;

}  // namespace

struct Pool::Impl {
  Impl(Upstream& u, PoolConfig c, PoolObserver* o) noexcept
      : up(u), cfg(c), obs(o ? o : &noop) {}

  Upstream& up;
  PoolConfig cfg;
  PoolObserver noop;
  PoolObserver* obs;
  mutable pool_impl::SpinFutexMutex mu;
  NodeArena arena;  // before the sets: it must outlive their nodes
  FreeSet free_sets[2] = {FreeSet(ArenaAlloc<Block*>(&arena)), FreeSet(ArenaAlloc<Block*>(&arena))};
  PtrMap<Block> live;
  std::map<std::uintptr_t, Segment*> segments;
  Block* spare_blocks = nullptr;
  Batch* spare_batches = nullptr;
  Block* unsealed_head = nullptr;
  Block* unsealed_tail = nullptr;
  Batch* batch_head = nullptr;
  Batch* batch_tail = nullptr;
  std::uint64_t last_seal_ns = 0;
  bool sealed_once = false;
  unsigned frees_since_check = 0;
  std::size_t reserved = 0, allocated = 0, pending = 0, nblocks = 0;
  std::size_t pending_kind[2] = {0, 0};  // [small]
  std::uint64_t retries = 0, ooms = 0;

  FreeSet& set_of(const Block* b) noexcept { return free_sets[b->seg->small]; }

  Block* new_block() noexcept {
    if (Block* b = spare_blocks) {
      spare_blocks = b->link;
      *b = Block{};
      return b;
    }
    return new (std::nothrow) Block{};
  }
  void recycle(Block* b) noexcept {
    b->link = spare_blocks;
    spare_blocks = b;
  }

  // PyTorch's get_free_block rules for the large pool: a non-oversize request never takes an
  // oversize block (it would pin it unsplittable), and an oversize request takes one only if
  // it wastes less than one large segment.
  Block* take_fit(bool small, std::size_t s) noexcept {
    FreeSet& fs = free_sets[small];
    Block key;
    key.size = s;
    auto it = fs.lower_bound(&key);
    if (it == fs.end()) return nullptr;
    Block* b = *it;
    if (!small) {
      if (s < cfg.max_split_size && b->size >= cfg.max_split_size) return nullptr;
      if (s >= cfg.max_split_size && b->size - s >= cfg.large_segment) return nullptr;
    }
    // The remainder sorts just before b's old place in the common case (b was the largest
    // free block, e.g. a segment's tail), so that place is a good insertion hint.
    return carve(b, s, small, fs.erase(it));
  }

  // b is free and in no set; splits off the tail when the remainder is worth keeping.
  Block* carve(Block* b, std::size_t s, bool small, FreeSet::const_iterator hint) noexcept {
    std::size_t rem = b->size - s;
    bool split = small ? rem >= cfg.round
                       : (s < cfg.max_split_size && rem > cfg.large_split_min);
    if (split) {
      if (Block* r = new_block()) {
        r->addr = b->addr + s, r->size = rem, r->seg = b->seg;
        r->prev = b, r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = s;
        free_sets[small].insert(hint, r);
      }  // else: hand out the whole block (only when the host is out of memory)
    }
    return b;
  }

  // A pending block whose fence completed (or any block under unsafe_reuse) becomes reusable:
  // report it before anyone can take it, then merge with free neighbours.
  void make_free(Block* b) noexcept {
    obs->on_free_completed(reinterpret_cast<void*>(b->addr), b->size);
    b->state = State::free_;
    FreeSet& fs = set_of(b);
    if (Block* p = b->prev; p && p->state == State::free_) {
      fs.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      recycle(b);
      b = p;
    }
    if (Block* n = b->next; n && n->state == State::free_) {
      fs.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      recycle(n);
    }
    fs.insert(b);
  }

  // The interval limits fences recorded, so only a real record restarts it.
  void seal(std::uint64_t now) noexcept {
    if (!unsealed_head) return;
    Batch* bt = spare_batches;
    if (bt) spare_batches = bt->next;
    else if (!(bt = new (std::nothrow) Batch{})) return;
    Upstream::Fence f = up.fence_record();
    if (f == 0) {  // could not record: keep the blocks pending, try again at the next seal
      bt->next = spare_batches;
      spare_batches = bt;
      return;
    }
    last_seal_ns = now;
    sealed_once = true;
    bt->fence = f, bt->head = unsealed_head, bt->next = nullptr;
    if (batch_tail) batch_tail->next = bt;
    else batch_head = bt;
    batch_tail = bt;
    unsealed_head = unsealed_tail = nullptr;
  }

  void reclaim_oldest() noexcept {
    Batch* bt = batch_head;
    batch_head = bt->next;
    if (!batch_head) batch_tail = nullptr;
    for (Block* b = bt->head; b;) {
      Block* next = b->link;  // read first: make_free may recycle b
      pending -= b->size;
      pending_kind[b->seg->small] -= b->size;
      make_free(b);
      b = next;
    }
    up.fence_release(bt->fence);
    bt->next = spare_batches;
    spare_batches = bt;
  }
  // Only the oldest batches, in order: fences complete in recording order.
  void reclaim_done() noexcept {
    while (batch_head && up.fence_done(batch_head->fence)) reclaim_oldest();
  }
  void wait_oldest() noexcept {
    up.fence_wait(batch_head->fence);
    reclaim_oldest();
  }
  void wait_all() noexcept {
    if (unsealed_head) seal(up.now_ns());
    while (batch_head) wait_oldest();
  }

  std::size_t segment_size(bool small, std::size_t s, bool* ok) const noexcept {
    std::size_t seg = 0;
    if (small && s <= cfg.small_segment) seg = cfg.small_segment;
    else if (!small && s < cfg.medium_max && s <= cfg.large_segment) seg = cfg.large_segment;
    else *ok = round_up(s, cfg.huge_round, &seg);
    return seg;
  }

  Block* grow(bool small, std::size_t s) noexcept {
    bool ok = true;
    std::size_t seg_bytes = segment_size(small, s, &ok);
    if (!ok) return nullptr;
    if (cfg.limit && (seg_bytes > cfg.limit || reserved > cfg.limit - seg_bytes)) return nullptr;
    void* p = up.allocate(seg_bytes);
    if (!p) return nullptr;
    auto* sg = new (std::nothrow) Segment{};
    Block* b = new_block();
    if (!sg || !b) {
      delete sg;
      if (b) recycle(b);
      up.deallocate(p, seg_bytes);
      return nullptr;
    }
    sg->base = reinterpret_cast<std::uintptr_t>(p), sg->size = seg_bytes, sg->small = small;
    sg->first = b;
    segments.emplace(sg->base, sg);
    reserved += seg_bytes;
    obs->on_segment_alloc(p, seg_bytes, small);
    b->addr = sg->base, b->size = seg_bytes, b->seg = sg;
    return carve(b, s, small, free_sets[small].end());
  }

  std::size_t release_free_segments() noexcept {
    std::size_t released = 0;
    for (auto it = segments.begin(); it != segments.end();) {
      Segment* sg = it->second;
      Block* b = sg->first;
      if (b->state != State::free_ || b->size != sg->size) {
        ++it;
        continue;
      }
      free_sets[sg->small].erase(b);
      recycle(b);
      obs->on_segment_free(reinterpret_cast<void*>(sg->base), sg->size, sg->small);
      up.deallocate(reinterpret_cast<void*>(sg->base), sg->size);
      reserved -= sg->size;
      released += sg->size;
      delete sg;
      it = segments.erase(it);
    }
    return released;
  }

  // The slow path, in the order pool.h documents.
  Block* miss(bool small, std::size_t s, std::size_t requested) noexcept {
    if (unsealed_head) seal(up.now_ns());
    reclaim_done();
    if (Block* b = take_fit(small, s)) return b;
    // cudaFree would have synchronized anyway; waiting beats growing the footprint.
    while (batch_head && pending_kind[small] >= s) {
      wait_oldest();
      if (Block* b = take_fit(small, s)) return b;
    }
    if (Block* b = grow(small, s)) return b;
    wait_all();
    if (Block* b = take_fit(small, s)) return b;
    if (std::size_t rel = release_free_segments()) obs->on_empty_cache(rel, kOomRetryReason);
    obs->on_retry(requested);
    ++retries;
    return grow(small, s);
  }

  void fill(const Block* b, PoolBlock* out) const noexcept {
    out->ptr = reinterpret_cast<void*>(b->addr);
    out->size = b->size;
    out->small = b->seg->small;
    out->oversize = b->size >= cfg.max_split_size;
    out->tag = b->tag;
  }
};

Pool::Pool(Upstream& upstream, PoolConfig cfg, PoolObserver* observer) noexcept
    // Built with -fno-exceptions; a pool is created once per CUDA context, and a process out
    // of heap at that point cannot go on.
    : impl_(new Impl(upstream, cfg, observer)) {}  // NOLINT(bugprone-unhandled-exception-at-new)

Pool::~Pool() {
  Impl& m = *impl_;
  {
    Lock g(m.mu);
    m.wait_all();  // GPU work may still touch pending blocks
    for (auto& [base, sg] : m.segments) {
      m.up.deallocate(reinterpret_cast<void*>(base), sg->size);
      for (Block* b = sg->first; b;) {
        Block* n = b->next;
        delete b;
        b = n;
      }
      delete sg;
    }
    m.segments.clear();
    m.free_sets[0].clear();
    m.free_sets[1].clear();
    while (Block* b = m.spare_blocks) {
      m.spare_blocks = b->link;
      delete b;
    }
    while (Batch* bt = m.spare_batches) {
      m.spare_batches = bt->next;
      delete bt;
    }
  }
  delete impl_;
}

PoolStatus Pool::allocate(std::size_t requested, PoolBlock* out, std::uint32_t tag) noexcept {
  Impl& m = *impl_;
  std::size_t s = 0;
  bool ok = round_up(requested ? requested : 1, m.cfg.round, &s);
  bool small = s <= m.cfg.small_max;
  Lock g(m.mu);
  Block* b = nullptr;
  if (ok && m.live.reserve_one()) {
    if (m.batch_head) m.reclaim_done();
    b = m.take_fit(small, s);
    if (!b) b = m.miss(small, s, requested);
  }
  if (!b) {
    ++m.ooms;
    return PoolStatus::out_of_memory;
  }
  b->state = State::live;
  b->tag = tag;
  m.live.insert(b->addr, b);
  m.allocated += b->size;
  ++m.nblocks;
  m.fill(b, out);
  return PoolStatus::ok;
}

bool Pool::deallocate(void* ptr, std::size_t* size_out) noexcept {
  return deallocate(ptr, size_out, nullptr, nullptr);
}

bool Pool::contains(const void* ptr) const noexcept {
  Impl& m = *impl_;
  auto a = reinterpret_cast<std::uintptr_t>(ptr);
  Lock g(m.mu);
  auto it = m.segments.upper_bound(a);
  if (it == m.segments.begin()) return false;
  Segment* sg = std::prev(it)->second;
  return a - sg->base < sg->size;
}

bool Pool::deallocate(void* ptr, std::size_t* size_out, FreeHook hook, void* arg) noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  Block* b = m.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
  if (!b) return false;
  if (hook) {
    PoolBlock pb;
    m.fill(b, &pb);
    hook(arg, pb);
  }
  if (size_out) *size_out = b->size;
  m.allocated -= b->size;
  --m.nblocks;
  if (m.cfg.unsafe_reuse) {
    m.make_free(b);
    return true;
  }
  b->state = State::pending;
  b->link = nullptr;
  if (m.unsealed_tail) m.unsealed_tail->link = b;
  else m.unsealed_head = b;
  m.unsealed_tail = b;
  m.pending += b->size;
  m.pending_kind[b->seg->small] += b->size;
  // One fence per interval, not per free: recording a fence costs an event record per
  // stream on the real device.
  // Reading the clock costs about as much as the rest of a free, so a run of frees checks
  // it on its first free and then every kClockEvery-th: a dense run seals a few frees late
  // (microseconds), a sparse one is checked every time.
  if (m.unsealed_head == b || ++m.frees_since_check >= kClockEvery) {
    m.frees_since_check = 0;
    std::uint64_t now = m.up.now_ns();
    if (!m.sealed_once || now - m.last_seal_ns >= m.cfg.seal_interval_ns) m.seal(now);
  }
  return true;
}

bool Pool::find(const void* ptr, PoolBlock* out) const noexcept {
  Impl& m = *impl_;
  auto a = reinterpret_cast<std::uintptr_t>(ptr);
  Lock g(m.mu);
  if (Block* b = m.live.find(a)) return m.fill(b, out), true;
  auto it = m.segments.upper_bound(a);
  if (it == m.segments.begin()) return false;
  Segment* sg = std::prev(it)->second;
  if (a - sg->base >= sg->size) return false;
  // Walk the segment (<= small_segment/round blocks; off the hot path).
  for (Block* b = sg->first; b; b = b->next) {
    if (a < b->addr + b->size) {
      if (b->state != State::live) return false;
      return m.fill(b, out), true;
    }
  }
  return false;
}

void Pool::for_each_live(void (*fn)(void* arg, const PoolBlock& block), void* arg) const noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  PoolBlock pb;
  for (auto& [base, sg] : m.segments)
    for (Block* b = sg->first; b; b = b->next)
      if (b->state == State::live) {
        m.fill(b, &pb);
        fn(arg, pb);
      }
}

std::size_t Pool::trim(int reason) noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  m.reclaim_done();  // only what the GPU has already finished with: never waits
  std::size_t rel = m.release_free_segments();
  if (rel) m.obs->on_empty_cache(rel, reason);
  return rel;
}

std::size_t Pool::empty_cache(int reason) noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  m.wait_all();
  std::size_t rel = m.release_free_segments();
  m.obs->on_empty_cache(rel, reason);
  return rel;
}

std::size_t Pool::abandon(FreeHook hook, void* arg) noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  const std::size_t held = m.reserved;
  for (auto& [base, sg] : m.segments) {
    for (Block* b = sg->first; b;) {
      Block* next = b->next;
      PoolBlock pb;
      if (b->state == State::live) {
        m.live.erase(b->addr);
        if (hook) hook(arg, (m.fill(b, &pb), pb));
        // Freed and completed at once: nothing can still run on a dead context's memory.
        // Without the completion a replay would keep the block active (analyzer: a pooled
        // free stays active until free_completed).
        m.obs->on_free_completed(reinterpret_cast<void*>(b->addr), b->size);
      } else if (b->state == State::pending) {
        m.obs->on_free_completed(reinterpret_cast<void*>(b->addr), b->size);
      } else {
        m.free_sets[sg->small].erase(b);
      }
      m.recycle(b);
      b = next;
    }
    m.obs->on_segment_free(reinterpret_cast<void*>(base), sg->size, sg->small);
    delete sg;
  }
  m.segments.clear();
  while (Batch* bt = m.batch_head) {  // their fences died with the context
    m.batch_head = bt->next;
    bt->next = m.spare_batches;
    m.spare_batches = bt;
  }
  m.batch_tail = nullptr;
  m.unsealed_head = m.unsealed_tail = nullptr;
  m.reserved = m.allocated = m.pending = m.nblocks = 0;
  m.pending_kind[0] = m.pending_kind[1] = 0;
  return held;
}

void Pool::seal_pending() noexcept {
  Lock g(impl_->mu);
  impl_->seal(impl_->up.now_ns());
}

PoolStats Pool::stats() const noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  PoolStats st;
  st.reserved = m.reserved;
  st.allocated = m.allocated;
  st.pending = m.pending;
  st.cached_free = m.reserved - m.allocated;
  for (const FreeSet& fs : m.free_sets)
    if (!fs.empty()) st.largest_free = std::max(st.largest_free, (*fs.rbegin())->size);
  st.segments = m.segments.size();
  st.blocks = m.nblocks;
  st.retries = m.retries;
  st.ooms = m.ooms;
  return st;
}

std::size_t Pool::cached_unused() const noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  return m.reserved - m.allocated;
}

bool Pool::check_consistency() const noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  std::size_t reserved = 0, allocated = 0, pending = 0, live = 0, nfree[2] = {0, 0};
  for (auto& [base, sg] : m.segments) {
    if (base != sg->base || !sg->first || sg->first->prev || sg->first->addr != base) return false;
    reserved += sg->size;
    std::uintptr_t expect = base;
    for (Block* b = sg->first; b; b = b->next) {
      if (b->seg != sg || b->addr != expect || b->size == 0) return false;
      if (b->next && b->next->prev != b) return false;
      expect += b->size;
      switch (b->state) {
        case State::live:
          allocated += b->size, ++live;
          if (m.live.find(b->addr) != b) return false;
          break;
        case State::pending: pending += b->size; break;
        case State::free_:
          ++nfree[sg->small];
          if (b->next && b->next->state == State::free_) return false;  // not coalesced
          if (m.free_sets[sg->small].count(b) != 1) return false;
          break;
      }
    }
    if (expect != base + sg->size) return false;
  }
  return reserved == m.reserved && allocated == m.allocated && pending == m.pending &&
         live == m.nblocks && live == m.live.size() && nfree[0] == m.free_sets[0].size() &&
         nfree[1] == m.free_sets[1].size() && m.pending_kind[0] + m.pending_kind[1] == pending;
}

}  // namespace detail
}  // namespace gpuheap
