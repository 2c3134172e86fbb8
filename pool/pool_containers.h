// Containers behind the caching pool (pool_impl.h only): an open-addressing pointer map for
// live blocks (it keeps the steady-state allocate/deallocate path free of malloc) and the
// pool's lock. The free-block index is in pool_free_index.h.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

namespace gpuheap {
namespace pool {
// Own namespace: libgpuheap.so links every preload/*.cpp, so avoid ODR clashes on names.
namespace impl {

// Open addressing, linear probing, backward-shift deletion; key 0 = empty (no block is at 0).
template <class V>
class PtrMap {
 public:
  PtrMap() = default;
  PtrMap(const PtrMap&) = delete;
  PtrMap& operator=(const PtrMap&) = delete;
  ~PtrMap() { delete[] slots_; }
  std::size_t size() const noexcept { return count_; }
  // Makes room for one insert (load <= 1/2); false when memory for growth is unavailable.
  bool reserve_one() noexcept { return (count_ + 1) * 2 <= cap_ || grow(); }
  void insert(std::uintptr_t k, V* v) noexcept {
    std::size_t i = home(k);
    while (slots_[i].key) i = (i + 1) & mask_;
    slots_[i] = {k, v};
    ++count_;
  }
  V* find(std::uintptr_t k) const noexcept {
    if (!cap_) return nullptr;
    for (std::size_t i = home(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return slots_[i].val;
      if (!slots_[i].key) return nullptr;
    }
  }
  V* erase(std::uintptr_t k) noexcept {
    if (!cap_) return nullptr;
    std::size_t i = home(k);
    while (slots_[i].key != k) {
      if (!slots_[i].key) return nullptr;
      i = (i + 1) & mask_;
    }
    V* v = slots_[i].val;
    for (std::size_t j = i;;) {
      j = (j + 1) & mask_;
      if (!slots_[j].key) break;
      // The entry at j may fill the hole at i iff i lies on its probe path home..j.
      if (((j - home(slots_[j].key)) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = 0;
    --count_;
    return v;
  }

 private:
  struct Slot {
    std::uintptr_t key;
    V* val;
  };
  std::size_t home(std::uintptr_t k) const noexcept {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  bool grow() noexcept {
    std::size_t ncap = cap_ ? cap_ * 2 : 1024;
    Slot* ns = new (std::nothrow) Slot[ncap]();
    if (!ns) return false;
    Slot* old = slots_;
    std::size_t ocap = cap_;
    slots_ = ns, cap_ = ncap, mask_ = ncap - 1, count_ = 0;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(ncap));
    for (std::size_t i = 0; i < ocap; ++i)
      if (old[i].key) insert(old[i].key, old[i].val);
    delete[] old;
    return true;
  }
  Slot* slots_ = nullptr;
  std::size_t cap_ = 0, mask_ = 0, count_ = 0;
  unsigned shift_ = 64;
};

// The pool's lock. Critical sections are tens of ns, so under contention a waiter that
// sleeps at once (std::mutex) pays a futex round trip per operation: on a 16-core host,
// 16 threads sharing one pool ran many times slower than with a short spin first. Drepper's
// three-state futex mutex ("Futexes Are Tricky", mutex3) plus a bounded spin.
class SpinFutexMutex {
 public:
  void lock() noexcept {
    int c = 0;
    if (state_.compare_exchange_strong(c, 1, std::memory_order_acquire)) return;
    for (int i = 0; i < kSpins; ++i) {
      __builtin_ia32_pause();
      if (state_.load(std::memory_order_relaxed) == 0) {
        c = 0;
        if (state_.compare_exchange_strong(c, 1, std::memory_order_acquire)) return;
      }
    }
    if (c != 2) c = state_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
      c = state_.exchange(2, std::memory_order_acquire);
    }
  }
  void unlock() noexcept {
    if (state_.fetch_sub(1, std::memory_order_release) != 1) {
      state_.store(0, std::memory_order_release);
      syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

 private:
  static constexpr int kSpins = 40;  // ~ a few critical sections; then sleep
  std::atomic<int> state_{0};        // 0 free, 1 locked, 2 locked with (possible) sleepers
};
static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex word");

}  // namespace impl
}  // namespace pool
}  // namespace gpuheap
