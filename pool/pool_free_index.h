// The pool's free-block index (public: the pool and the replay's torch allocator use it):
// best fit by (size, address), exactly as the std::set it replaced ordered it, at a fraction
// of the cost. Free blocks sit in size bins (log-linear classes: exact below 64 B, then 64
// bins per power of two, so every multiple of 512 B up to 64 KiB has a bin of its own); a
// bitmap of non-empty bins finds the next one up in two word scans. Each bin is an
// intrusive treap ordered by (size, address):
// the tree links live in the block (no node allocation, no pointer to a pointer), and a bin
// holds few blocks, so it is shallow. Bins are size intervals in increasing order, so "the
// smallest (size, address) with size >= s" is the lower bound in s's bin or else the
// leftmost block of the next non-empty bin: the same block the set's lower_bound gave.
//
// The treap's priorities are a hash of the block address: deterministic, and they decide
// only the trees' shapes, never which block a query returns.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuheap {
namespace pool {

// B has: std::uintptr_t addr; std::size_t size; B* fl; B* fr; B* fp (left, right, parent);
// std::uint16_t fbin (the bin insert put it in: erase need not compute it again).
template <class B>
class FreeIndex {
 public:
  static constexpr unsigned kSubBits = 6;        // 64 bins per power of two
  static constexpr std::size_t kBins = 64 * 64;  // covers every 64-bit size
  static_assert(kBins <= 65536, "a bin number fits B::fbin");

  FreeIndex() = default;
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

  void insert(B* b) noexcept {
    std::size_t bin = bin_of(b->size);
    B** link = &roots_[bin];
    B* parent = nullptr;
    while (*link) {
      parent = *link;
      link = less(b, parent) ? &parent->fl : &parent->fr;
    }
    *link = b;
    b->fp = parent, b->fl = b->fr = nullptr;
    b->fbin = static_cast<std::uint16_t>(bin);
    while (b->fp && prio(b) < prio(b->fp)) rotate_up(b, bin);
    bits_[bin / 64] |= std::uint64_t{1} << (bin % 64);
    summary_ |= std::uint64_t{1} << (bin / 64);
    ++count_;
  }

  void erase(B* b) noexcept {
    std::size_t bin = b->fbin;
    // Rotate b down until it has at most one child, then splice it out.
    while (b->fl && b->fr) rotate_up(prio(b->fl) < prio(b->fr) ? b->fl : b->fr, bin);
    B* child = b->fl ? b->fl : b->fr;
    if (child) child->fp = b->fp;
    replace_child(b->fp, b, child, bin);
    b->fl = b->fr = b->fp = nullptr;
    if (!roots_[bin]) {
      bits_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
      if (!bits_[bin / 64]) summary_ &= ~(std::uint64_t{1} << (bin / 64));
    }
    --count_;
  }

  // The smallest (size, address) with size >= s, or nullptr.
  B* lower_bound(std::size_t s) const noexcept {
    std::size_t bin = bin_of(s);
    B* best = nullptr;
    for (B* c = roots_[bin]; c;) {
      if (c->size >= s) best = c, c = c->fl;
      else c = c->fr;
    }
    if (best) return best;
    std::size_t next = next_bin(bin + 1);
    return next == kBins ? nullptr : leftmost(roots_[next]);
  }

  // The largest (size, address), or nullptr.
  B* last() const noexcept {
    if (!summary_) return nullptr;
    unsigned w = 63 - static_cast<unsigned>(__builtin_clzll(summary_));
    unsigned bin = w * 64 + 63 - static_cast<unsigned>(__builtin_clzll(bits_[w]));
    B* c = roots_[bin];
    while (c->fr) c = c->fr;
    return c;
  }

  // True when b is in this index (O(depth); the consistency check).
  bool contains(const B* b) const noexcept {
    const B* c = b;
    while (c->fp) c = c->fp;
    return roots_[bin_of(b->size)] == c;
  }

  // Forgets every block (their links are left as they are).
  void clear() noexcept {
    for (std::size_t w = 0; w < kBins / 64; ++w)
      for (std::uint64_t m = bits_[w]; m; m &= m - 1)
        roots_[w * 64 + static_cast<unsigned>(__builtin_ctzll(m))] = nullptr;
    for (auto& w : bits_) w = 0;
    summary_ = 0, count_ = 0;
  }

  // Log-linear size class, non-decreasing in s.
  static std::size_t bin_of(std::size_t s) noexcept {
    if (s < (std::size_t{1} << kSubBits)) return s;
    unsigned k = 63 - static_cast<unsigned>(__builtin_clzll(s));  // >= kSubBits
    return (k - kSubBits + 1) * 64 + ((s >> (k - kSubBits)) - 64);
  }

 private:
  static bool less(const B* a, const B* b) noexcept {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
  static std::uint32_t prio(const B* b) noexcept {
    return static_cast<std::uint32_t>((b->addr * 0x9E3779B97F4A7C15ull) >> 32);
  }
  static B* leftmost(B* c) noexcept {
    while (c->fl) c = c->fl;
    return c;
  }
  // The first non-empty bin >= from, or kBins.
  std::size_t next_bin(std::size_t from) const noexcept {
    if (from >= kBins) return kBins;
    std::size_t w = from / 64;
    std::uint64_t m = bits_[w] & (~std::uint64_t{0} << (from % 64));
    if (m) return w * 64 + static_cast<unsigned>(__builtin_ctzll(m));
    std::uint64_t s = w + 1 < 64 ? summary_ & (~std::uint64_t{0} << (w + 1)) : 0;
    if (!s) return kBins;
    w = static_cast<unsigned>(__builtin_ctzll(s));
    return w * 64 + static_cast<unsigned>(__builtin_ctzll(bits_[w]));
  }
  void replace_child(B* parent, B* old, B* now, std::size_t bin) noexcept {
    if (!parent) roots_[bin] = now;
    else if (parent->fl == old) parent->fl = now;
    else parent->fr = now;
  }
  // x takes its parent's place; the parent becomes x's child (BST order kept).
  void rotate_up(B* x, std::size_t bin) noexcept {
    B* p = x->fp;
    B* g = p->fp;
    if (p->fl == x) {
      p->fl = x->fr;
      if (x->fr) x->fr->fp = p;
      x->fr = p;
    } else {
      p->fr = x->fl;
      if (x->fl) x->fl->fp = p;
      x->fl = p;
    }
    p->fp = x;
    x->fp = g;
    replace_child(g, p, x, bin);
  }

  B* roots_[kBins] = {};
  std::uint64_t bits_[kBins / 64] = {};
  std::uint64_t summary_ = 0;
  std::size_t count_ = 0;
};

}  // namespace pool
}  // namespace gpuheap
