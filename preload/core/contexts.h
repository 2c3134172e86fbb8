// The per-context table: one owner for the states of the CUDA contexts gpuheap has served
// (lookup, creation, retiring at teardown, reviving when the driver reuses a handle, fork).
// Header-only over the state type, so the unit tests can drive it without a GPU.
#pragma once

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <new>
#include <type_traits>

namespace gpuheap {
namespace preload {

// A small fixed table (a process has a handful of contexts): slots are appended under the
// lock and never removed, so readers walk it without one. A state is never destroyed
// (CUDA must not be called from static destructors after main); a destroyed context's state
// is *retired* instead and may be revived for a later context with the same handle.
//
// State needs: `CUcontext ctx`, `int device`, `std::atomic<bool> retired`.
//
// Visitors: for_each_live skips retired states; for_each_including_retired does not. Every
// caller picks one on purpose (see the comment at each call). A visitor returning bool stops
// the walk by returning true; the walk then returns that state (else nullptr).
template <class State, int Cap = 64>
class BasicContextTable {
 public:
  static constexpr int kCapacity = Cap;

  // The live state serving ctx, or nullptr. Lock-free.
  State* find(CUcontext ctx) const noexcept {
    return for_each_live([ctx](State* s) { return s->ctx == ctx; });
  }

  // find(ctx); else, under the lock, a retired state of ctx on its device revived; else a
  // new state from make(device) appended. device_of() gives the device of ctx (-1: unknown,
  // nullptr is returned); make may return nullptr. A full table returns nullptr (the
  // caller passes through).
  template <class DeviceOf, class Make>
  State* find_or_create(CUcontext ctx, DeviceOf&& device_of, Make&& make) noexcept {
    if (State* s = find(ctx)) return s;
    std::lock_guard<std::mutex> lk(mu_);
    if (State* s = find(ctx)) return s;
    int dev = device_of();
    if (dev < 0) return nullptr;
    if (State* s = revive_locked(ctx, dev)) return s;
    int n = count_.load(std::memory_order_acquire);
    if (n == Cap) return nullptr;
    State* s = make(dev);
    if (!s) return nullptr;
    slots_[n].store(s, std::memory_order_release);
    count_.store(n + 1, std::memory_order_release);
    return s;
  }

  // The context behind ctx is going away: marks every state of ctx retired, then calls
  // fn(state) (which abandons its pool). States of ctx retired already are visited too, as
  // before the table existed: their pools were abandoned then and give nothing back.
  // Retired first: a thread racing the teardown finds no pool for ctx rather than one
  // being emptied. Returns how many states were visited.
  template <class Fn>
  int retire(CUcontext ctx, Fn&& fn) noexcept {
    int k = 0;
    for_each_including_retired([&](State* s) {
      if (s->ctx != ctx) return;
      s->retired.store(true, std::memory_order_release);
      fn(s);
      ++k;
    });
    return k;
  }

  // A retired state of ctx on `device` serves ctx again (the driver hands a destroyed
  // context's handle to a later context, also the primary context after a reset), so
  // recreating contexts in a loop does not use up the table. Only a state of the same
  // device is taken back: a reused handle may name a context on another device.
  State* revive(CUcontext ctx, int device) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return revive_locked(ctx, device);
  }

  template <class Fn>
  State* for_each_live(Fn&& fn) const noexcept {
    return walk(fn, false);
  }
  template <class Fn>
  State* for_each_including_retired(Fn&& fn) const noexcept {
    return walk(fn, true);
  }

  // States created so far, retired ones included.
  int size() const noexcept { return count_.load(std::memory_order_acquire); }

  // Fork child (one thread): forget every state (leaked: their memory is the parent's) and
  // rebuild the lock, which another parent thread may have held at the fork. Returns
  // whether any state existed.
  bool reset_in_child() noexcept {
    bool had = count_.load(std::memory_order_acquire) > 0;
    count_.store(0, std::memory_order_release);
    new (&mu_) std::mutex();
    return had;
  }

 private:
  template <class Fn>
  State* walk(Fn& fn, bool retired_too) const noexcept {
    int n = count_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      State* s = slots_[i].load(std::memory_order_acquire);
      if (!s || (!retired_too && s->retired.load(std::memory_order_acquire))) continue;
      if constexpr (std::is_same_v<std::invoke_result_t<Fn&, State*>, bool>) {
        if (fn(s)) return s;
      } else {
        fn(s);
      }
    }
    return nullptr;
  }

  State* revive_locked(CUcontext ctx, int device) noexcept {
    int n = count_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      State* s = slots_[i].load(std::memory_order_acquire);
      if (s && s->ctx == ctx && s->device == device) {
        s->retired.store(false, std::memory_order_release);
        return s;
      }
    }
    return nullptr;
  }

  std::atomic<State*> slots_[Cap] = {};
  std::atomic<int> count_{0};
  std::mutex mu_;
};

}  // namespace preload
}  // namespace gpuheap
