// Differential test of the replay's segment bookkeeping: random valid pool traces (splits,
// adjacent blocks, delayed free_completed, segment frees, OOM snapshots, the layout at the
// peak of allocated memory, pending frees completed by the end record) replayed by the
// Model and by a brute-force reference written here (ordered block sets, every statistic
// recomputed from scratch after each event). The Model keeps only counts and neighbour
// checks per event and rebuilds layouts lazily; every number must still match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "analyzer/model/model.h"
#include "tests/unit/test_analyzer_util.h"

namespace gpuheap {
namespace {

using format::AllocKind;
using test::TraceBuilder;

struct RefFrag {
  std::uint64_t reserved = 0, active = 0, free_bytes = 0, largest = 0, pieces = 0;
};

class Reference {
 public:
  struct Seg {
    std::uint64_t size = 0;
    bool small = false;
    std::set<std::pair<std::uint64_t, std::uint64_t>> active;  // (ptr, size)
  };
  struct Block {
    std::uint64_t seg = 0, size = 0, requested = 0;
    bool pending = false;
  };

  std::map<std::uint64_t, Seg> segs;
  std::map<std::uint64_t, Block> live;
  // [metric][pool] with the Model's Stat semantics, fed one delta per changed total.
  std::map<int, std::array<Stat, 3>> stat;
  std::int64_t cur[kNumMetrics][3] = {};
  RefFrag frag_peak;  // layout when allocated first reached its peak
  std::int64_t frag_peak_allocated = 0;
  bool frag_valid = false;
  std::vector<RefFrag> ooms;

  RefFrag layout() const {
    RefFrag f;
    for (const auto& [p, s] : segs) {
      f.reserved += s.size;
      std::uint64_t c = p;
      for (const auto& [bp, bs] : s.active) {
        f.active += bs;
        if (bp > c) piece(f, bp - c);
        c = std::max(c, bp + bs);
      }
      if (p + s.size > c) piece(f, p + s.size - c);
    }
    return f;
  }
  // Recomputes every tracked total and feeds the changes into the stats.
  void settle() {
    std::int64_t now[kNumMetrics][3] = {};
    for (const auto& [p, s] : segs) {
      int pool = s.small ? kSmallPool : kLargePool;
      std::int64_t act = 0, pieces = 0;
      std::uint64_t c = p;
      for (const auto& [bp, bs] : s.active) {
        act += static_cast<std::int64_t>(bs);
        if (bp > c) ++pieces;
        c = std::max(c, bp + bs);
      }
      if (p + s.size > c) ++pieces;
      for (int q : {0, pool}) {
        now[kReservedBytes][q] += static_cast<std::int64_t>(s.size);
        now[kSegments][q] += 1;
        now[kDeviceAllocs][q] += 1;  // each segment is one driver allocation
        now[kActiveBytes][q] += act;
        now[kActiveAllocs][q] += static_cast<std::int64_t>(s.active.size());
        if (!s.active.empty()) {
          now[kInactiveSplitBytes][q] += static_cast<std::int64_t>(s.size) - act;
          now[kInactiveSplit][q] += pieces;
        }
      }
    }
    for (const auto& [p, b] : live) {
      if (b.pending) continue;
      int pool = segs.at(b.seg).small ? kSmallPool : kLargePool;
      for (int q : {0, pool}) {
        now[kAllocatedBytes][q] += static_cast<std::int64_t>(b.size);
        now[kRequestedBytes][q] += static_cast<std::int64_t>(b.requested);
        now[kAllocations][q] += 1;
      }
    }
    for (int m = 0; m < kNumMetrics; ++m)
      for (int q = 0; q < 3; ++q) {
        // The Model updates the all-pools stat with the same deltas as the pool's.
        if (now[m][q] != cur[m][q]) stat[m][q].add(now[m][q] - cur[m][q]);
        cur[m][q] = now[m][q];
      }
  }

 private:
  static void piece(RefFrag& f, std::uint64_t n) {
    f.free_bytes += n, f.pieces++;
    f.largest = std::max(f.largest, n);
  }
};

void expect_frag(const Fragmentation& got, const RefFrag& want, const std::string& what) {
  ASSERT_TRUE(got.valid) << what;
  EXPECT_EQ(got.reserved, want.reserved) << what;
  EXPECT_EQ(got.active, want.active) << what;
  EXPECT_EQ(got.free_bytes, want.free_bytes) << what;
  EXPECT_EQ(got.largest_free, want.largest) << what;
  EXPECT_EQ(got.free_pieces, want.pieces) << what;
}

// no_new_peak_after: from that event on, allocations that would raise allocated to a new
// peak are skipped, so the layout at the peak must be rebuilt from a long log of what left
// it since (the blocks and segments there at the peak, nearly all gone by the end).
void run_case(unsigned seed, int events, int no_new_peak_after = -1) {
  std::mt19937_64 rng(seed);
  auto rnd = [&](std::uint64_t n) { return n ? rng() % n : 0; };
  TraceBuilder b;
  Reference ref;
  constexpr std::uint64_t kUnit = 512, kBase = 0x7f0000000000ull, kSpacing = 1ull << 24;
  std::uint64_t next_seg = 0;
  std::vector<std::uint64_t> pending;  // freed, not yet completed
  int ooms = 0;
  for (int i = 0; i < events; ++i) {
    auto r = rnd(100);
    if (ref.segs.empty() || r < 8) {
      // New segment: small sizes so that blocks often fill, touch and split them.
      std::uint64_t size = (1 + rnd(24)) * kUnit, ptr = kBase + (next_seg++) * kSpacing;
      bool small = rnd(2);
      b.segment(ptr, size, small);
      ref.segs[ptr] = {size, small, {}};
    } else if (r < 50) {
      // Alloc in a random free gap of a random segment, often flush with a neighbour.
      auto it = ref.segs.begin();
      std::advance(it, static_cast<long>(rnd(ref.segs.size())));
      auto& [sp, s] = *it;
      std::vector<std::pair<std::uint64_t, std::uint64_t>> gaps;
      std::uint64_t c = sp;
      for (const auto& [bp, bs] : s.active) {
        if (bp > c) gaps.push_back({c, bp - c});
        c = bp + bs;
      }
      if (sp + s.size > c) gaps.push_back({c, sp + s.size - c});
      if (gaps.empty()) continue;
      auto [gp, gn] = gaps[rnd(gaps.size())];
      std::uint64_t units = gn / kUnit;
      std::uint64_t off = rnd(3) == 0 ? rnd(units) : 0;
      std::uint64_t size = (1 + rnd(units - off)) * kUnit;
      if (rnd(3) == 0) off = units - size / kUnit;  // flush with the gap's end
      std::uint64_t ptr = gp + off * kUnit, req = size - rnd(kUnit);
      const bool new_peak = ref.cur[kAllocatedBytes][0] + static_cast<std::int64_t>(size) > ref.frag_peak_allocated;
      if (no_new_peak_after >= 0 && i >= no_new_peak_after && new_peak) continue;
      b.alloc(ptr, req, size, 1 + static_cast<std::uint32_t>(rnd(5)), AllocKind::device_pooled,
              s.small ? format::kFlagSmallPool : 0, 1 + static_cast<std::uint32_t>(rnd(3)));
      s.active.insert({ptr, size});
      ref.live[ptr] = {sp, size, req, false};
      if (new_peak) {
        ref.frag_peak = ref.layout(), ref.frag_valid = true;
        ref.frag_peak_allocated = ref.cur[kAllocatedBytes][0] + static_cast<std::int64_t>(size);
      }
    } else if (r < 75) {
      std::vector<std::uint64_t> cand;
      for (auto& [p, bl] : ref.live)
        if (!bl.pending) cand.push_back(p);
      if (cand.empty()) continue;
      auto p = cand[rnd(cand.size())];
      auto& bl = ref.live[p];
      b.free(p, AllocKind::device_pooled, 1, 0, ref.segs.at(bl.seg).small ? format::kFlagSmallPool : 0);
      bl.pending = true;
      pending.push_back(p);
    } else if (r < 95) {
      if (pending.empty()) continue;
      auto k = rnd(pending.size());
      auto p = pending[k];
      pending.erase(pending.begin() + static_cast<long>(k));
      b.completed(p);
      auto bl = ref.live[p];
      ref.segs.at(bl.seg).active.erase({p, bl.size});
      ref.live.erase(p);
    } else if (r < 98) {
      // Release a fully free segment (as emptyCache does).
      std::vector<std::uint64_t> empty;
      for (auto& [p, s] : ref.segs)
        if (s.active.empty()) empty.push_back(p);
      if (empty.empty()) continue;
      auto p = empty[rnd(empty.size())];
      b.segment(p, ref.segs.at(p).size, ref.segs.at(p).small, true);
      ref.segs.erase(p);
    } else {
      format::OomRecord o;
      o.ts = b.tick(), o.requested = 1 << 20;
      b.put(o);
      if (ooms++ < static_cast<int>(Model::kMaxOomDetails)) ref.ooms.push_back(ref.layout());
    }
    ref.settle();
  }
  b.end();
  // The end record: the process has exited, so every free still waiting is complete (the
  // Model completes them in address order).
  std::sort(pending.begin(), pending.end());
  for (auto p : pending) {
    auto bl = ref.live[p];
    ref.segs.at(bl.seg).active.erase({p, bl.size});
    ref.live.erase(p);
    ref.settle();
  }

  auto a = test::analyze_one(b, "replay_diff_" + std::to_string(seed) + ".trace");
  ASSERT_EQ(a.traces.size(), 1u);
  const auto& m = *a.traces[0];
  ASSERT_EQ(m.devices.size(), 1u);
  const auto& d = m.devices[0];
  for (int metric : {kRequestedBytes, kAllocatedBytes, kActiveBytes, kReservedBytes, kInactiveSplitBytes, kAllocations,
                     kActiveAllocs, kSegments, kInactiveSplit})
    for (int q = 0; q < 3; ++q) {
      const auto& got = d.stat[metric][q];
      const auto& want = ref.stat[metric][q];
      std::string what = "seed " + std::to_string(seed) + " metric " + std::to_string(metric) + " pool " +
                         std::to_string(q);
      EXPECT_EQ(got.current, want.current) << what;
      EXPECT_EQ(got.peak, want.peak) << what;
      EXPECT_EQ(got.allocated, want.allocated) << what;
      EXPECT_EQ(got.freed, want.freed) << what;
    }
  EXPECT_EQ(d.stat[kActiveBytes][0].current, d.stat[kAllocatedBytes][0].current) << "seed " << seed;
  if (ref.frag_valid) {
    expect_frag(d.frag_peak, ref.frag_peak, "peak allocated, seed " + std::to_string(seed));
    EXPECT_EQ(d.frag_peak.allocated, static_cast<std::uint64_t>(ref.frag_peak_allocated)) << "seed " << seed;
  }
  ASSERT_EQ(m.ooms.size(), ref.ooms.size());
  for (std::size_t i = 0; i < ref.ooms.size(); ++i)
    expect_frag(m.ooms[i].frag, ref.ooms[i], "oom " + std::to_string(i) + ", seed " + std::to_string(seed));
}

TEST(Model, RandomPoolTracesMatchReferenceReplay) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    run_case(seed, 3000);
    if (HasFailure()) break;
  }
}

TEST(Model, LayoutAtPeakAllocatedIsRebuiltFromItsLog) {
  for (unsigned seed = 100; seed <= 105; ++seed) {
    run_case(seed, 30000, 2000);
    if (HasFailure()) break;
  }
}

// A free skips its timeline sample when it can only lower the sampled series; a completion
// that raises one (a block whose size reads negative as a signed count: a damaged trace)
// must make the next free sample. All records at one timestamp, so every sample lands in
// the first bucket: active goes 0 (segment) -> about -2^63 (the damaged block) -> +1 MiB
// (its completion), and the free after that is what records the 1 MiB in the bucket.
TEST(Model, FreeAfterAnUnsampledRiseStillSamples) {
  constexpr std::uint64_t S = 0x7f0000000000ull, MiB = 1 << 20;
  TraceBuilder b;
  auto same_ts = [&] { b.ts -= 1000; };  // the next record's tick() gives this one's time back
  b.segment(S, 1024 * MiB, false), same_ts();
  b.alloc(S + 64 * MiB, 1, (std::uint64_t{1} << 63) + 4096), same_ts();  // size reads negative
  b.alloc(S, MiB, MiB), same_ts();
  b.free(S + 64 * MiB), same_ts();
  b.completed(S + 64 * MiB), same_ts();  // active rises to +1 MiB, unsampled
  b.free(S), same_ts();                  // lowers nothing sampled... but must sample the rise
  b.end();
  auto a = test::analyze_one(b, "unsampled_rise.trace");
  ASSERT_EQ(a.traces.size(), 1u);
  const auto& d = a.traces[0]->devices.at(0);
  std::int64_t max_active = INT64_MIN;
  for (const auto& p : d.timeline.points()) max_active = std::max(max_active, p.active);
  EXPECT_EQ(max_active, static_cast<std::int64_t>(MiB));
}

}  // namespace
}  // namespace gpuheap
