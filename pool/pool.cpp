// The caching pool (see pool.h). Follows PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) for sizes, pools, best fit, splitting and the OOM
// retry, but with cudaMalloc/cudaFree semantics instead of per-stream pools: cudaFree
// implicitly synchronizes the device, so a freed block is only reusable once every stream's
// work enqueued before the free has finished. We get that without synchronizing on every
// free by batching frees behind upstream fences (see seal() / reclaim_done()).
//
// Data structures (all under one mutex per Pool, so observer callbacks see pool order):
//   - Block nodes: address-ordered doubly linked list per segment (for coalescing), carved
//     from 64-block chunks and recycled through a free list, so steady-state alloc/free does
//     not call malloc.
//   - Free (reusable) blocks: one FreeIndex per pool kind (pool_free_index.h): best fit by
//     (size, address) through size bins with a bitmap, each bin an intrusive treap whose
//     links live in the blocks (no allocation on insert).
//   - Live blocks: open-addressing hash map start address -> Block (O(1) free lookup);
//     allocate_owned's blocks are left out (their single owner frees them by handle).
//   - Segments: std::map base -> Segment, only for find() and bulk release.
//   - Pending blocks: an unsealed FIFO, then FIFO batches each guarded by one fence.
//
// This file: construction, allocate/deallocate and lookups. Releasing memory, context
// teardown and statistics are in pool_release.cpp; Pool::Impl is in pool_impl.h.
#include "pool/pool.h"
#include "pool/pool_impl.h"

#include <iterator>
#include <mutex>
#include <new>

namespace gpuheap {
namespace pool {
namespace {
using Lock = std::lock_guard<impl::SpinFutexMutex>;
using impl::Batch;
using impl::Block;
using impl::round_up;
using impl::Segment;
using impl::State;
}  // namespace

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
      delete sg;
    }
    m.segments.clear();
    m.free_sets[0].clear();
    m.free_sets[1].clear();
    m.free_chunks();  // every block, in a segment or spare
    while (Batch* bt = m.spare_batches) {
      m.spare_batches = bt->next;
      delete bt;
    }
  }
  delete impl_;
}

PoolStatus Pool::allocate(std::size_t requested, PoolBlock* out, std::uint32_t tag) noexcept {
  return allocate(requested, out, tag, nullptr, nullptr);
}

PoolStatus Pool::allocate(std::size_t requested, PoolBlock* out, std::uint32_t tag, AllocHook hook,
                          void* arg) noexcept {
  Impl& m = *impl_;
  std::size_t s = 0;
  bool ok = round_up(requested ? requested : 1, m.cfg.round, &s);
  bool small = s <= m.cfg.small_max;
  Lock g(m.mu);
  Block* b = nullptr;
  if (ok && m.live.reserve_one()) b = m.serve(small, s, requested);
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
  if (hook) hook(arg, *out);
  return PoolStatus::ok;
}

bool Pool::deallocate(void* ptr, std::size_t* size_out) noexcept { return deallocate(ptr, size_out, nullptr, nullptr); }

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
  m.retire(b, true);
  return true;
}

// The same steps as allocate/deallocate without the lock and the address map (pool.h).
PoolStatus Pool::allocate_owned(std::size_t requested, OwnedBlock* out, std::uint32_t tag) noexcept {
  Impl& m = *impl_;
  std::size_t s = 0;
  bool ok = round_up(requested ? requested : 1, m.cfg.round, &s);
  Block* b = ok ? m.serve(s <= m.cfg.small_max, s, requested) : nullptr;
  if (!b) {
    ++m.ooms;
    return PoolStatus::out_of_memory;
  }
  b->state = State::live;
  b->tag = tag;
  m.allocated += b->size;
  ++m.nblocks, ++m.owned;
  out->ptr = reinterpret_cast<void*>(b->addr);
  out->size = b->size;
  out->handle = b;
  out->segment = b->seg->base;
  return PoolStatus::ok;
}

std::size_t Pool::deallocate_owned(void* handle) noexcept {
  Impl& m = *impl_;
  auto* b = static_cast<Block*>(handle);
  if (!b || b->state != State::live) return 0;
  std::size_t size = b->size;
  m.allocated -= size;
  --m.nblocks, --m.owned;
  m.retire(b, m.cfg.seal_interval_ns != 0);
  return size;
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

}  // namespace pool
}  // namespace gpuheap
