// An open-addressing hash map for u64 keys (linear probing, backward-shift deletion).
// The replay does several lookups per event; std::unordered_map's node allocation and
// pointer chasing would dominate the replay's time per event.
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
namespace base {

// A prefetch of p's cache line that the compiler cannot delete. GCC 12 (-O1 and up) deems a
// function of loads and __builtin_prefetch free of side effects and deletes the calls to it
// wherever it sees the body (it did so to FlatMap::prefetch and Model::prefetch, so the replay
// once ran unprefetched); an asm volatile statement is never deleted, so the
// functions around it can be inlined. The address goes in a register ("r"), not as a memory
// operand: `*p` of a pointer that may be null would let the compiler assume it is not. (An
// address operand, "p" with %a0, saves a lea but clang 14's assembler rejects it.)
__attribute__((always_inline)) inline void prefetch_line(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p);
#endif
}

// Storage for trivially copyable elements; arrays of 2 MiB or more are 2 MiB aligned and
// asked to use transparent huge pages: the live map is probed at random, and with 4 KiB
// pages nearly every probe of a large table is also a TLB miss.
template <class T>
class HugeArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  HugeArray() = default;
  // Uninitialized elements: the caller writes what it reads (FlatMap sets only the keys of
  // a new table, a store per slot rather than a whole slot's).
  explicit HugeArray(std::size_t n) : n_(n) {
    std::size_t bytes = n * sizeof(T);
    if (bytes >= kHuge) {
      bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p_.reset(static_cast<T*>(std::aligned_alloc(kHuge, bytes)));
      if (p_) ::madvise(p_.get(), bytes, MADV_HUGEPAGE);
    } else {
      // Cache-line aligned: FlatMap's slots must not straddle lines.
      bytes = (bytes + 63) & ~std::size_t{63};
      p_.reset(static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64)));
    }
    if (!p_) throw std::bad_alloc();
  }
  T& operator[](std::size_t i) { return p_[i]; }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
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

// kLoadShift: the table grows past a load of 1/2^kLoadShift. A map whose entries come and
// go on every event (Model's block edges) is cheaper kept sparser: probe runs, and the
// backward shift of each erase, stay near one slot.
template <class V, unsigned kLoadShift = 1>
class FlatMap {
 public:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static constexpr std::size_t npos = ~std::size_t{0};

  FlatMap() { rehash(16); }

  std::size_t size() const { return size_ + (has_sentinel_ ? 1 : 0); }

  V* find(std::uint64_t k) {
    if (k == kEmpty) return has_sentinel_ ? &sentinel_ : nullptr;
    Slot* const sl = slots_.data();
    const std::size_t mask = mask_;
    for (std::size_t i = slot(k);; i = (i + 1) & mask) {
      auto& s = sl[i];
      if (s.key == k) return &s.val;
      if (s.key == kEmpty) return nullptr;
    }
  }
  const V* find(std::uint64_t k) const { return const_cast<FlatMap*>(this)->find(k); }

  // The slot index of k (not kEmpty), or npos: for a lookup followed by erase_at(), which
  // then need not probe again. An index stays valid until the next insert or erase.
  std::size_t find_index(std::uint64_t k) const {
    const Slot* const sl = slots_.data();
    const std::size_t mask = mask_;
    for (std::size_t i = slot(k);; i = (i + 1) & mask) {
      const auto& s = sl[i];
      if (s.key == k) return i;
      if (s.key == kEmpty) return npos;
    }
  }
  V& at(std::size_t i) { return slots_[i].val; }

  // Starts loading the slot where k lives (or would go): replay prefetches the next few
  // events' slots so their cache misses overlap instead of serializing. A slot holds the
  // key and its value in one cache line (values of up to 56 bytes); `value` (the key is
  // expected to be present) also loads the following slot when slots are whole lines.
  //
  // prefetch_line, not __builtin_prefetch: GCC 12 kept this out of line for 64-byte slots
  // (two prefetches), found it free of side effects and deleted every call, so the live map
  // was never prefetched. always_inline now only for speed (a call per record).
  // FlatMapPrefetch.WholeLineSlotsArePrefetched (tests/unit/test_model_edges.cpp) checks
  // the machine code.
  __attribute__((always_inline)) void prefetch(std::uint64_t k, bool value = true) const {
    std::size_t i = slot(k);
    prefetch_line(&slots_.data()[i]);
    // Slots of a whole line: the next one (where the probe run, or a deletion's backward
    // shift, continues) is another line.
    if (value && sizeof(Slot) >= 64) prefetch_line(&slots_.data()[(i + 1) & mask_]);
  }

  // Inserts a default V when absent; `inserted` tells which.
  V& get(std::uint64_t k, bool* inserted = nullptr) {
    if (k == kEmpty) {
      if (inserted) *inserted = !has_sentinel_;
      if (!has_sentinel_) sentinel_ = V{}, has_sentinel_ = true;
      return sentinel_;
    }
    if (((size_ + 1) << kLoadShift) > cap()) rehash(cap() * 2);
    return get_reserved(k, inserted);
  }

  // Makes room for n more entries: the next n get_reserved() calls neither rehash nor move
  // an entry, so references from the first stay valid through the others.
  void reserve_more(std::size_t n) {
    while (((size_ + n) << kLoadShift) > cap()) rehash(cap() * 2);
  }
  // get() of a key that is not kEmpty, in a table with room for it (reserve_more).
  V& get_reserved(std::uint64_t k, bool* inserted = nullptr) {
    // Table base and mask in locals: the slot stores below may alias the members (both
    // u64), which would make the compiler reload them at every step.
    Slot* const sl = slots_.data();
    const std::size_t mask = mask_;
    std::size_t i = slot(k);
    for (;; i = (i + 1) & mask) {
      auto& s = sl[i];
      if (s.key == k) {
        if (inserted) *inserted = false;
        return s.val;
      }
      if (s.key == kEmpty) break;
    }
    auto& s = sl[i];
    s.key = k;
    s.val = V{};
    ++size_;
    if (inserted) *inserted = true;
    return s.val;
  }

  bool erase(std::uint64_t k) {
    if (k == kEmpty) {
      bool had = has_sentinel_;
      has_sentinel_ = false;
      return had;
    }
    std::size_t i = find_index(k);
    if (i == npos) return false;
    erase_at(i);
    return true;
  }

  // Moves k's value to *out and erases it, with one probe; false when k is absent.
  bool take(std::uint64_t k, V* out) {
    if (k == kEmpty) {
      if (!has_sentinel_) return false;
      *out = sentinel_, has_sentinel_ = false;
      return true;
    }
    std::size_t i = find_index(k);
    if (i == npos) return false;
    *out = slots_[i].val;
    erase_at(i);
    return true;
  }

  // Erases k's entry, given its value as find() or get() of k returned it (no insert or
  // erase since): no second probe.
  void erase_found(std::uint64_t k, V* v) {
    if (k == kEmpty) {
      has_sentinel_ = false;
      return;
    }
    auto off = reinterpret_cast<const char*>(v) - reinterpret_cast<const char*>(&slots_.data()->val);
    erase_at(static_cast<std::size_t>(off) / sizeof(Slot));
  }
  // The key in slot i: whether an index from find_index still holds its key after an erase
  // (a backward shift moves entries only into the hole, so a slot that still holds the key
  // holds its entry).
  std::uint64_t key_at(std::size_t i) const { return slots_[i].key; }

  // Erases the entry in slot i (an index from find_index).
  void erase_at(std::size_t i) {
    // Backward-shift: move later entries of the probe run into the hole.
    Slot* const sl = slots_.data();  // locals: the slot stores may alias the members
    const std::size_t mask = mask_;
    const unsigned shift = shift_;
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; sl[j].key != kEmpty; j = (j + 1) & mask) {
      std::size_t home = static_cast<std::size_t>(mix(sl[j].key) >> shift);
      // Entry j may fill the hole if its home is not in (hole, j] (cyclically).
      bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        sl[hole] = sl[j];
        hole = j;
      }
    }
    sl[hole].key = kEmpty;
    --size_;
  }

  // f may change values, not keys, and must not insert or erase.
  template <class F>
  void for_each_mut(F&& f) {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].key != kEmpty) f(slots_[i].key, slots_[i].val);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].key != kEmpty) f(slots_[i].key, slots_[i].val);
    if (has_sentinel_) f(kEmpty, sentinel_);
  }

 private:
  // Key and value side by side, the slot padded to a power of two (16, 32 or 64 bytes) so
  // that no slot straddles a cache line: a hit costs one line, not one for the key array and
  // one for the value array. Probe runs stay short (load factor at most 1/2), so scanning
  // whole slots instead of a dense key array costs little on misses. Slot positions (hash,
  // probing, growth) are what they were with separate arrays, so iteration order is too.
  static constexpr std::size_t kSlotAlign = sizeof(std::uint64_t) + sizeof(V) <= 16   ? 16
                                            : sizeof(std::uint64_t) + sizeof(V) <= 32 ? 32
                                                                                      : 64;
  struct alignas(kSlotAlign) Slot {
    std::uint64_t key;
    V val;
  };
  static_assert(std::is_trivially_copyable_v<V>);

  static constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi
  std::size_t cap() const { return slots_.size(); }
  // The bits slot() takes the top of. Keys that are multiples of a power of two (block
  // addresses: 512-byte multiples at 32 KiB strides) cluster under a plain Fibonacci product
  // (the multiplier is in effect kGolden << 9): 1.9 probes per hit in the live map at
  // load 1/2 on the benchmark trace, 1.6 in the edge map at 1/4. Folding the high half in
  // first (a shift and an xor) brings both to ~1.15, and every probe of the live map is a
  // cache line.
  static std::uint64_t mix(std::uint64_t k) { return (k ^ (k >> 29)) * kGolden; }
  std::size_t slot(std::uint64_t k) const {
    // Fibonacci hashing of mix(k): the top bits of the product depend on every bit of the
    // key (the low bits of a plain product would cluster strided addresses under linear
    // probing). Four instructions, against fmix64's seven: the replay hashes several times
    // per event (probes, and every entry that a deletion's backward shift looks at).
    // Iteration order is not part of the interface (every consumer sorts what it collects).
    return static_cast<std::size_t>(mix(k) >> shift_);
  }
  // Out of line: Model::feed_batch is flattened (everything it calls inlined), and a table's
  // growth is rare.
  __attribute__((noinline)) void rehash(std::size_t n) {
    // Only the keys of the new table are set: a value is written wherever a key is.
    HugeArray<Slot> old(n);
    for (std::size_t i = 0; i < n; ++i) old[i].key = kEmpty;
    old.swap(slots_);
    mask_ = n - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(n));  // n is a power of two >= 2
    // The old entries are distinct and fit: each goes to the first empty slot of its probe
    // run, in the old table's order (the positions get() would give them).
    Slot* const sl = slots_.data();
    const std::size_t mask = mask_;
    for (std::size_t i = 0; i < old.size(); ++i) {
      if (old[i].key == kEmpty) continue;
      std::size_t j = slot(old[i].key);
      while (sl[j].key != kEmpty) j = (j + 1) & mask;
      sl[j] = old[i];
    }
  }

  HugeArray<Slot> slots_;
  std::size_t size_ = 0, mask_ = 0;
  unsigned shift_ = 63;
  V sentinel_{};
  bool has_sentinel_ = false;
};

}  // namespace base
}  // namespace gpuheap
