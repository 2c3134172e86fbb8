// The caching pool: serves cudaMalloc/cuMemAlloc_v2 from segments taken from an abstract
// upstream (RMM's design), so it is unit-tested on host memory with limiting and delaying
// upstreams. One Pool per device. Never throws; never calls into the recorder directly —
// it reports through PoolObserver, whose callbacks run under the pool lock (so trace order
// matches pool order: a block's free_completed is recorded before anyone can reuse it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"  // EmptyCacheReason: the pool says why it released, the trace records it

namespace gpuheap {
namespace pool {

// What the pool needs from "the GPU". The CUDA implementation (cuda_upstream.h) uses the
// real driver API; tests use host memory.
class Upstream {
 public:
  virtual ~Upstream() = default;
  // A segment of exactly `bytes` (already rounded by the pool), or nullptr when the device
  // is out of memory.
  virtual void* allocate(std::size_t bytes) noexcept = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;

  // A fence captures "all GPU work enqueued so far on every stream of this device".
  // cudaFree implicitly waits for earlier GPU work (CUDA Runtime API, cudaFree: "will do an
  // implicit device synchronize"), so a freed block may be reused only once a fence recorded
  // after its free has completed. 0 is never a valid fence: fence_record returns it when no
  // fence can be recorded now (e.g. during a stream capture); the blocks then stay pending.
  using Fence = std::uint64_t;
  virtual Fence fence_record() noexcept = 0;
  virtual bool fence_done(Fence f) noexcept = 0;  // non-blocking
  virtual void fence_wait(Fence f) noexcept = 0;  // blocks the host until done
  virtual void fence_release(Fence f) noexcept = 0;
  // Monotonic clock in ns (injectable for tests).
  virtual std::uint64_t now_ns() noexcept = 0;
};

// Trace hooks, called with the pool lock held. Default: no-ops.
class PoolObserver {
 public:
  virtual ~PoolObserver() = default;
  virtual void on_segment_alloc(void* /*ptr*/, std::size_t /*size*/, bool /*small*/) noexcept {}
  virtual void on_segment_free(void* /*ptr*/, std::size_t /*size*/, bool /*small*/) noexcept {}
  virtual void on_free_completed(void* /*ptr*/, std::size_t /*size*/) noexcept {}
  virtual void on_retry(std::size_t /*requested*/) noexcept {}
  virtual void on_empty_cache(std::size_t /*released*/, format::EmptyCacheReason /*reason*/) noexcept {}
};

struct PoolConfig {
  std::size_t round = 512;                 // every request rounds up to a multiple
  std::size_t small_max = 1u << 20;        // requests <= 1 MiB: small pool
  std::size_t small_segment = 2u << 20;    // small-pool segments are 2 MiB
  std::size_t medium_max = 10u << 20;      // requests < 10 MiB take large_segment
  std::size_t large_segment = 20u << 20;   // 20 MiB segments for (1 MiB, 10 MiB)
  std::size_t huge_round = 2u << 20;       // >= 10 MiB: own segment rounded to 2 MiB
  std::size_t large_split_min = 1u << 20;  // large blocks split only if remainder > 1 MiB
  std::size_t max_split_size = SIZE_MAX;   // blocks >= this are never split ("oversize")
  // Record a fence over pending frees at most this often. deallocate() reads the clock on
  // the first free after a seal and then every 8th free; a miss always seals.
  std::uint64_t seal_interval_ns = 200000;
  bool unsafe_reuse = false;  // TEST ONLY: reuse freed blocks without fences
  std::size_t limit = 0;      // per-device cap on reserved bytes, 0 = none
};

struct PoolBlock {
  void* ptr = nullptr;
  std::size_t size = 0;  // rounded block size handed out
  bool small = false;    // from the small pool
  bool oversize = false;
  std::uint32_t tag = 0;  // what allocate() was given (the preload stores the stack id)
};

// What allocate_owned hands out: the block, its handle for deallocate_owned, and the base
// of the segment it lies in (the replay keeps per-segment figures by it).
struct OwnedBlock {
  void* ptr = nullptr;
  std::size_t size = 0;
  void* handle = nullptr;
  std::uintptr_t segment = 0;
};

struct PoolStats {
  std::size_t reserved = 0;      // bytes in segments
  std::size_t allocated = 0;     // bytes in blocks handed out and not freed
  std::size_t pending = 0;       // freed, waiting for a fence
  std::size_t cached_free = 0;   // free and reusable now or later (reserved - allocated)
  std::size_t largest_free = 0;  // largest free (reusable) block
  std::size_t segments = 0;
  std::size_t blocks = 0;  // live blocks
  std::uint64_t retries = 0, ooms = 0;
};

enum class PoolStatus { ok, out_of_memory };

class Pool {
 public:
  explicit Pool(Upstream& upstream, PoolConfig cfg = {}, PoolObserver* observer = nullptr) noexcept;
  // Waits for all fences, returns every segment upstream (live blocks included); calls no
  // observer (only called in tests / teardown, when the recorder may be gone).
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Order on a miss: reclaim completed fences -> best fit -> seal pending + wait for the
  // oldest fences if pending bytes could serve the request -> grow upstream -> on upstream
  // failure: wait all fences, release every fully free segment, on_retry, retry once ->
  // out_of_memory (stats().ooms++).
  PoolStatus allocate(std::size_t requested, PoolBlock* out, std::uint32_t tag = 0) noexcept;
  // Same, calling hook(arg, block) under the pool lock once the block is handed out: the
  // preload records the allocation there, as it records frees, so the trace lists pooled
  // events in the order the pool served them even when threads race (replay depends on it:
  // a record written after the lock is dropped can land behind another thread's later
  // allocation, and replaying the two the other way round picks other blocks).
  using AllocHook = void (*)(void* arg, const PoolBlock& block) noexcept;
  PoolStatus allocate(std::size_t requested, PoolBlock* out, std::uint32_t tag, AllocHook hook, void* arg) noexcept;
  // false when ptr is not the start of a live block of this pool (caller passes it on).
  bool deallocate(void* ptr, std::size_t* size_out = nullptr) noexcept;
  // Same, calling hook(arg, block) under the pool lock once the block is validated and
  // before it can be handed out again: the preload records the free there, so the trace
  // never shows the address reused before it was freed.
  using FreeHook = void (*)(void* arg, const PoolBlock& block) noexcept;
  bool deallocate(void* ptr, std::size_t* size_out, FreeHook hook, void* arg) noexcept;
  // Single-owner entry points, for `gpuheap replay` (analyzer/replay/replay.cpp): one thread drives
  // the pool and keeps its own index of live blocks, so these take no lock and leave the
  // pool's address map alone (a lock and a hash probe per call that the replay does not
  // need). The pool makes the same choices as through allocate/deallocate (best fit,
  // splits, fences, observer calls, in the same order); find(), contains() and
  // for_each_live() see these blocks, deallocate(ptr) does not. Never call them while
  // another thread may use the pool. deallocate_owned takes a handle allocate_owned gave
  // and that was not freed since; it returns the block's size (0: the handle is not a live
  // block's, and nothing was done).
  PoolStatus allocate_owned(std::size_t requested, OwnedBlock* out, std::uint32_t tag = 0) noexcept;
  std::size_t deallocate_owned(void* handle) noexcept;
  // True when ptr lies inside one of this pool's segments (live block or not): such a
  // pointer must never reach the real free.
  bool contains(const void* ptr) const noexcept;
  // Block containing ptr (start or interior) that is live; false otherwise. O(1) for a block
  // start; interior pointers cost O(log segments + blocks in that segment) (off the hot path).
  bool find(const void* ptr, PoolBlock* out) const noexcept;
  // Waits for all fences, returns every fully free segment upstream; returns bytes released.
  std::size_t empty_cache(format::EmptyCacheReason reason = format::EmptyCacheReason::api) noexcept;
  // Calls fn for every live block, under the pool lock (O(blocks); the OOM report uses it).
  void for_each_live(void (*fn)(void* arg, const PoolBlock& block), void* arg) const noexcept;
  // Like empty_cache without waiting: reclaims completed fences only, then releases fully
  // free segments (the GPUHEAP_RELEASE_THRESHOLD policy on the free path).
  std::size_t trim(format::EmptyCacheReason reason) noexcept;
  // The context is gone (cudaDeviceReset, cuCtxDestroy) and its memory with it: forgets
  // every segment and block without giving anything back upstream or touching fences.
  // Calls hook then on_free_completed for each live block, on_free_completed for pending
  // ones, on_segment_free for each segment; returns the bytes the segments held.
  std::size_t abandon(FreeHook hook, void* arg) noexcept;
  // Records a fence over the pending frees not yet behind one, now (not at the next seal
  // interval): a stream about to be destroyed must be in that fence (cudaStreamDestroy).
  void seal_pending() noexcept;
  PoolStats stats() const noexcept;
  // Free bytes that a cudaMemGetInfo caller could still get: cached and not in use.
  std::size_t cached_unused() const noexcept;
  // Test/debug aid, O(n): walks every segment and checks the pool's internal invariants
  // (blocks tile each segment, free neighbours coalesced, sets/maps/counters agree).
  bool check_consistency() const noexcept;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace pool
}  // namespace gpuheap
