// The caching pool's internal state and block-level algorithms (Pool::Impl), shared by
// pool.cpp (construction, allocate/deallocate, lookups: the hot path) and
// pool_release.cpp (giving memory back, context teardown, statistics, consistency check).
// Only those two files include it. The design notes are at the top of pool.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <new>

#include "pool/pool.h"
#include "pool/pool_containers.h"
#include "pool/pool_free_index.h"

namespace gpuheap {
namespace pool {
// Named, not anonymous: Pool::Impl is one type in two translation units (ODR).
namespace impl {

constexpr unsigned kClockEvery = 8;  // deallocate: frees between two clock reads

// false on overflow
inline bool round_up(std::size_t n, std::size_t m, std::size_t* out) noexcept {
  if (m == 0) m = 1;
  // The default rounding is a power of two: a mask, not a 64-bit division (tens of cycles).
  std::size_t r = (m & (m - 1)) == 0 ? n & (m - 1) : n % m;
  if (r == 0) return *out = n, true;
  if (n > SIZE_MAX - (m - r)) return false;
  *out = n + (m - r);
  return true;
}

struct Segment;
struct Block;
enum class State : std::uint8_t { free_, live, pending };

using FreeSet = FreeIndex<Block>;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Segment* seg = nullptr;
  Block* prev = nullptr;  // address neighbours inside seg
  Block* next = nullptr;
  Block* link = nullptr;  // pending FIFO / batch list / recycling list
  State state = State::free_;
  std::uint16_t fbin = 0;  // FreeIndex's bin while free (in what was padding)
  std::uint32_t tag = 0;   // caller's tag of a live block (the preload: its stack id)
  // Links of a free block in its free set (FreeIndex): intrusive, so inserting allocates
  // nothing and coalescing erases a neighbour without a search (meaningful only while
  // state == free_).
  Block* fl = nullptr;
  Block* fr = nullptr;
  Block* fp = nullptr;
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

// Block nodes come from chunks, not one malloc each: a pool's blocks then sit close
// together (best fit and coalescing walk from block to block), growth costs one malloc per
// kBlocksPerChunk blocks, and teardown frees chunks, not every block.
constexpr std::size_t kBlocksPerChunk = 64;
struct BlockChunk {
  BlockChunk* next = nullptr;
  Block blocks[kBlocksPerChunk];
};

}  // namespace impl

struct Pool::Impl {
  using State = impl::State;
  using Block = impl::Block;
  using Segment = impl::Segment;
  using Batch = impl::Batch;
  using FreeSet = impl::FreeSet;

  Impl(Upstream& u, PoolConfig c, PoolObserver* o) noexcept : up(u), cfg(c), obs(o ? o : &noop) {}

  Upstream& up;
  PoolConfig cfg;
  PoolObserver noop;
  PoolObserver* obs;
  mutable impl::SpinFutexMutex mu;
  FreeSet free_sets[2];
  impl::PtrMap<Block> live;
  std::map<std::uintptr_t, Segment*> segments;
  Block* spare_blocks = nullptr;
  impl::BlockChunk* chunks = nullptr;  // newest first; blocks[0, chunk_used) handed out
  std::size_t chunk_used = impl::kBlocksPerChunk;
  Batch* spare_batches = nullptr;
  Block* unsealed_head = nullptr;
  Block* unsealed_tail = nullptr;
  Batch* batch_head = nullptr;
  Batch* batch_tail = nullptr;
  std::uint64_t last_seal_ns = 0;
  bool sealed_once = false;
  unsigned frees_since_check = 0;
  std::size_t reserved = 0, allocated = 0, pending = 0, nblocks = 0;
  std::size_t owned = 0;                 // live blocks of allocate_owned: counted in nblocks, not in `live`
  std::size_t pending_kind[2] = {0, 0};  // [small]
  std::uint64_t retries = 0, ooms = 0;

  FreeSet& set_of(const Block* b) noexcept { return free_sets[b->seg->small]; }

  Block* new_block() noexcept {
    Block* b = spare_blocks;
    if (b) spare_blocks = b->link;
    else if (!(b = chunk_block())) return nullptr;
    *b = Block{};
    return b;
  }
  // Out of line: taken once per kBlocksPerChunk blocks, and kept out of the callers' hot code.
  [[gnu::noinline]] Block* chunk_block() noexcept {
    if (chunk_used == impl::kBlocksPerChunk) {
      auto* c = new (std::nothrow) impl::BlockChunk;
      if (!c) return nullptr;
      c->next = chunks, chunks = c, chunk_used = 0;
    }
    return &chunks->blocks[chunk_used++];
  }
  void free_chunks() noexcept {
    while (impl::BlockChunk* c = chunks) {
      chunks = c->next;
      delete c;
    }
    spare_blocks = nullptr, chunk_used = impl::kBlocksPerChunk;
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
    Block* b = fs.lower_bound(s);
    if (!b) return nullptr;
    if (!small) {
      if (s < cfg.max_split_size && b->size >= cfg.max_split_size) return nullptr;
      if (s >= cfg.max_split_size && b->size - s >= cfg.large_segment) return nullptr;
    }
    fs.erase(b);
    return carve(b, s, small);
  }

  // b is free and in no set; splits off the tail when the remainder is worth keeping.
  Block* carve(Block* b, std::size_t s, bool small) noexcept {
    std::size_t rem = b->size - s;
    bool split = small ? rem >= cfg.round : (s < cfg.max_split_size && rem > cfg.large_split_min);
    if (split) {
      if (Block* r = new_block()) {
        r->addr = b->addr + s, r->size = rem, r->seg = b->seg;
        r->prev = b, r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = s;
        free_sets[small].insert(r);
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
    else *ok = impl::round_up(s, cfg.huge_round, &seg);
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
    return carve(b, s, small);
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
    if (std::size_t rel = release_free_segments()) obs->on_empty_cache(rel, format::EmptyCacheReason::oom_retry);
    obs->on_retry(requested);
    ++retries;
    return grow(small, s);
  }

  // allocate()'s block choice, lock held (or single owner): reclaim what the GPU finished,
  // best fit, else the slow path. nullptr: out of memory.
  Block* serve(bool small, std::size_t s, std::size_t requested) noexcept {
    if (batch_head) reclaim_done();
    Block* b = take_fit(small, s);
    return b ? b : miss(small, s, requested);
  }

  // A live block was freed (counters already updated): it waits for a fence, which is
  // recorded at most once per seal interval. read_clock false: the interval is 0, so every
  // free seals and the clock (a virtual call) need not be read.
  void retire(Block* b, bool read_clock) noexcept {
    if (cfg.unsafe_reuse) {
      make_free(b);
      return;
    }
    b->state = State::pending;
    b->link = nullptr;
    if (unsealed_tail) unsealed_tail->link = b;
    else unsealed_head = b;
    unsealed_tail = b;
    pending += b->size;
    pending_kind[b->seg->small] += b->size;
    // One fence per interval, not per free: recording a fence costs an event record per
    // stream on the real device.
    // Reading the clock costs about as much as the rest of a free, so a run of frees checks
    // it on its first free and then every kClockEvery-th: a dense run seals a few frees late
    // (microseconds), a sparse one is checked every time.
    if (unsealed_head == b || ++frees_since_check >= impl::kClockEvery) {
      frees_since_check = 0;
      std::uint64_t now = read_clock ? up.now_ns() : 0;
      if (!sealed_once || now - last_seal_ns >= cfg.seal_interval_ns) seal(now);
    }
  }

  void fill(const Block* b, PoolBlock* out) const noexcept {
    out->ptr = reinterpret_cast<void*>(b->addr);
    out->size = b->size;
    out->small = b->seg->small;
    out->oversize = b->size >= cfg.max_split_size;
    out->tag = b->tag;
  }
};

}  // namespace pool
}  // namespace gpuheap
