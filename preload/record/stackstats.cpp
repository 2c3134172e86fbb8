#include "preload/record/stackstats.h"

#include <atomic>

namespace gpuheap {
namespace preload {
namespace {

constexpr int kCounters = static_cast<int>(StackCounter::count);
constexpr int kThreadSlots = 255;  // one more, shared by the threads after them

constinit StackStatsSlot g_slots[kThreadSlots + 1] = {};
constinit std::atomic<int> g_next{0};
thread_local bool t_shared __attribute__((tls_model("initial-exec"))) = false;

}  // namespace

constinit thread_local StackStatsSlot* t_stackstats_own __attribute__((tls_model("initial-exec"))) = nullptr;

// A thread's first count takes a slot; a thread beyond the slots adds to the shared one.
void stackstats_add_slow(StackCounter c, std::uint64_t n) noexcept {
  std::atomic<std::uint64_t>* v = g_slots[kThreadSlots].v;
  if (!t_shared) {
    const int i = g_next.fetch_add(1, std::memory_order_relaxed);
    t_shared = i >= kThreadSlots;
    if (!t_shared) {
      t_stackstats_own = &g_slots[i];
      stackstats_add(c, n);
      return;
    }
  }
  v[static_cast<int>(c)].fetch_add(n, std::memory_order_relaxed);
}

void stackstats_read(std::uint64_t out[kCounters]) noexcept {
  for (int c = 0; c < kCounters; ++c) out[c] = 0;
  for (const StackStatsSlot& s : g_slots)
    for (int c = 0; c < kCounters; ++c) out[c] += s.v[c].load(std::memory_order_relaxed);
}

}  // namespace preload
}  // namespace gpuheap
