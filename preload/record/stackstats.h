// What stack capture did, counted per thread and summed when read (gpuheap_stack_stats in
// preload/gpuheap.h): how many stacks the cache served, how many were walked and why the cache
// kept none of them. The cost of stacks in a real job depends on these, and no step time shows
// them apart.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpuheap {
namespace preload {

enum class StackCounter : int {
  captures,       // stacks taken
  cache_hits,     // served by the stack cache without a walk
  walks,          // libunwind walks (unw_backtrace), repeated ones included
  rewalks,        // walks repeated in full: the interpreter was deeper than the budget
  fills,          // cache entries made
  fill_waits,     // walked stacks not cached now: a key's first miss, a quiet key, rationing
  native_frames,  // frames the walks returned
  python_frames,  // Python frames read
  cache_stale,    // misses where a cached stack of that start failed on a saved rbp (not a caller)
  // Walked stacks the cache cannot hold, by why:
  fill_failed_size,       // more frames or words than an entry holds (or no cache memory)
  fill_failed_off_stack,  // a word read off the thread's stack (a signal stack, no known bounds)
  fill_failed_register,   // a register kept in another register, or rbp near the stack at the start
  fill_failed_walk,       // the stepping walk disagreed with unw_backtrace's
  count,
};

struct alignas(64) StackStatsSlot {
  std::atomic<std::uint64_t> v[static_cast<int>(StackCounter::count)];
};
// The calling thread's own slot, null until its first count (and for the threads beyond the
// slots, which share one). Inline so that a cache hit's three counts cost a few loads and stores
// each, not a call: a call per count added ~40 instructions to a ~380-instruction hit.
extern constinit thread_local StackStatsSlot* t_stackstats_own __attribute__((tls_model("initial-exec")));
void stackstats_add_slow(StackCounter c, std::uint64_t n) noexcept;

// Adds n to the calling thread's counter: no lock, no allocation, no atomic read-modify-write
// (each thread writes its own slot; threads beyond the slots share one, atomically).
inline void stackstats_add(StackCounter c, std::uint64_t n = 1) noexcept {
  if (StackStatsSlot* s = t_stackstats_own) {  // this thread is the slot's only writer
    std::atomic<std::uint64_t>& a = s->v[static_cast<int>(c)];
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  } else {
    stackstats_add_slow(c, n);
  }
}

// The sums over every thread since the start (a forked child starts from its parent's).
void stackstats_read(std::uint64_t out[static_cast<int>(StackCounter::count)]) noexcept;

}  // namespace preload
}  // namespace gpuheap
