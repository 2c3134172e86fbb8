// A small open-addressing hash map for u64 keys (linear probing, backward-shift deletion).
// The replay does several lookups per event; std::unordered_map's node allocation and
// pointer chasing would dominate the 20 M events/s budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpuheap {
namespace detail {

template <class V>
class FlatMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  FlatMap() { rehash(16); }

  std::size_t size() const { return size_ + (has_sentinel_ ? 1 : 0); }

  V* find(std::uint64_t k) {
    if (k == kEmpty) return has_sentinel_ ? &sentinel_ : nullptr;
    for (std::size_t i = slot(k);; i = (i + 1) & mask_) {
      if (e_[i].key == k) return &e_[i].val;
      if (e_[i].key == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint64_t k) const { return const_cast<FlatMap*>(this)->find(k); }

  // Starts loading the slot where k lives (or would go): replay prefetches the next few
  // events' slots so their cache misses overlap instead of serializing.
  void prefetch(std::uint64_t k) const { __builtin_prefetch(&e_[slot(k)]); }

  // Inserts a default V when absent; `inserted` tells which.
  V& get(std::uint64_t k, bool* inserted = nullptr) {
    if (k == kEmpty) {
      if (inserted) *inserted = !has_sentinel_;
      if (!has_sentinel_) sentinel_ = V{}, has_sentinel_ = true;
      return sentinel_;
    }
    if ((size_ + 1) * 4 > cap() * 3) rehash(cap() * 2);
    std::size_t i = slot(k);
    for (;; i = (i + 1) & mask_) {
      if (e_[i].key == k) {
        if (inserted) *inserted = false;
        return e_[i].val;
      }
      if (e_[i].key == kEmpty) break;
    }
    e_[i].key = k;
    e_[i].val = V{};
    ++size_;
    if (inserted) *inserted = true;
    return e_[i].val;
  }

  bool erase(std::uint64_t k) {
    if (k == kEmpty) {
      bool had = has_sentinel_;
      has_sentinel_ = false;
      return had;
    }
    std::size_t i = slot(k);
    for (;; i = (i + 1) & mask_) {
      if (e_[i].key == k) break;
      if (e_[i].key == kEmpty) return false;
    }
    // Backward-shift: move later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; e_[j].key != kEmpty; j = (j + 1) & mask_) {
      std::size_t home = slot(e_[j].key);
      // Entry j may fill the hole if its home is not in (hole, j] (cyclically).
      bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        e_[hole].key = e_[j].key;
        e_[hole].val = std::move(e_[j].val);
        hole = j;
      }
    }
    e_[hole].key = kEmpty;
    --size_;
    return true;
  }

  // f may change values, not keys, and must not insert or erase.
  template <class F>
  void for_each_mut(F&& f) {
    for (std::size_t i = 0; i < e_.size(); ++i)
      if (e_[i].key != kEmpty) f(e_[i].key, e_[i].val);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < e_.size(); ++i)
      if (e_[i].key != kEmpty) f(e_[i].key, e_[i].val);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

 private:
  std::size_t cap() const { return e_.size(); }
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
    std::vector<Entry> old;
    old.swap(e_);
    e_.resize(n);
    mask_ = n - 1;
    size_ = 0;
    for (auto& x : old)
      if (x.key != kEmpty) get(x.key) = std::move(x.val);
  }

  // Key and value side by side: one cache line per successful lookup.
  struct Entry {
    std::uint64_t key = kEmpty;
    V val{};
  };
  std::vector<Entry> e_;
  std::size_t size_ = 0, mask_ = 0;
  V sentinel_{};
  bool has_sentinel_ = false;
};

}  // namespace detail
}  // namespace gpuheap
