// The caching pool, continued (see pool.cpp for the design): giving cached memory back
// (trim, empty_cache), context teardown (abandon), sealing on demand, statistics and the
// consistency check. Pool::Impl is in pool_impl.h.
#include "pool/pool.h"
#include "pool/pool_impl.h"

#include <algorithm>
#include <mutex>

namespace gpuheap {
namespace pool {
namespace {
using Lock = std::lock_guard<impl::SpinFutexMutex>;
using impl::Batch;
using impl::Block;
using impl::FreeSet;
using impl::State;
}  // namespace

std::size_t Pool::trim(format::EmptyCacheReason reason) noexcept {
  Impl& m = *impl_;
  Lock g(m.mu);
  m.reclaim_done();  // only what the GPU has already finished with: never waits
  std::size_t rel = m.release_free_segments();
  if (rel) m.obs->on_empty_cache(rel, reason);
  return rel;
}

std::size_t Pool::empty_cache(format::EmptyCacheReason reason) noexcept {
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
  m.reserved = m.allocated = m.pending = m.nblocks = m.owned = 0;
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
    if (const Block* b = fs.last()) st.largest_free = std::max(st.largest_free, b->size);
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
  std::size_t reserved = 0, allocated = 0, pending = 0, live = 0, unmapped = 0, nfree[2] = {0, 0};
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
          if (const Block* f = m.live.find(b->addr)) {
            if (f != b) return false;
          } else {
            ++unmapped;  // allocate_owned's
          }
          break;
        case State::pending: pending += b->size; break;
        case State::free_:
          ++nfree[sg->small];
          if (b->next && b->next->state == State::free_) return false;  // not coalesced
          if (!m.free_sets[sg->small].contains(b)) return false;
          break;
      }
    }
    if (expect != base + sg->size) return false;
  }
  return reserved == m.reserved && allocated == m.allocated && pending == m.pending && live == m.nblocks &&
         unmapped == m.owned && live == m.live.size() + m.owned && nfree[0] == m.free_sets[0].size() &&
         nfree[1] == m.free_sets[1].size() && m.pending_kind[0] + m.pending_kind[1] == pending;
}

}  // namespace pool
}  // namespace gpuheap
