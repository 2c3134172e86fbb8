// Shared by the allocation paths (alloc.cpp: pooled; passthrough.cpp: pass-through kinds,
// VMM and context teardown): the registry of pass-through allocations and the record helpers.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "format/trace.h"

namespace gpuheap {
namespace preload {

struct ContextState;

// ---- registry of pass-through allocations: what kind and size a later free refers to ----

// The registry keeps one map per address space (format/rules.h: the analyzer keys its live
// allocations by the same rule), so a VMM handle never collides with a pointer.
using Family = format::AddressSpace;

struct Entry {
  format::AllocKind kind;
  std::int16_t device;
  std::uint64_t size;
  std::uint32_t stack = 0;
  std::int64_t charged = 0;  // bytes charged to budget(device) for the cap
  CUcontext ctx = nullptr;   // context current at the allocation (dropped with it)
  // VMM: a mapping's handle; a handle's live mappings and whether cuMemRelease was called.
  std::uint64_t handle = 0;
  std::uint32_t maps = 0;
  bool released = false;
};

class Registry {
 public:
  void put(Family f, std::uint64_t key, const Entry& e) noexcept {
    Shard& s = shard(f, key);
    std::lock_guard<std::mutex> lk(s.mu);
    s.map[key] = e;
  }
  template <class Fn>
  void for_each(Family f, Fn&& fn) noexcept {
    for (Shard& s : shards_[static_cast<int>(f)]) {
      std::lock_guard<std::mutex> lk(s.mu);
      for (auto& [key, e] : s.map) fn(e);
    }
  }
  bool take(Family f, std::uint64_t key, Entry* out) noexcept {
    return update(f, key, [&](Entry& e) {
      *out = e;
      return true;
    });
  }
  // fn(Entry&) under the shard lock; it returns true to erase the entry. False: no entry.
  template <class Fn>
  bool update(Family f, std::uint64_t key, Fn&& fn) noexcept {
    Shard& s = shard(f, key);
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return false;
    if (fn(it->second)) s.map.erase(it);
    return true;
  }
  // Erases every entry for which fn(key, entry) returns true (after it saw the entry).
  template <class Fn>
  void erase_if(Family f, Fn&& fn) noexcept {
    for (Shard& s : shards_[static_cast<int>(f)]) {
      std::lock_guard<std::mutex> lk(s.mu);
      for (auto it = s.map.begin(); it != s.map.end();)
        it = fn(it->first, it->second) ? s.map.erase(it) : std::next(it);
    }
  }

 private:
  static constexpr int kShards = 16;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::uint64_t, Entry> map;
  };
  Shard& shard(Family f, std::uint64_t key) noexcept { return shards_[static_cast<int>(f)][(key >> 9) % kShards]; }
  Shard shards_[format::kNumAddressSpaces][kShards];
};

Registry& registry() noexcept;

inline std::uint64_t addr(const void* p) noexcept { return reinterpret_cast<std::uint64_t>(p); }

std::uint32_t alloc_stack() noexcept;
std::uint32_t free_stack() noexcept;
void record_alloc(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t requested, std::size_t size,
                  std::uint8_t flags, std::uint64_t stream, std::uint32_t stack) noexcept;
void record_free(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t size, std::uint8_t flags,
                 std::uint64_t stream, std::uint32_t stack) noexcept;
// Records the OOM event and writes the stderr report (st may be null).
void record_oom(ContextState* st, int device, format::AllocKind kind, const char* api, std::size_t requested,
                std::uint64_t stream, std::uint32_t stack) noexcept;

}  // namespace preload
}  // namespace gpuheap
