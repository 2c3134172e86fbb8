// Per-device live counters (stats.h). Lock-free counters; the requested size of each live
// allocation is kept in a fixed table (no allocation inside the hooks) only where it differs
// from the size handed out, since a free names only the pointer.
#include "preload/core/stats.h"

#include <atomic>
#include <mutex>

namespace gpuheap {
namespace preload {

namespace {

struct Counter {
  std::atomic<std::uint64_t> cur{0}, peak{0};
  void add(std::uint64_t n) noexcept {
    std::uint64_t now = cur.fetch_add(n, std::memory_order_relaxed) + n;
    std::uint64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void sub(std::uint64_t n) noexcept {
    // Never below zero (a free of memory allocated before the counters saw it).
    std::uint64_t c = cur.load(std::memory_order_relaxed);
    while (!cur.compare_exchange_weak(c, c > n ? c - n : 0, std::memory_order_relaxed)) {
    }
  }
  void reset_peak() noexcept { peak.store(cur.load(std::memory_order_relaxed), std::memory_order_relaxed); }
};

struct Device {
  Counter requested, allocated, reserved;
  std::atomic<std::uint64_t> allocs{0}, frees{0};
};
Device g_dev[kMaxStatsDevices];

// Open addressing with linear probing and backward-shift deletion (no tombstones, so the
// table never silts up). Full: the allocation counts its size as requested, at both ends.
constexpr std::size_t kSlots = 1u << 16;
struct Slot {
  std::uint64_t key = 0;  // 0: empty
  std::uint64_t requested = 0;
};
Slot g_slots[kSlots];
std::mutex g_slots_mu;

std::uint64_t key_of(format::AllocKind kind, std::uint64_t ptr) noexcept {
  // A VMM handle and a pointer may be equal numbers: keep their address spaces apart; bit 0
  // set so that no key is 0 (user-space pointers leave the top bits free).
  return ptr << 3 | static_cast<std::uint64_t>(format::address_space(kind)) << 1 | 1u;
}
std::size_t home(std::uint64_t key) noexcept { return (key * 0x9E3779B97F4A7C15ull) >> 48; }

bool slot_put(std::uint64_t key, std::uint64_t requested) noexcept {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  for (std::size_t i = 0, h = home(key); i < kSlots; ++i, h = (h + 1) % kSlots) {
    if (g_slots[h].key == 0 || g_slots[h].key == key) {
      g_slots[h] = {key, requested};
      return true;
    }
  }
  return false;
}

bool slot_take(std::uint64_t key, std::uint64_t* requested) noexcept {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  std::size_t h = home(key);
  for (std::size_t i = 0; i < kSlots && g_slots[h].key != key; ++i, h = (h + 1) % kSlots)
    if (g_slots[h].key == 0) return false;
  if (g_slots[h].key != key) return false;
  *requested = g_slots[h].requested;
  // Backward shift: move later entries of the probe run into the hole when their home
  // position allows it, so lookups never stop early at a freed slot.
  std::size_t hole = h;
  for (std::size_t j = (hole + 1) % kSlots; g_slots[j].key != 0; j = (j + 1) % kSlots) {
    std::size_t k = home(g_slots[j].key);
    bool movable = hole <= j ? (k <= hole || k > j) : (k <= hole && k > j);
    if (movable) {
      g_slots[hole] = g_slots[j];
      hole = j;
    }
  }
  g_slots[hole] = {};
  return true;
}

Device* dev(int device) noexcept { return device >= 0 && device < kMaxStatsDevices ? &g_dev[device] : nullptr; }

}  // namespace

void stats_alloc(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t requested,
                 std::size_t size) noexcept {
  Device* d = dev(device);
  if (!d || !format::holds_device_memory(kind)) return;
  std::uint64_t req = requested;
  if (req != size && !slot_put(key_of(kind, ptr), req)) req = size;
  d->requested.add(req);
  d->allocated.add(size);
  if (kind != format::AllocKind::device_pooled) d->reserved.add(size);
  d->allocs.fetch_add(1, std::memory_order_relaxed);
}

void stats_free(format::AllocKind kind, int device, std::uint64_t ptr, std::size_t size) noexcept {
  Device* d = dev(device);
  if (!d || !format::holds_device_memory(kind) || size == 0) return;
  std::uint64_t req = size;
  slot_take(key_of(kind, ptr), &req);
  d->requested.sub(req);
  d->allocated.sub(size);
  if (kind != format::AllocKind::device_pooled) d->reserved.sub(size);
  d->frees.fetch_add(1, std::memory_order_relaxed);
}

void stats_reserve(int device, std::int64_t delta) noexcept {
  Device* d = dev(device);
  if (!d) return;
  if (delta >= 0) d->reserved.add(static_cast<std::uint64_t>(delta));
  else d->reserved.sub(static_cast<std::uint64_t>(-delta));
}

bool stats_get(int device, DeviceStats* out) noexcept {
  Device* d = dev(device);
  if (!d || !out) return false;
  out->requested = d->requested.cur.load(std::memory_order_relaxed);
  out->requested_peak = d->requested.peak.load(std::memory_order_relaxed);
  out->allocated = d->allocated.cur.load(std::memory_order_relaxed);
  out->allocated_peak = d->allocated.peak.load(std::memory_order_relaxed);
  out->reserved = d->reserved.cur.load(std::memory_order_relaxed);
  out->reserved_peak = d->reserved.peak.load(std::memory_order_relaxed);
  out->allocs = d->allocs.load(std::memory_order_relaxed);
  out->frees = d->frees.load(std::memory_order_relaxed);
  return true;
}

void stats_reset_peak(int device) noexcept {
  for (int i = 0; i < kMaxStatsDevices; ++i) {
    if (device >= 0 && i != device) continue;
    g_dev[i].requested.reset_peak();
    g_dev[i].allocated.reset_peak();
    g_dev[i].reserved.reset_peak();
  }
}

}  // namespace preload
}  // namespace gpuheap
