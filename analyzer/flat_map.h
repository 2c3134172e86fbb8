// An open-addressing hash map for u64 keys (linear probing, backward-shift deletion).
// The replay does several lookups per event; std::unordered_map's node allocation and
// pointer chasing would dominate the 20 M events/s budget.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace gpuheap {
namespace detail {

// Keys and values live in separate arrays: probing reads only the dense key array (8 keys
// per cache line, small enough to stay in L2 for tens of thousands of entries) and touches
// the value once, on a hit. Unsuccessful lookups (the segment neighbour checks) never touch
// values. The load factor stays at or below 1/2 so that probe runs stay short.
// Storage for trivially copyable elements; arrays of 2 MiB or more are 2 MiB aligned and
// asked to use transparent huge pages: the live map is probed at random, and with 4 KiB
// pages nearly every probe of a large table is also a TLB miss.
template <class T>
class HugeArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  HugeArray() = default;
  HugeArray(std::size_t n, const T& fill) : n_(n) {
    std::size_t bytes = n * sizeof(T);
    if (bytes >= kHuge) {
      bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p_.reset(static_cast<T*>(std::aligned_alloc(kHuge, bytes)));
      if (p_) ::madvise(p_.get(), bytes, MADV_HUGEPAGE);
    } else {
      p_.reset(static_cast<T*>(std::malloc(bytes ? bytes : 1)));
    }
    if (!p_) throw std::bad_alloc();
    for (std::size_t i = 0; i < n; ++i) new (&p_[i]) T(fill);
  }
  T& operator[](std::size_t i) { return p_[i]; }
  const T& operator[](std::size_t i) const { return p_[i]; }
  std::size_t size() const { return n_; }
  void swap(HugeArray& o) noexcept { std::swap(n_, o.n_), p_.swap(o.p_); }

 private:
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::size_t n_ = 0;
  std::unique_ptr<T[], Free> p_;
};

template <class V>
class FlatMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  FlatMap() { rehash(16); }

  std::size_t size() const { return size_ + (has_sentinel_ ? 1 : 0); }

  V* find(std::uint64_t k) {
    if (k == kEmpty) return has_sentinel_ ? &sentinel_ : nullptr;
    for (std::size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint64_t k) const { return const_cast<FlatMap*>(this)->find(k); }

  // Starts loading the slot where k lives (or would go): replay prefetches the next few
  // events' slots so their cache misses overlap instead of serializing. `value` also loads
  // the value (for keys that are expected to be present).
  void prefetch(std::uint64_t k, bool value = true) const {
    std::size_t i = slot(k);
    __builtin_prefetch(&keys_[i]);
    if (value) __builtin_prefetch(&vals_[i]);
  }

  // Inserts a default V when absent; `inserted` tells which.
  V& get(std::uint64_t k, bool* inserted = nullptr) {
    if (k == kEmpty) {
      if (inserted) *inserted = !has_sentinel_;
      if (!has_sentinel_) sentinel_ = V{}, has_sentinel_ = true;
      return sentinel_;
    }
    if ((size_ + 1) * 2 > cap()) rehash(cap() * 2);
    std::size_t i = slot(k);
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == k) {
        if (inserted) *inserted = false;
        return vals_[i];
      }
      if (keys_[i] == kEmpty) break;
    }
    keys_[i] = k;
    vals_[i] = V{};
    ++size_;
    if (inserted) *inserted = true;
    return vals_[i];
  }

  bool erase(std::uint64_t k) {
    if (k == kEmpty) {
      bool had = has_sentinel_;
      has_sentinel_ = false;
      return had;
    }
    std::size_t i = slot(k);
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == k) break;
      if (keys_[i] == kEmpty) return false;
    }
    // Backward-shift: move later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      std::size_t home = slot(keys_[j]);
      // Entry j may fill the hole if its home is not in (hole, j] (cyclically).
      bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        keys_[hole] = keys_[j];
        vals_[hole] = std::move(vals_[j]);
        hole = j;
      }
    }
    keys_[hole] = kEmpty;
    --size_;
    return true;
  }

  // f may change values, not keys, and must not insert or erase.
  template <class F>
  void for_each_mut(F&& f) {
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

 private:
  std::size_t cap() const { return keys_.size(); }
  std::size_t slot(std::uint64_t k) const {
    // murmur3's fmix64: device pointers are multiples of large powers of two and share
    // their high bits; plain multiplicative hashing clusters them under linear probing.
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k) & mask_;
  }
  void rehash(std::size_t n) {
    HugeArray<std::uint64_t> old_keys(n, kEmpty);
    HugeArray<V> old_vals(n, V{});
    old_keys.swap(keys_);
    old_vals.swap(vals_);
    mask_ = n - 1;
    size_ = 0;
    for (std::size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty) get(old_keys[i]) = std::move(old_vals[i]);
  }

  HugeArray<std::uint64_t> keys_;
  HugeArray<V> vals_;
  std::size_t size_ = 0, mask_ = 0;
  V sentinel_{};
  bool has_sentinel_ = false;
};

}  // namespace detail
}  // namespace gpuheap
