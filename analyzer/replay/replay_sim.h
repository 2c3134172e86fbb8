// The simulated device of `gpuheap replay` (replay.cpp): the pool's upstream (segments as
// addresses only, fences that complete on the trace's free_completed records) and the
// segment observer that keeps what PoolStats does not say. Only replay.cpp includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "analyzer/base/flat_map.h"
#include "analyzer/replay/replay.h"
#include "pool/pool.h"

namespace gpuheap {
namespace replay_sim {

constexpr std::uint64_t kDriverGranularity = std::uint64_t{2} << 20;  // cudaMalloc's 2 MiB
// No process has addresses at or above 2^63 (x86-64 and aarch64 user space ends far below):
// a device never holds more, and sizes and totals below it keep every sum and every signed
// statistic of the replay exact.
constexpr std::uint64_t kTop = std::uint64_t{1} << 63;

inline std::uint64_t round_up(std::uint64_t n, std::uint64_t m) { return (n + m - 1) / m * m; }

// "The GPU" of one device: segments are addresses only (never memory: a 100 GiB trace
// replays in a few MB), the limit is the device cap, and a fence is done when the trace
// says the freed block completed (or when the pool waits for it: the host blocking on the
// GPU, as fence_wait does in-process).
//
// A segment gets the address the recorded driver gave the recorded pool's segment of that
// size (the trace's segment_alloc records, offered in trace order), not a made-up one: the
// pool's best fit breaks ties between equal-sized free blocks by address, so segments whose
// real addresses descend (the driver often hands them out downwards) must keep that order
// or the replay picks the other block and drifts from the recorded pool (ResNet-18 on an
// H100: +2 MiB from two 2 KiB blocks taken the other way round). Where no recorded segment
// of that size is offered (another policy, a pool-off trace) or its range is still held
// here, a fresh address above every one seen is made up.
class SimUpstream final : public pool::Upstream {
 public:
  explicit SimUpstream(ReplayDevice* out, std::uint64_t limit) : out_(out), limit_(limit) {}

  void* allocate(std::size_t bytes) noexcept override {
    if (limit_ && (bytes > limit_ || reserved_ + other_ > limit_ - bytes)) return nullptr;
    std::uint64_t a = take_offered(bytes);
    if (!a && !(a = fresh(bytes))) return nullptr;  // no address left: only a hostile trace
    held_.emplace(a, bytes);
    reserved_ += bytes;
    out_->reserved.add(static_cast<std::int64_t>(bytes));
    held_changed();
    return reinterpret_cast<void*>(a);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    held_.erase(reinterpret_cast<std::uint64_t>(p));
    reserved_ -= bytes;
    out_->reserved.add(-static_cast<std::int64_t>(bytes));
  }
  // The trace's segment records: a recorded segment is offered until this replay takes it
  // or the recorded pool gives it back (then the driver may hand its range out again).
  void offer(std::uint64_t addr, std::uint64_t bytes) {
    // No process has addresses at or above 2^63: such a record is hostile, never offered.
    if (!addr || !bytes || bytes >= kTop || addr >= kTop - bytes) return;
    std::uint64_t seq = ++offers_;
    by_size_.emplace(std::make_pair(bytes, seq), addr);
    by_addr_.emplace(addr, std::make_pair(bytes, seq));
    next_ = std::max(next_, round_up(addr + bytes, kDriverGranularity));
  }
  // The recorded pool cannot hold two segments at one address: every offer there goes.
  void withdraw(std::uint64_t addr) {
    auto [lo, hi] = by_addr_.equal_range(addr);
    for (auto it = lo; it != hi; ++it) by_size_.erase(it->second);
    by_addr_.erase(lo, hi);
  }
  Fence fence_record() noexcept override {
    if (count_ == fence_mask_ + 1 || fences_.empty()) grow_fences();
    fence(base_ + ++count_) = 0;
    return base_ + count_;
  }
  bool fence_done(Fence f) noexcept override { return f <= base_ || (fence(f) & kDone); }
  void fence_wait(Fence f) noexcept override { complete(f); }
  void fence_release(Fence f) noexcept override {
    if (f <= base_) return;
    // The pool releases fences oldest first, so the front is dropped at once.
    if (f == base_ + 1) ++base_, --count_;
    else fence(f) |= kReleased;
    while (count_ && (fence(base_ + 1) & kReleased)) ++base_, --count_;
  }
  std::uint64_t now_ns() noexcept override { return 0; }  // seal_interval_ns is 0: no clock

  void complete(Fence f) noexcept {
    if (f > base_) fence(f) |= kDone;
  }
  Fence last_fence() const { return base_ + count_; }
  // Device memory of kinds the pool does not serve: charged against the limit.
  void charge_other(std::int64_t d) {
    other_ += static_cast<std::uint64_t>(d);
    if (d > 0) held_changed();
  }
  // Within the limit, and within the address space (policy none has no fresh() to run out).
  bool fits(std::uint64_t bytes) const {
    if (bytes >= kTop || reserved_ + other_ >= kTop - bytes) return false;
    return !limit_ || (bytes <= limit_ && reserved_ + other_ <= limit_ - bytes);
  }
  std::uint64_t reserved() const { return reserved_; }

 private:
  static constexpr std::uint8_t kDone = 1, kReleased = 2;
  // Fences base_+1 .. base_+count_ live in a ring indexed by fence number (a power-of-two
  // size): cheaper per fence than a deque, and every free records one.
  // (The ring's base pointer and mask are kept in members: every free records, and every
  // allocation checks and releases, a fence.)
  std::uint8_t& fence(Fence f) { return fence_data_[f & fence_mask_]; }
  void grow_fences() {
    std::vector<std::uint8_t> n(fences_.empty() ? 1024 : fences_.size() * 2);
    for (Fence f = base_ + 1; f <= base_ + count_; ++f) n[f & (n.size() - 1)] = fence(f);
    fences_.swap(n);
    fence_data_ = fences_.data(), fence_mask_ = fences_.size() - 1;
  }
  void held_changed() { out_->peak_held = std::max(out_->peak_held, reserved_ + other_); }
  // The oldest offered segment of exactly `bytes` whose range is free here (among the
  // oldest kScan of that size: a bound for hostile traces); 0 if none. Segment records are
  // rare next to block events: ordered maps are cheap here.
  std::uint64_t take_offered(std::uint64_t bytes) {
    constexpr int kScan = 64;
    auto it = by_size_.lower_bound(std::make_pair(bytes, std::uint64_t{0}));
    for (int n = 0; n < kScan && it != by_size_.end() && it->first.first == bytes; ++n, ++it) {
      std::uint64_t a = it->second;
      if (overlaps_held(a, bytes)) continue;
      auto [lo, hi] = by_addr_.equal_range(a);
      for (auto j = lo; j != hi; ++j)
        if (j->second == it->first) {
          by_addr_.erase(j);
          break;
        }
      by_size_.erase(it);
      return a;
    }
    return 0;
  }
  // Above every address held or offered (next_ is kept so), hence never one in use.
  std::uint64_t fresh(std::uint64_t bytes) {
    std::uint64_t span = round_up(bytes, kDriverGranularity);
    if (span < bytes || span > kTop || next_ > kTop - span) return 0;
    std::uint64_t a = next_;
    next_ += span;
    return a;
  }
  bool overlaps_held(std::uint64_t a, std::uint64_t bytes) const {
    auto it = held_.lower_bound(a + bytes);  // first segment starting at or after the end
    if (it == held_.begin()) return false;
    --it;
    return it->first + it->second > a;
  }
  ReplayDevice* out_;
  std::uint64_t limit_, reserved_ = 0, other_ = 0;
  std::uint64_t next_ = std::uint64_t{1} << 40;
  // Recorded segments not taken: (bytes, offer number) -> address, so the oldest of a size
  // comes first; address -> (bytes, offer number), for the recorded frees.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> by_size_;
  std::multimap<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> by_addr_;
  std::uint64_t offers_ = 0;
  std::map<std::uint64_t, std::uint64_t> held_;  // segments held here: base -> bytes
  std::vector<std::uint8_t> fences_;
  std::uint8_t* fence_data_ = nullptr;
  std::size_t fence_mask_ = 0;
  Fence base_ = 0;  // fences <= base_ are released (and done)
  std::uint64_t count_ = 0;
};

// Segments of one replayed pool, for what PoolStats does not say: the free bytes pinned by
// live blocks (non-releasable: empty_cache cannot give them back).
class SegTracker final : public pool::PoolObserver {
 public:
  void on_segment_alloc(void* p, std::size_t n, bool /*small*/) noexcept override {
    auto a = reinterpret_cast<std::uint64_t>(p);
    std::uint32_t slot;
    if (!free_.empty()) slot = free_.back(), free_.pop_back();
    else slot = static_cast<std::uint32_t>(segs_.size()), segs_.emplace_back();
    segs_[slot] = {a, n, 0};
    by_base_.get(a) = slot;
    auto it = std::lower_bound(starts_.begin(), starts_.end(), a);  // usually the end
    slots_.insert(slots_.begin() + (it - starts_.begin()), slot);
    starts_.insert(it, a);
  }
  void on_segment_free(void* p, std::size_t /*n*/, bool /*small*/) noexcept override {
    auto a = reinterpret_cast<std::uint64_t>(p);
    auto it = std::lower_bound(starts_.begin(), starts_.end(), a);
    auto i = it - starts_.begin();
    free_.push_back(slots_[static_cast<std::size_t>(i)]);
    by_base_.erase(a);
    slots_.erase(slots_.begin() + i);
    starts_.erase(it);
  }
  void on_retry(std::size_t /*requested*/) noexcept override { ++retries_; }

  // The slot of the segment that starts at `base` (the pool's OwnedBlock::segment): one
  // probe of a small table, where find() is a binary search with unpredictable branches.
  std::uint32_t find_base(std::uint64_t base) const { return *by_base_.find(base); }
  // The slot of the segment holding address a.
  std::uint32_t find(std::uint64_t a) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), a);
    return slots_[static_cast<std::size_t>(it - starts_.begin() - 1)];
  }
  // Σ over segments with a live block of (size - live bytes), kept per event.
  void add(std::uint32_t slot, std::uint64_t n) {
    Seg& s = segs_[slot];
    if (s.live++ == 0) non_releasable_ += s.size - n;
    else non_releasable_ -= n;
  }
  void remove(std::uint32_t slot, std::uint64_t n) {
    Seg& s = segs_[slot];
    if (--s.live == 0) non_releasable_ -= s.size - n;
    else non_releasable_ += n;
  }
  std::uint64_t non_releasable() const { return non_releasable_; }
  std::size_t count() const { return starts_.size(); }
  std::uint64_t retries() const { return retries_; }

 private:
  struct Seg {
    std::uint64_t base = 0, size = 0;
    std::uint32_t live = 0;
  };
  std::vector<Seg> segs_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint64_t> starts_;     // sorted
  std::vector<std::uint32_t> slots_;      // parallel to starts_
  base::FlatMap<std::uint32_t> by_base_;  // segment base -> slot
  std::uint64_t non_releasable_ = 0, retries_ = 0;
};

}  // namespace replay_sim
}  // namespace gpuheap
