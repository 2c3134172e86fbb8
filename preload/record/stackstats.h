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
  fill_failures,  // walked stacks the cache cannot hold (a word off the stack, a rule it cannot check)
  native_frames,  // frames the walks returned
  python_frames,  // Python frames read
  count,
};

// Adds n to the calling thread's counter: no lock, no allocation, no atomic read-modify-write
// (each thread writes its own slot; threads beyond the slots share one, atomically).
void stackstats_add(StackCounter c, std::uint64_t n = 1) noexcept;

// The sums over every thread since the start (a forked child starts from its parent's).
void stackstats_read(std::uint64_t out[static_cast<int>(StackCounter::count)]) noexcept;

}  // namespace preload
}  // namespace gpuheap
