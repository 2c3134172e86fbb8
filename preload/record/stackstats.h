// What stack capture did, counted per thread and summed when read (gpuheap_stack_stats in
// preload/gpuheap.h): how many stacks the cache served, how many were walked and why the cache
// kept none of them. The cost of stacks in a real job depends on these, and no step time shows
// them apart.
#pragma once

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

// Adds n to the calling thread's counter: no lock, no allocation, no atomic read-modify-write
// (each thread writes its own slot; threads beyond the slots share one, atomically).
void stackstats_add(StackCounter c, std::uint64_t n = 1) noexcept;

// The sums over every thread since the start (a forked child starts from its parent's).
void stackstats_read(std::uint64_t out[static_cast<int>(StackCounter::count)]) noexcept;

}  // namespace preload
}  // namespace gpuheap
