// Model: restriction to a time window (summary --phase/--time/--after, check --after).
// The replay itself runs over the whole trace (what is live at a window's start was
// allocated before it); only what the sections report is restricted:
//  - peaks (every Stat, kinds, peak consumers, fragmentation at the peak): the maximum
//    reached inside the window, as torch.cuda.reset_peak_memory_stats() at its start gives;
//  - cumulative figures (Tot Alloc/Freed, per-site allocations, temporaries): made inside;
//  - leaks: allocations made inside an interval and still live at its end;
//  - OOMs, retries, empty_cache calls: those inside.
// No per-event cost: outside the window every peak is parked at INT64_MAX (so no event
// raises it) and restored at the next entry; the edge test is one compare in touch_ts.
#include <algorithm>
#include <limits>

#include "analyzer/model/model.h"

namespace gpuheap {

namespace {
constexpr std::int64_t kParked = std::numeric_limits<std::int64_t>::max();
bool leak_counted_kind(format::AllocKind k) {
  return k != format::AllocKind::va_reserve && k != format::AllocKind::vmm_map;
}
}  // namespace

void Model::set_window(std::vector<std::pair<std::uint64_t, std::uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  window_.clear();
  for (const auto& x : iv) {
    if (x.second <= x.first) continue;
    if (!window_.empty() && x.first <= window_.back().second)
      window_.back().second = std::max(window_.back().second, x.second);
    else window_.push_back(x);
  }
  windowed_ = true, in_window_ = false, edge_ = 0;
  next_edge_ = window_.empty() ? ~std::uint64_t{0} : window_[0].first;
  dev_win_.resize(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) freeze_device(i);
}

void Model::cross_edges(std::uint64_t ts) {
  flush_site_drops();  // the releases before the edge count on its side
  // ~0 is both "no edge left" and a valid (hostile) timestamp: stop after the last edge.
  while (ts >= next_edge_ && edge_ < 2 * window_.size()) {
    const auto at = next_edge_;
    if (edge_ % 2 == 0) enter_window(at);
    else leave_window();
    ++edge_;
    std::size_t k = edge_ / 2;
    next_edge_ = k >= window_.size() ? ~std::uint64_t{0} : (edge_ % 2 == 0 ? window_[k].first : window_[k].second);
  }
}

void Model::freeze_device(std::size_t i) {
  auto& d = devices[i];
  auto& w = dev_win_[i];
  for (int m = 0; m < kNumMetrics; ++m)
    for (int p = 0; p < 3; ++p) {
      auto& s = d.stat[m][p];
      if (s.peak != kParked) w.acc[m][p].peak = s.peak;
      s.peak = kParked;
    }
  for (int k = 0; k < format::kNumAllocKinds; ++k) {
    auto& u = d.kinds[k];
    if (u.peak != kParked) w.kacc[k].peak = u.peak, w.kacc[k].peak_count = u.peak_count;
    u.peak = u.peak_count = kParked;
  }
  if (d.peak_held != kParked) w.peak_held = d.peak_held;
  d.peak_held = kParked;
}

void Model::derive_freed() {
  for (auto& d : devices)
    for (auto& p : d.stat.pools())
      for (auto& s : p) s.freed = s.allocated - s.current;  // what Stat::add would have summed
}

void Model::enter_window(std::uint64_t ts) {
  in_window_ = true;
  derive_freed();  // w.base copies it
  entry_seq_ = seq_;
  site_base_ = sites;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    auto& w = dev_win_[i];
    const std::int64_t alloc_peak = w.acc[kAllocatedBytes][0].peak;
    for (int m = 0; m < kNumMetrics; ++m)
      for (int p = 0; p < 3; ++p) {
        auto& s = d.stat[m][p];
        s.peak = std::max(w.acc[m][p].peak, s.current);  // the value at the entry is inside
        w.base[m][p] = s;
      }
    for (int k = 0; k < format::kNumAllocKinds; ++k) {
      auto& u = d.kinds[k];
      u.peak = std::max(w.kacc[k].peak, u.current), u.peak_count = std::max(w.kacc[k].peak_count, u.count);
      w.kbase[k] = u;
    }
    if (d.stat[kAllocatedBytes][0].current > alloc_peak) {
      // The entry is a new peak of allocated memory: its layout is the fragmentation's.
      d.frag_seq = seq_, d.frag_ts = ts, d.frag_open = true;
      d.frag_log.clear();
    }
    if (d.held_requested > w.peak_held) {
      d.peak_held = d.held_requested, d.peak_held_allocated = d.held;
      d.peak_held_ts = ts, d.peak_seq = seq_, d.peak_alloc = allocs_, ++d.epoch;
    } else {
      d.peak_held = w.peak_held;
    }
  }
  if (site_acc_.size() < sites.size()) site_acc_.resize(sites.size());
  for (std::size_t i = 0; i < sites.size(); ++i)
    sites[i].max_live_bytes = std::max(site_acc_[i].max_live_bytes, sites[i].live_bytes);
}

void Model::leave_window() {
  in_window_ = false;
  derive_freed();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    auto& w = dev_win_[i];
    for (int m = 0; m < kNumMetrics; ++m)
      for (int p = 0; p < 3; ++p) {
        const auto& s = d.stat[m][p];
        w.acc[m][p].allocated += s.allocated - w.base[m][p].allocated;
        w.acc[m][p].freed += s.freed - w.base[m][p].freed;
      }
    for (int k = 0; k < format::kNumAllocKinds; ++k) {
      const auto& u = d.kinds[k];
      w.kacc[k].total += u.total - w.kbase[k].total;
      w.kacc[k].total_count += u.total_count - w.kbase[k].total_count;
      w.kacc[k].used = w.kacc[k].used || u.total_count != w.kbase[k].total_count;
    }
    freeze_device(i);
  }
  if (site_acc_.size() < sites.size()) site_acc_.resize(sites.size());
  for (std::size_t i = 0; i < sites.size(); ++i) {
    const auto& s = sites[i];
    const Site b = i < site_base_.size() ? site_base_[i] : Site{};
    auto& a = site_acc_[i];
    a.allocs += s.allocs - b.allocs, a.alloc_bytes += s.alloc_bytes - b.alloc_bytes;
    a.alloc_allocated += s.alloc_allocated - b.alloc_allocated;
    a.temporaries += s.temporaries - b.temporaries, a.temporary_bytes += s.temporary_bytes - b.temporary_bytes;
    a.temporary_allocated += s.temporary_allocated - b.temporary_allocated;
    a.max_live_bytes = std::max(a.max_live_bytes, s.max_live_bytes);
    sites[i].max_live_bytes = kParked;
  }
  site_base_.clear();
  // Leaks of this interval: made inside it, still live (not freed) at its end.
  live_.for_each([&](std::uint64_t, const Live& e) {
    if (e.seq <= entry_seq_ || pending(e)) return;
    auto& l = win_leaks_.get(e.stack);
    l.stack = e.stack, l.bytes += e.requested, l.allocated += e.size, l.count++;
    if (leak_counted_kind(static_cast<format::AllocKind>(e.kind))) {
      win_leaked_bytes_ += e.requested, win_leaked_allocated_ += e.size;
      devices[e.dev].leaked_bytes += e.requested;
    }
    win_leaked_count_++;
  });
}

// At finish: close an open interval at the end, put the inside figures in place.
void Model::finish_window() {
  if (in_window_) leave_window();
  next_edge_ = ~std::uint64_t{0};
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto& d = devices[i];
    const auto& w = dev_win_[i];
    for (int m = 0; m < kNumMetrics; ++m)
      for (int p = 0; p < 3; ++p) {
        auto& s = d.stat[m][p];
        s.peak = w.acc[m][p].peak, s.allocated = w.acc[m][p].allocated, s.freed = w.acc[m][p].freed;
      }
    for (int k = 0; k < format::kNumAllocKinds; ++k) {
      auto& u = d.kinds[k];
      const auto& a = w.kacc[k];
      u.peak = a.peak, u.peak_count = a.peak_count, u.total = a.total, u.total_count = a.total_count;
      u.used = u.used && (a.used || a.peak > 0);
    }
    d.peak_held = w.peak_held;
  }
  site_acc_.resize(sites.size());
  for (std::size_t i = 0; i < sites.size(); ++i) {
    auto& s = sites[i];
    const auto& a = site_acc_[i];
    s.allocs = a.allocs, s.alloc_bytes = a.alloc_bytes, s.alloc_allocated = a.alloc_allocated;
    s.temporaries = a.temporaries, s.temporary_bytes = a.temporary_bytes, s.temporary_allocated = a.temporary_allocated;
    s.max_live_bytes = a.max_live_bytes;
  }
  site_acc_ = {};
}

}  // namespace gpuheap
