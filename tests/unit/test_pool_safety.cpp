// Caching pool: stream safety (fences), OOM retry path, random-sequence invariants, threads.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "pool/pool.h"
#include "tests/unit/pool_test_util.h"
#include "tests/unit/pool_upstreams.h"

namespace gpuheap::pool {
namespace {

using namespace std::chrono_literals;
using test::DelayingUpstream;
using test::HostUpstream;
using test::LimitingUpstream;
using test::RecordingObserver;
using test_util::addr;
using test_util::KiB;
using test_util::MiB;
using test_util::must_alloc;

TEST(PoolFences, PendingBlocksAreNotReusedBeforeTheirFence) {
  HostUpstream up(HostUpstream::Fences::manual);
  RecordingObserver obs;
  PoolConfig cfg;
  cfg.seal_interval_ns = 1000;
  up.set_now(1'000'000);
  Pool p(up, cfg, &obs);
  PoolBlock a = must_alloc(p, 4 * KiB);
  ASSERT_TRUE(p.deallocate(a.ptr));
  EXPECT_EQ(up.records(), 1u);  // first free seals at once
  EXPECT_EQ(p.stats().pending, 4 * KiB);
  EXPECT_EQ(p.stats().cached_free, 2 * MiB);  // pending still counts as reserved, not allocated
  PoolBlock b = must_alloc(p, 4 * KiB);
  EXPECT_EQ(addr(b), addr(a) + 4 * KiB) << "pending block handed out before its fence";
  ASSERT_TRUE(p.deallocate(b.ptr));
  EXPECT_EQ(up.records(), 1u);  // within the seal interval: no new fence
  up.complete_all();            // fence 1 done; b is still unsealed
  obs.clear();
  PoolBlock c = must_alloc(p, 4 * KiB);
  EXPECT_EQ(c.ptr, a.ptr);  // reclaimed at the start of allocate, lowest address wins
  ASSERT_EQ(obs.kinds(), "C");
  EXPECT_EQ(obs.events()[0].ptr, addr(a));
  EXPECT_EQ(up.released(), 1u);
  EXPECT_EQ(p.stats().pending, 4 * KiB);  // b
  up.set_now(1'000'000 + 1000);
  // The interval has passed; within a run of frees the pool reads the clock only every 8th
  // free, so the seal (b, c and the temporaries together) comes within 8 frees.
  ASSERT_TRUE(p.deallocate(c.ptr));
  int frees = 1;
  for (; up.records() == 1 && frees < 8; ++frees) ASSERT_TRUE(p.deallocate(must_alloc(p, 4 * KiB).ptr));
  EXPECT_EQ(up.records(), 2u);
  EXPECT_LE(frees, 8);
  PoolBlock d = must_alloc(p, 4 * KiB);
  EXPECT_EQ(addr(d), addr(a) + 4 * KiB * (frees + 1)) << "a pending block was handed out";
  up.complete_all();
  PoolBlock e = must_alloc(p, 8 * KiB);  // a and b coalesced
  EXPECT_EQ(e.ptr, a.ptr);
  EXPECT_EQ(up.forced_waits(), 0u);
  EXPECT_TRUE(p.check_consistency());
}

TEST(PoolFences, MissWaitsForPendingBytesBeforeGrowing) {
  HostUpstream up(HostUpstream::Fences::manual);
  Pool p(up);
  PoolBlock a = must_alloc(p, 1 * MiB), b = must_alloc(p, 1 * MiB);
  ASSERT_EQ(up.alloc_calls(), 1u);
  ASSERT_TRUE(p.deallocate(a.ptr));
  PoolBlock c = must_alloc(p, 1 * MiB);
  EXPECT_EQ(c.ptr, a.ptr);
  EXPECT_EQ(up.forced_waits(), 1u);  // the host waited for the GPU instead of growing
  EXPECT_EQ(up.alloc_calls(), 1u);
  // Pending bytes that cannot serve the request: grow without waiting.
  ASSERT_TRUE(p.deallocate(b.ptr));
  PoolBlock d = must_alloc(p, 2 * MiB);  // large pool: small pending bytes are no use
  EXPECT_EQ(up.forced_waits(), 1u);
  EXPECT_EQ(up.alloc_calls(), 2u);
  (void)d;
  EXPECT_TRUE(p.check_consistency());
}

TEST(PoolFences, TrimReleasesOnlyWhatTheGpuFinishedWithoutWaiting) {
  HostUpstream up(HostUpstream::Fences::manual);
  RecordingObserver obs;
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 12 * MiB), b = must_alloc(p, 4 * KiB);
  ASSERT_TRUE(p.deallocate(a.ptr));                            // sealed (first free)
  ASSERT_TRUE(p.deallocate(b.ptr));                            // unsealed: trim never records or waits
  EXPECT_EQ(p.trim(format::EmptyCacheReason::threshold), 0u);  // fence not done: nothing is free yet
  EXPECT_EQ(up.forced_waits(), 0u);
  up.complete_all();
  obs.clear();
  EXPECT_EQ(p.trim(format::EmptyCacheReason::threshold), 12 * MiB);  // a's segment; b is still pending
  EXPECT_EQ(obs.kinds(), "CFE");
  EXPECT_EQ(p.stats().reserved, 2 * MiB);
  EXPECT_EQ(p.stats().pending, 4 * KiB);
  EXPECT_EQ(up.forced_waits(), 0u);
  EXPECT_TRUE(p.check_consistency());
}

// A slow "kernel" on stream 0 still writes into a block when the host frees it; the block is
// reallocated and stream 1 fills it. Returns true when stream 0's late write corrupted it.
bool late_write_corrupts(bool unsafe, std::size_t bytes, bool* same_address, std::uint64_t* waits) {
  DelayingUpstream gpu(2);
  PoolConfig cfg;
  cfg.unsafe_reuse = unsafe;
  Pool pool(gpu, cfg);
  // Words written per kernel: bounded so sanitizer builds stay quick.
  std::size_t words = std::min<std::size_t>(bytes, 256 * KiB) / sizeof(std::uint32_t);
  auto fill = [words](void* p, std::uint32_t v) {
    auto* w = static_cast<std::uint32_t*>(p);
    for (std::size_t i = 0; i < words; ++i) std::atomic_ref<std::uint32_t>(w[i]).store(v, std::memory_order_relaxed);
  };
  PoolBlock a = must_alloc(pool, bytes);
  gpu.launch(0, 300ms, [=] { fill(a.ptr, 0xAAAAAAAAu); });
  EXPECT_TRUE(pool.deallocate(a.ptr));
  PoolBlock b = must_alloc(pool, bytes);
  gpu.launch(1, 0ms, [=] { fill(b.ptr, 0x55555555u); });
  gpu.synchronize();
  bool corrupted = false;
  auto* w = static_cast<std::uint32_t*>(b.ptr);
  for (std::size_t i = 0; i < words; ++i)
    corrupted |= std::atomic_ref<std::uint32_t>(w[i]).load(std::memory_order_relaxed) != 0x55555555u;
  *same_address = a.ptr == b.ptr;
  *waits = gpu.waits();
  EXPECT_TRUE(pool.check_consistency());
  return corrupted;
}

TEST(PoolStreamSafety, FreedBlockIsNotReusedWhileEarlierWorkRuns) {
  bool same = false;
  std::uint64_t waits = 0;
  // Huge block (own segment): the only way to reuse it is to wait for stream 0.
  EXPECT_FALSE(late_write_corrupts(false, 10 * MiB, &same, &waits));
  EXPECT_TRUE(same) << "the pool should have waited for the fence and reused the segment";
  EXPECT_GE(waits, 1u);
  // Small block inside a shared segment: the pending block is skipped, no wait needed.
  EXPECT_FALSE(late_write_corrupts(false, 4 * KiB, &same, &waits));
  EXPECT_FALSE(same);
  EXPECT_EQ(waits, 0u);
}

TEST(PoolStreamSafety, UnsafeReuseIsCaughtByTheSameScenario) {
  // Proves the scenario above can fail: without fences the block comes back at once and
  // stream 0's late write lands in the new owner's data.
  bool same = false;
  std::uint64_t waits = 0;
  EXPECT_TRUE(late_write_corrupts(true, 10 * MiB, &same, &waits));
  EXPECT_TRUE(same);
  EXPECT_TRUE(late_write_corrupts(true, 4 * KiB, &same, &waits));
  EXPECT_TRUE(same);
  EXPECT_EQ(waits, 0u);
}

TEST(PoolOom, RetryReleasesCachedSegmentsThenRealOom) {
  LimitingUpstream up(32 * MiB);
  RecordingObserver obs;
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 12 * MiB);
  ASSERT_TRUE(p.deallocate(a.ptr));
  obs.clear();
  PoolBlock b;
  ASSERT_EQ(p.allocate(24 * MiB - 100, &b), PoolStatus::ok);  // 12 cached + 24 > 32
  EXPECT_EQ(b.size, 24 * MiB);
  // free completed -> cached segment freed -> empty_cache(oom_retry) -> retry -> new segment
  ASSERT_EQ(obs.kinds(), "CFERA");
  auto ev = obs.events();
  EXPECT_EQ(ev[0].ptr, addr(a));
  EXPECT_EQ(ev[1].ptr, addr(a));
  EXPECT_EQ(ev[1].size, 12 * MiB);
  EXPECT_EQ(ev[2].size, 12 * MiB);
  EXPECT_EQ(ev[2].extra, 2);
  EXPECT_EQ(ev[3].size, 24 * MiB - 100);  // the caller's request, unrounded
  EXPECT_EQ(ev[4].ptr, addr(b));
  EXPECT_EQ(ev[4].size, 24 * MiB);
  PoolStats st = p.stats();
  EXPECT_EQ(st.retries, 1u);
  EXPECT_EQ(st.ooms, 0u);
  EXPECT_EQ(st.reserved, 24 * MiB);

  obs.clear();
  PoolBlock c;
  EXPECT_EQ(p.allocate(24 * MiB, &c), PoolStatus::out_of_memory);
  EXPECT_EQ(obs.kinds(), "R");  // nothing cached to release, retried once, failed
  st = p.stats();
  EXPECT_EQ(st.retries, 2u);
  EXPECT_EQ(st.ooms, 1u);
  EXPECT_EQ(st.reserved, 24 * MiB);
  EXPECT_EQ(st.allocated, 24 * MiB);
  // Still usable after an OOM, and a request larger than anything is refused cleanly.
  EXPECT_EQ(p.allocate(SIZE_MAX - 10, &c), PoolStatus::out_of_memory);
  EXPECT_EQ(p.stats().ooms, 2u);
  ASSERT_TRUE(p.deallocate(b.ptr));
  EXPECT_EQ(p.allocate(30 * MiB, &c), PoolStatus::ok);
  EXPECT_TRUE(p.check_consistency());
}

// Random operation sequences against the pool's own accounting and an external model:
// segments (from the observer), live blocks (from allocate), and the blocks freed but not yet
// reported complete, which no allocation may overlap.
// Checks, at the moment a completion is reported, that a fence recorded after the free has
// completed on the (manual) upstream.
class FenceCheckingObserver : public RecordingObserver {
 public:
  explicit FenceCheckingObserver(HostUpstream& up) : up_(up) {}
  void on_free_completed(void* p, std::size_t n) noexcept override {
    auto it = mark_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == mark_.end() || up_.completed() <= it->second) ++early_;
    if (it != mark_.end()) mark_.erase(it);
    RecordingObserver::on_free_completed(p, n);
  }
  void freeing(const void* p) { mark_[reinterpret_cast<std::uintptr_t>(p)] = up_.last_fence(); }
  int early() const { return early_; }

 private:
  HostUpstream& up_;
  std::map<std::uintptr_t, HostUpstream::Fence> mark_;  // only touched under the pool lock
  int early_ = 0;
};

void random_sequence(PoolConfig cfg, std::uint32_t seed, int ops) {
  HostUpstream up(HostUpstream::Fences::manual, 400 * MiB);
  FenceCheckingObserver obs(up);
  std::uint64_t now = 1'000'000;
  up.set_now(now);
  Pool p(up, cfg, &obs);
  std::mt19937 rng(seed);
  std::map<std::uintptr_t, std::size_t> live, unreclaimed;
  std::vector<std::uintptr_t> order;
  std::size_t seen_events = 0;
  auto overlaps = [](const std::map<std::uintptr_t, std::size_t>& m, std::uintptr_t a, std::size_t n) {
    auto it = m.lower_bound(a + n);
    return it != m.begin() && (--it, it->first + it->second > a);
  };
  auto pick_size = [&]() -> std::size_t {
    switch (rng() % 10) {
      case 0: return 1 + rng() % (9 * MiB);          // large pool
      case 1: return 10 * MiB + rng() % (30 * MiB);  // own segment
      default: return 1 + rng() % (64 * KiB);        // small pool
    }
  };
  for (int i = 0; i < ops; ++i) {
    unsigned op = rng() % 100;
    if (op < 50) {
      PoolBlock b;
      if (p.allocate(pick_size(), &b) == PoolStatus::ok) {
        // Completions reported during this call come first: apply them before checking.
        auto ev = obs.events();
        for (; seen_events < ev.size(); ++seen_events)
          if (ev[seen_events].kind == 'C') {
            ASSERT_EQ(unreclaimed.erase(ev[seen_events].ptr), 1u) << "completed twice";
          }
        ASSERT_FALSE(overlaps(live, addr(b), b.size)) << "overlaps a live block";
        ASSERT_FALSE(overlaps(unreclaimed, addr(b), b.size)) << "reused before its fence";
        live[addr(b)] = b.size;
        order.push_back(addr(b));
      }
    } else if (op < 92 && !order.empty()) {
      std::size_t k = rng() % order.size();
      std::uintptr_t a = order[k];
      order[k] = order.back();
      order.pop_back();
      std::size_t sz = 0;
      obs.freeing(reinterpret_cast<void*>(a));
      ASSERT_TRUE(p.deallocate(reinterpret_cast<void*>(a), &sz));
      ASSERT_EQ(sz, live[a]);
      live.erase(a);
      if (!cfg.unsafe_reuse) unreclaimed[a] = sz;
    } else if (op < 97) {
      up.complete_all();
    } else if (op < 99) {
      now += cfg.seal_interval_ns;
      up.set_now(now);
    } else {
      p.empty_cache();
    }
    auto ev = obs.events();
    for (; seen_events < ev.size(); ++seen_events)
      if (ev[seen_events].kind == 'C' && !cfg.unsafe_reuse) {
        ASSERT_EQ(unreclaimed.erase(ev[seen_events].ptr), 1u);
      }
    ASSERT_EQ(obs.early(), 0) << "completion reported before its fence, op " << i;
    ASSERT_TRUE(p.check_consistency()) << "op " << i;
    PoolStats st = p.stats();
    std::size_t seg_sum = 0, live_sum = 0, pend_sum = 0;
    auto segs = obs.segments();
    for (auto& [base, n] : segs) seg_sum += n;
    for (auto& [a, n] : live) {
      live_sum += n;
      auto it = segs.upper_bound(a);
      ASSERT_NE(it, segs.begin());
      --it;
      ASSERT_LE(a + n, it->first + it->second) << "block outside its segment";
    }
    for (auto& [a, n] : unreclaimed) pend_sum += n;
    ASSERT_EQ(st.reserved, seg_sum);
    ASSERT_EQ(st.segments, segs.size());
    ASSERT_EQ(st.allocated, live_sum);
    ASSERT_EQ(st.blocks, live.size());
    ASSERT_EQ(st.pending, pend_sum);
    ASSERT_EQ(st.cached_free, st.reserved - st.allocated);
    ASSERT_LE(st.largest_free + st.pending, st.cached_free);
    ASSERT_EQ(up.in_use(), st.reserved);
  }
  // The sequence must have exercised the slow paths, or it proves little.
  PoolStats end = p.stats();
  EXPECT_GT(up.forced_waits(), 0u);
  EXPECT_GT(end.retries, 0u);
  EXPECT_GT(end.ooms, 0u);
  for (std::uintptr_t a : order) ASSERT_TRUE(p.deallocate(reinterpret_cast<void*>(a)));
  p.empty_cache();
  EXPECT_EQ(p.stats().reserved, 0u);
  EXPECT_EQ(up.in_use(), 0u);
}

TEST(PoolProperty, RandomSequencesKeepInvariantsDefaultConfig) { random_sequence({}, 12345, 3000); }

TEST(PoolProperty, RandomSequencesKeepInvariantsOversizeAndEagerFences) {
  PoolConfig cfg;
  cfg.max_split_size = 24 * MiB;
  cfg.seal_interval_ns = 0;
  random_sequence(cfg, 777, 3000);
}

TEST(PoolProperty, RandomSequencesKeepInvariantsUnderALimit) {
  PoolConfig cfg;
  cfg.limit = 100 * MiB;
  random_sequence(cfg, 4242, 3000);
}

TEST(PoolThreads, ConcurrentAllocFreeKeepsBlocksDisjoint) {
  HostUpstream up;
  PoolConfig cfg;
  cfg.seal_interval_ns = 20'000;
  Pool p(up, cfg);
  constexpr int kThreads = 4, kOps = 10000;
  std::atomic<bool> bad{false}, stop{false};
  auto worker = [&](int t) {
    std::mt19937 rng(static_cast<std::uint32_t>(t) * 7919u + 1);
    std::vector<PoolBlock> mine;
    const std::uint64_t tag = 0xC0FFEE00ull + static_cast<std::uint64_t>(t);
    auto stamp = [&](const PoolBlock& b, std::uint64_t v) {
      auto* w = static_cast<std::uint64_t*>(b.ptr);
      w[0] = v;
      w[b.size / 8 - 1] = v;
    };
    for (int i = 0; i < kOps; ++i) {
      if (mine.size() < 64 && (mine.empty() || rng() % 2)) {
        std::size_t n = rng() % 8 == 0 ? 1 * MiB + rng() % (3 * MiB) : 8 + rng() % (32 * KiB);
        PoolBlock b;
        if (p.allocate(n, &b) != PoolStatus::ok) {
          bad = true;
          return;
        }
        stamp(b, tag ^ reinterpret_cast<std::uintptr_t>(b.ptr));
        mine.push_back(b);
      } else {
        std::size_t k = rng() % mine.size();
        PoolBlock b = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        auto* w = static_cast<std::uint64_t*>(b.ptr);
        std::uint64_t want = tag ^ reinterpret_cast<std::uintptr_t>(b.ptr);
        if (w[0] != want || w[b.size / 8 - 1] != want) bad = true;  // someone else wrote here
        if (!p.deallocate(b.ptr)) bad = true;
      }
    }
    for (auto& b : mine) p.deallocate(b.ptr);
  };
  std::thread observer([&] {
    while (!stop) {
      PoolStats st = p.stats();
      if (st.cached_free != st.reserved - st.allocated || st.pending > st.cached_free) bad = true;
      PoolBlock f;
      p.find(reinterpret_cast<void*>(0x1000), &f);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  stop = true;
  observer.join();
  EXPECT_FALSE(bad);
  EXPECT_TRUE(p.check_consistency());
  PoolStats st = p.stats();
  EXPECT_EQ(st.allocated, 0u);
  EXPECT_EQ(st.blocks, 0u);
  EXPECT_EQ(p.empty_cache(), st.reserved);
  EXPECT_EQ(p.stats().reserved, 0u);
  EXPECT_EQ(up.in_use(), 0u);
}

}  // namespace
}  // namespace gpuheap::pool
