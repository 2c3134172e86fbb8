#include "preload/record/stackstats.h"

#include <atomic>

namespace gpuheap {
namespace preload {
namespace {

constexpr int kCounters = static_cast<int>(StackCounter::count);
constexpr int kThreadSlots = 255;  // one more, shared by the threads after them

struct alignas(64) Slot {
  std::atomic<std::uint64_t> v[kCounters];
};
constinit Slot g_slots[kThreadSlots + 1] = {};
constinit std::atomic<int> g_next{0};
thread_local Slot* t_slot __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local bool t_shared __attribute__((tls_model("initial-exec"))) = false;

}  // namespace

void stackstats_add(StackCounter c, std::uint64_t n) noexcept {
  if (!t_slot) {
    const int i = g_next.fetch_add(1, std::memory_order_relaxed);
    t_shared = i >= kThreadSlots;
    t_slot = &g_slots[t_shared ? kThreadSlots : i];
  }
  std::atomic<std::uint64_t>& a = t_slot->v[static_cast<int>(c)];
  if (t_shared) a.fetch_add(n, std::memory_order_relaxed);
  else  // this thread is the slot's only writer
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

void stackstats_read(std::uint64_t out[kCounters]) noexcept {
  for (int c = 0; c < kCounters; ++c) out[c] = 0;
  for (const Slot& s : g_slots)
    for (int c = 0; c < kCounters; ++c) out[c] += s.v[c].load(std::memory_order_relaxed);
}

}  // namespace preload
}  // namespace gpuheap
