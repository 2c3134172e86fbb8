// Value types of the replay model: PyTorch-style stats, a bounded timeline, a size
// histogram.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuheap {

// torch.cuda.memory_stats() semantics: current, peak (max of current), allocated (sum of
// increases), freed (sum of decreases).
struct Stat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(std::int64_t d) {
    current += d;
    if (d > 0) {
      allocated += d;
      if (current > peak) peak = current;
    } else {
      freed -= d;
    }
  }
};

enum Metric : int {
  kRequestedBytes,
  kAllocatedBytes,
  kActiveBytes,
  kReservedBytes,
  kInactiveSplitBytes,
  kAllocations,
  kActiveAllocs,
  kSegments,
  kInactiveSplit,
  kOversizeAllocations,
  kOversizeSegments,
  // Driver allocations the job made for device memory (pool segments + pass-through and
  // pitch allocations): torch's num_device_alloc/free (allocated/freed). In no table.
  kDeviceAllocs,
  kNumMetrics
};
enum PoolIndex : int { kAllPools = 0, kLargePool = 1, kSmallPool = 2 };

// A device's Stats, read as stat[metric][pool] and stored pool-major: an event changes
// several metrics of `all` and of its pool together, so each of the two rows it touches is
// one run of adjacent Stats (a few cache lines, not one per metric).
class DeviceStats {
 public:
  using Pool = std::array<Stat, kNumMetrics>;
  template <class Pools, class S>
  class Row {
   public:
    Row(Pools* p, int metric) : p_(p), m_(metric) {}
    S& operator[](int pool) const { return (*p_)[pool][m_]; }

   private:
    Pools* p_;
    int m_;
  };
  Row<std::array<Pool, 3>, Stat> operator[](int metric) { return {&p_, metric}; }
  Row<const std::array<Pool, 3>, const Stat> operator[](int metric) const { return {&p_, metric}; }
  Pool& pool(int p) { return p_[p]; }
  const Pool& pool(int p) const { return p_[p]; }
  std::array<Pool, 3>& pools() { return p_; }

 private:
  std::array<Pool, 3> p_{};
};

// Down-sampled timeline: at most `max_buckets` buckets of equal width; when time runs past
// the last bucket the width doubles and neighbours merge. Each bucket keeps the exact
// maximum of every series, so the series' peaks are exact however long the trace.
class Timeline {
 public:
  struct Point {
    std::uint64_t t = 0;  // bucket start, ns since the timeline's first sample
    std::int64_t requested = 0, allocated = 0, reserved = 0, active = 0;
  };
  Timeline() : Timeline(2048) {}
  explicit Timeline(std::size_t max_buckets) : max_(max_buckets < 2 ? 2 : max_buckets) {}

  // active: allocated + freed blocks still pending (the HTML report's fourth series; the
  // merged multi-process timeline has none and passes 0).
  void sample(std::uint64_t ts, std::int64_t requested, std::int64_t allocated, std::int64_t reserved,
              std::int64_t active = 0) {
    // Consecutive samples nearly always land in the bucket of the one before (2048 buckets
    // for millions of events): one compare finds it, and only the maxima are updated.
    if (in_last_bucket(ts)) {
      max_into(b_[cur_], requested, allocated, reserved, active);
      return;
    }
    if (!started_) t0_ = ts, started_ = true;
    if (ts < t0_) ts = t0_;  // threads' timestamps may interleave slightly out of order
    // width_ is a power of two: a shift, not a division, on the per-event path.
    std::uint64_t idx = (ts - t0_) >> shift_;
    while (idx >= max_) {
      compact();
      idx = (ts - t0_) >> shift_;
    }
    if (idx >= b_.size()) b_.resize(idx + 1);
    auto& x = b_[idx];
    if (!x.used) {
      x = {requested, allocated, reserved, active, true};
    } else {
      max_into(x, requested, allocated, reserved, active);
    }
    cur_ = static_cast<std::size_t>(idx), cur_lo_ = t0_ + (idx << shift_), cur_width_ = width_;
  }
  // Whether a sample at ts goes to the bucket of the sample before it: one that no series
  // exceeds since then changes nothing (Model's frees skip it).
  bool in_last_bucket(std::uint64_t ts) const { return ts - cur_lo_ < cur_width_; }
  std::vector<Point> points() const {
    std::vector<Point> out;
    for (std::size_t i = 0; i < b_.size(); ++i)
      if (b_[i].used) out.push_back({i * width_, b_[i].requested, b_[i].allocated, b_[i].reserved, b_[i].active});
    return out;
  }
  std::uint64_t start() const { return t0_; }
  std::uint64_t bucket_ns() const { return width_; }
  std::size_t max_buckets() const { return max_; }

 private:
  struct Bucket {
    std::int64_t requested = 0, allocated = 0, reserved = 0, active = 0;
    bool used = false;
  };
  static void max_into(Bucket& x, std::int64_t requested, std::int64_t allocated, std::int64_t reserved,
                       std::int64_t active) {
    if (requested > x.requested) x.requested = requested;
    if (allocated > x.allocated) x.allocated = allocated;
    if (reserved > x.reserved) x.reserved = reserved;
    if (active > x.active) x.active = active;
  }
  void compact() {
    cur_width_ = 0;  // bucket indexes change: the next sample takes the full path
    width_ *= 2;
    ++shift_;
    std::vector<Bucket> n((b_.size() + 1) / 2);
    for (std::size_t i = 0; i < b_.size(); ++i) {
      auto& d = n[i / 2];
      const auto& s = b_[i];
      if (!s.used) continue;
      if (!d.used) {
        d = s;
      } else {
        if (s.requested > d.requested) d.requested = s.requested;
        if (s.allocated > d.allocated) d.allocated = s.allocated;
        if (s.reserved > d.reserved) d.reserved = s.reserved;
        if (s.active > d.active) d.active = s.active;
      }
    }
    b_.swap(n);
  }
  std::size_t max_;
  std::uint64_t t0_ = 0, width_ = 1;
  unsigned shift_ = 0;
  bool started_ = false;
  std::vector<Bucket> b_;
  // The bucket the last sample went to (b_[cur_], used) and its time range
  // [cur_lo_, cur_lo_ + cur_width_); cur_width_ 0: none.
  std::size_t cur_ = 0;
  std::uint64_t cur_lo_ = 0, cur_width_ = 0;
};

// Log-linear histogram of sizes (64 sub-buckets per power of two): a median within 1/64
// relative error in bounded memory, whatever the number of distinct sizes.
class SizeHistogram {
 public:
  void add(std::uint64_t v) {
    auto i = index(v);
    if (i >= counts_.size()) counts_.resize(i + 1);
    ++counts_[i];
    ++n_;
  }
  std::uint64_t count() const { return n_; }
  // Lower bound of the bucket holding the median (0 when empty).
  std::uint64_t median() const {
    if (n_ == 0) return 0;
    std::uint64_t target = (n_ + 1) / 2, seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= target) return lower(i);
    }
    return 0;
  }

 private:
  static constexpr unsigned kSub = 6;
  static std::size_t index(std::uint64_t v) {
    if (v < (1u << kSub)) return static_cast<std::size_t>(v);
    unsigned e = 63 - static_cast<unsigned>(__builtin_clzll(v));  // >= kSub
    std::uint64_t m = (v >> (e - kSub)) & ((1u << kSub) - 1);
    return ((e - kSub + 1) << kSub) + m;
  }
  static std::uint64_t lower(std::size_t i) {
    if (i < (1u << kSub)) return i;
    std::size_t e = (i >> kSub) + kSub - 1;
    std::uint64_t m = i & ((1u << kSub) - 1);
    return (std::uint64_t{1} << e) | (m << (e - kSub));
  }
  std::vector<std::uint64_t> counts_;
  std::uint64_t n_ = 0;
};

}  // namespace gpuheap
