// Caching pool: sizing, splitting, coalescing, best fit, oversize, find, stats.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "pool/pool.h"
#include "tests/unit/pool_test_util.h"
#include "tests/unit/pool_upstreams.h"

namespace gpuheap::pool {
namespace {

using test::HostUpstream;
using test::RecordingObserver;
using test_util::addr;
using test_util::KiB;
using test_util::MiB;
using test_util::must_alloc;

struct PoolTest : ::testing::Test {
  HostUpstream up;
  RecordingObserver obs;
};

struct RoundCase {
  std::size_t request, block, segment;
  bool small;
};

TEST_F(PoolTest, RoundingAndSegmentSizes) {
  const RoundCase cases[] = {
      {0, 512, 2 * MiB, true},
      {1, 512, 2 * MiB, true},
      {512, 512, 2 * MiB, true},
      {513, 1024, 2 * MiB, true},
      {1 * MiB, 1 * MiB, 2 * MiB, true},
      {1 * MiB + 1, 1 * MiB + 512, 20 * MiB, false},
      {9 * MiB + 1, 9 * MiB + 512, 20 * MiB, false},  // remainder > 1 MiB: split off
      {10 * MiB - 1, 10 * MiB, 10 * MiB, false},      // the rounded size decides
      {10 * MiB, 10 * MiB, 10 * MiB, false},
      {11 * MiB + 1, 12 * MiB, 12 * MiB, false},  // remainder 1 MiB - 512: not split
      {19 * MiB, 20 * MiB, 20 * MiB, false},      // remainder exactly 1 MiB: not split
  };
  for (const auto& c : cases) {
    HostUpstream u;
    RecordingObserver o;
    Pool p(u, {}, &o);
    PoolBlock b = must_alloc(p, c.request);
    EXPECT_EQ(b.size, c.block) << c.request;
    EXPECT_EQ(b.small, c.small) << c.request;
    EXPECT_FALSE(b.oversize);
    ASSERT_EQ(o.segments().size(), 1u);
    EXPECT_EQ(o.segments().begin()->second, c.segment) << c.request;
    EXPECT_EQ(o.segments().begin()->first, addr(b)) << "block starts its segment";
    PoolStats st = p.stats();
    EXPECT_EQ(st.reserved, c.segment);
    EXPECT_EQ(st.allocated, c.block);
    EXPECT_EQ(st.cached_free, c.segment - c.block);
    EXPECT_EQ(p.cached_unused(), c.segment - c.block);
    EXPECT_TRUE(p.check_consistency());
  }
}

TEST_F(PoolTest, SmallAndLargeRequestsUseSeparatePools) {
  Pool p(up, {}, &obs);
  PoolBlock s = must_alloc(p, 4 * KiB);
  PoolBlock l = must_alloc(p, 2 * MiB);
  EXPECT_TRUE(s.small);
  EXPECT_FALSE(l.small);
  // 2 MiB - 4 KiB is free in the small segment, but a large request never uses it.
  EXPECT_EQ(p.stats().segments, 2u);
  PoolBlock l2 = must_alloc(p, 3 * MiB);
  EXPECT_EQ(addr(l2), addr(l) + 2 * MiB);  // split from the same 20 MiB segment
  EXPECT_EQ(p.stats().segments, 2u);
  PoolBlock s2 = must_alloc(p, 1 * MiB);
  EXPECT_EQ(addr(s2), addr(s) + 4 * KiB);
  EXPECT_EQ(p.stats().segments, 2u);
}

TEST_F(PoolTest, SplitThenCoalesceBackToOneBlock) {
  PoolConfig cfg;
  cfg.seal_interval_ns = 0;  // every free gets a fence; host fences complete at once
  Pool p(up, cfg, &obs);
  PoolBlock a = must_alloc(p, 512), b = must_alloc(p, 1000), c = must_alloc(p, 4096);
  EXPECT_EQ(addr(b), addr(a) + 512);
  EXPECT_EQ(addr(c), addr(b) + 1024);
  EXPECT_EQ(p.stats().largest_free, 2 * MiB - 512 - 1024 - 4096);
  // Free the middle one first, then the ends: every order must end in one free block.
  ASSERT_TRUE(p.deallocate(b.ptr));
  ASSERT_TRUE(p.deallocate(a.ptr));
  std::size_t sz = 0;
  ASSERT_TRUE(p.deallocate(c.ptr, &sz));
  EXPECT_EQ(sz, 4096u);
  EXPECT_EQ(p.stats().pending, 512u + 1024 + 4096);
  EXPECT_EQ(p.stats().allocated, 0u);
  EXPECT_EQ(p.stats().cached_free, 2 * MiB);
  // Two 1 MiB blocks fit only if the segment coalesced back into a single 2 MiB block.
  PoolBlock x = must_alloc(p, 1 * MiB), y = must_alloc(p, 1 * MiB);
  EXPECT_EQ(addr(x), addr(a));
  EXPECT_EQ(addr(y), addr(a) + 1 * MiB);
  EXPECT_EQ(p.stats().segments, 1u);
  EXPECT_EQ(p.stats().pending, 0u);
  ASSERT_TRUE(p.deallocate(x.ptr));
  ASSERT_TRUE(p.deallocate(y.ptr));
  EXPECT_EQ(p.empty_cache(), 2 * MiB);  // waits fences -> one free block -> released
  EXPECT_EQ(p.stats().largest_free, 0u);
  EXPECT_TRUE(p.check_consistency());
}

TEST_F(PoolTest, BestFitSmallestThenLowestAddress) {
  Pool p(up, {}, &obs);
  // Holes of 8K, 4K, 16K, 4K separated by live 512 B fences.
  const std::size_t holes[] = {8 * KiB, 4 * KiB, 16 * KiB, 4 * KiB};
  std::vector<PoolBlock> hole, sep;
  for (std::size_t h : holes) {
    hole.push_back(must_alloc(p, h));
    sep.push_back(must_alloc(p, 512));
  }
  for (auto& h : hole) ASSERT_TRUE(p.deallocate(h.ptr));
  p.empty_cache();  // completes fences; the segment still has live blocks, so nothing goes
  ASSERT_EQ(p.stats().segments, 1u);
  EXPECT_EQ(addr(must_alloc(p, 3 * KiB)), addr(hole[1]));  // 4K hole, the lower of two
  EXPECT_EQ(addr(must_alloc(p, 4 * KiB)), addr(hole[3]));  // the other 4K hole
  EXPECT_EQ(addr(must_alloc(p, 5 * KiB)), addr(hole[0]));  // 8K beats 16K and the tail
  PoolBlock rest = must_alloc(p, 3 * KiB);                 // 8K hole's 3K remainder
  EXPECT_EQ(addr(rest), addr(hole[0]) + 5 * KiB);
  EXPECT_EQ(addr(must_alloc(p, 9 * KiB)), addr(hole[2]));
  EXPECT_TRUE(p.check_consistency());
}

TEST_F(PoolTest, LargePoolSplitNeedsMoreThanOneMiBRemainder) {
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 9 * MiB);  // 20 MiB segment, 11 MiB remainder
  PoolBlock b = must_alloc(p, 9 * MiB + 512 * KiB);
  EXPECT_EQ(addr(b), addr(a) + 9 * MiB);
  EXPECT_EQ(b.size, 9 * MiB + 512 * KiB);  // 1.5 MiB left: split
  PoolBlock c = must_alloc(p, 1 * MiB + 256 * KiB);
  EXPECT_EQ(addr(c), addr(b) + b.size);
  EXPECT_EQ(c.size, 1 * MiB + 512 * KiB);  // remainder 256 KiB: not split, whole block
  EXPECT_EQ(p.stats().segments, 1u);
  EXPECT_EQ(p.stats().allocated, 20 * MiB);
}

TEST_F(PoolTest, OversizeBlocksAreNeverSplitAndOnlyServeCloseOversizeRequests) {
  PoolConfig cfg;
  cfg.max_split_size = 32 * MiB;
  Pool p(up, cfg, &obs);
  PoolBlock big = must_alloc(p, 40 * MiB);
  EXPECT_TRUE(big.oversize);
  EXPECT_EQ(big.size, 40 * MiB);
  ASSERT_TRUE(p.deallocate(big.ptr));
  EXPECT_EQ(p.empty_cache(format::EmptyCacheReason::api), 40 * MiB);  // the whole segment was one free block
  EXPECT_EQ(p.stats().segments, 0u);
  big = must_alloc(p, 40 * MiB);
  PoolBlock other = must_alloc(p, 64 * MiB);  // live filler so nothing coalesces away
  ASSERT_TRUE(p.deallocate(big.ptr));
  ASSERT_TRUE(p.deallocate(other.ptr));
  // A non-oversize request must not take (and split) the cached 40 MiB block.
  PoolBlock small_large = must_alloc(p, 12 * MiB);
  EXPECT_NE(addr(small_large), addr(big));
  EXPECT_FALSE(small_large.oversize);
  std::size_t segs = p.stats().segments;
  PoolBlock o = must_alloc(p, 36 * MiB);  // 40 < 36 + 20: takes the 40 MiB block whole
  EXPECT_EQ(addr(o), addr(big));
  EXPECT_EQ(o.size, 40 * MiB);
  EXPECT_TRUE(o.oversize);
  EXPECT_EQ(p.stats().segments, segs);
  PoolBlock q = must_alloc(p, 33 * MiB);  // 64 >= 33 + 20: wastes too much, grows
  EXPECT_NE(addr(q), addr(other));
  EXPECT_EQ(q.size, 34 * MiB);
  EXPECT_EQ(p.stats().segments, segs + 1);
  PoolBlock r = must_alloc(p, 50 * MiB);  // 64 < 50 + 20: takes it, unsplit
  EXPECT_EQ(addr(r), addr(other));
  EXPECT_EQ(r.size, 64 * MiB);
  EXPECT_TRUE(p.check_consistency());
}

TEST_F(PoolTest, FindInteriorPointers) {
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 4096), b = must_alloc(p, 1000), c = must_alloc(p, 3 * MiB);
  PoolBlock f;
  auto at = [](const PoolBlock& x, std::size_t off) { return reinterpret_cast<const void*>(addr(x) + off); };
  ASSERT_TRUE(p.find(a.ptr, &f));
  EXPECT_EQ(f.ptr, a.ptr);
  ASSERT_TRUE(p.find(at(a, 4095), &f));
  EXPECT_EQ(f.ptr, a.ptr);
  EXPECT_EQ(f.size, 4096u);
  ASSERT_TRUE(p.find(at(a, 4096), &f));  // first byte of b
  EXPECT_EQ(f.ptr, b.ptr);
  ASSERT_TRUE(p.find(at(b, 1023), &f));  // rounding slack belongs to b
  EXPECT_EQ(f.ptr, b.ptr);
  EXPECT_FALSE(p.find(at(b, 1024), &f));  // free tail of the segment
  ASSERT_TRUE(p.find(at(c, 3 * MiB - 1), &f));
  EXPECT_EQ(f.ptr, c.ptr);
  EXPECT_FALSE(f.small);
  EXPECT_FALSE(p.find(at(c, 3 * MiB + 5), &f));                 // free remainder of c's segment
  EXPECT_FALSE(p.find(at(c, 20 * MiB), &f) && f.ptr == c.ptr);  // past the segment
  EXPECT_FALSE(p.find(reinterpret_cast<void*>(16), &f));
  ASSERT_TRUE(p.deallocate(a.ptr));
  EXPECT_FALSE(p.find(at(a, 100), &f));  // pending is not live
  EXPECT_FALSE(p.find(a.ptr, &f));
}

TEST_F(PoolTest, DeallocateRejectsForeignInteriorAndDoubleFrees) {
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 4096);
  int local = 0;
  EXPECT_FALSE(p.deallocate(&local));
  EXPECT_FALSE(p.deallocate(reinterpret_cast<char*>(a.ptr) + 512));
  EXPECT_TRUE(p.deallocate(a.ptr));
  EXPECT_FALSE(p.deallocate(a.ptr));
  EXPECT_EQ(p.stats().blocks, 0u);
  EXPECT_TRUE(p.check_consistency());
}

TEST_F(PoolTest, FreeHookRunsBeforeTheBlockCanBeReused) {
  PoolConfig cfg;
  cfg.unsafe_reuse = true;  // completion is reported inside deallocate itself
  Pool p(up, cfg, &obs);
  PoolBlock a = must_alloc(p, 3000);
  struct Seen {
    RecordingObserver* obs;
    std::string kinds_at_hook;
    PoolBlock block;
    int calls;
  } seen{&obs, {}, {}, 0};
  obs.clear();
  Pool::FreeHook hook = [](void* arg, const PoolBlock& b) noexcept {
    auto* s = static_cast<Seen*>(arg);
    s->kinds_at_hook = s->obs->kinds();
    s->block = b;
    ++s->calls;
  };
  std::size_t sz = 0;
  ASSERT_TRUE(p.deallocate(a.ptr, &sz, hook, &seen));
  EXPECT_EQ(sz, 3072u);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.kinds_at_hook, "");  // before free_completed
  EXPECT_EQ(obs.kinds(), "C");
  EXPECT_EQ(seen.block.ptr, a.ptr);
  EXPECT_EQ(seen.block.size, 3072u);
  EXPECT_TRUE(seen.block.small);
  EXPECT_FALSE(p.deallocate(a.ptr, nullptr, hook, &seen));  // double free: no hook
  EXPECT_EQ(seen.calls, 1);
}

// The preload records a pooled allocation from this hook: it must run once, with the block
// handed out, after the segment it came from was reported, and with the pool lock held (so no
// other thread's allocation or free can be recorded between the pool's choice and the record).
TEST_F(PoolTest, AllocHookRunsUnderThePoolLockWithTheBlock) {
  Pool p(up, {}, &obs);
  struct Seen {
    Pool* pool;
    RecordingObserver* obs;
    std::string kinds_at_hook;
    PoolBlock block;
    int calls = 0;
    std::atomic<bool> done{false};
    bool other_thread_got_in = false;
    std::thread asker;
  } seen;
  seen.pool = &p;
  seen.obs = &obs;
  Pool::AllocHook hook = [](void* arg, const PoolBlock& b) noexcept {
    auto* s = static_cast<Seen*>(arg);
    s->kinds_at_hook = s->obs->kinds();
    s->block = b;
    ++s->calls;
    // Another thread asking the pool anything must wait until the hook returns.
    s->asker = std::thread([s] {
      (void)s->pool->stats();
      s->done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s->other_thread_got_in = s->done.load();
  };
  PoolBlock out;
  ASSERT_EQ(p.allocate(3000, &out, 7, hook, &seen), PoolStatus::ok);
  seen.asker.join();
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.kinds_at_hook, "A");  // the new segment was reported before the block
  EXPECT_EQ(seen.block.ptr, out.ptr);
  EXPECT_EQ(seen.block.size, 3072u);
  EXPECT_EQ(seen.block.tag, 7u);
  EXPECT_FALSE(seen.other_thread_got_in);
  EXPECT_TRUE(seen.done.load());
}

TEST_F(PoolTest, ContainsCoversEveryBlockStateButNotForeignMemory) {
  Pool p(up, {}, &obs);
  PoolBlock a = must_alloc(p, 4096), b = must_alloc(p, 4096);
  ASSERT_TRUE(p.deallocate(b.ptr));
  const char* base = static_cast<const char*>(a.ptr);
  EXPECT_TRUE(p.contains(base));                // live
  EXPECT_TRUE(p.contains(base + 100));          // live, interior
  EXPECT_TRUE(p.contains(base + 4096 + 8));     // pending
  EXPECT_TRUE(p.contains(base + 2 * MiB - 1));  // free tail
  EXPECT_FALSE(p.contains(base - 1));
  EXPECT_FALSE(p.contains(base + 2 * MiB));  // the only segment ends here
  int local = 0;
  EXPECT_FALSE(p.contains(&local));
  EXPECT_FALSE(p.contains(nullptr));
}

TEST_F(PoolTest, EmptyCacheReleasesOnlyFullyFreeSegments) {
  Pool p(up, {}, &obs);
  PoolBlock keep = must_alloc(p, 4096);
  PoolBlock gone = must_alloc(p, 2 * MiB);
  PoolBlock huge = must_alloc(p, 30 * MiB);
  ASSERT_TRUE(p.deallocate(gone.ptr));
  ASSERT_TRUE(p.deallocate(huge.ptr));
  obs.clear();
  EXPECT_EQ(p.empty_cache(format::EmptyCacheReason::threshold), 50 * MiB);
  auto ev = obs.events();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().kind, 'E');
  EXPECT_EQ(ev.back().size, 50 * MiB);
  EXPECT_EQ(ev.back().extra, 1);
  EXPECT_EQ(obs.kinds(), "CCFFE");  // both frees completed before their segments went
  PoolStats st = p.stats();
  EXPECT_EQ(st.reserved, 2 * MiB);
  EXPECT_EQ(st.segments, 1u);
  EXPECT_EQ(st.allocated, 4096u);
  EXPECT_EQ(up.segments_live(), 1u);
  PoolBlock f;
  EXPECT_TRUE(p.find(keep.ptr, &f));
  EXPECT_EQ(p.empty_cache(), 0u);
}

TEST_F(PoolTest, LimitCapsReservedBytes) {
  PoolConfig cfg;
  cfg.limit = 24 * MiB;
  Pool p(up, cfg, &obs);
  PoolBlock a = must_alloc(p, 2 * MiB);  // 20 MiB segment
  PoolBlock b = must_alloc(p, 4096);     // 2 MiB small segment: 22 MiB
  PoolBlock c;
  EXPECT_EQ(p.allocate(4 * MiB - 512, &c), PoolStatus::ok);       // fits the large segment
  EXPECT_EQ(p.allocate(14 * MiB, &c), PoolStatus::ok);            // 18 - 4 = 14 MiB left
  EXPECT_EQ(p.allocate(4 * MiB, &c), PoolStatus::out_of_memory);  // needs another 20 MiB
  PoolStats st = p.stats();
  EXPECT_EQ(st.reserved, 22 * MiB);
  EXPECT_EQ(st.ooms, 1u);
  EXPECT_EQ(st.retries, 1u);
  EXPECT_EQ(up.alloc_calls(), 2u);  // the limit refused before asking the upstream
  (void)a, (void)b;
}

TEST_F(PoolTest, DestructorReturnsEverySegment) {
  {
    Pool p(up, {}, &obs);
    must_alloc(p, 100);
    PoolBlock b = must_alloc(p, 5 * MiB);
    must_alloc(p, 50 * MiB);
    p.deallocate(b.ptr);
    EXPECT_EQ(up.segments_live(), 3u);
  }
  EXPECT_EQ(up.segments_live(), 0u);
  EXPECT_EQ(up.in_use(), 0u);
  EXPECT_EQ(up.bad_frees(), 0u);
}

// cudaDeviceReset / cuCtxDestroy took the memory with the context (docs/trace-format.md,
// "Context teardown"): every live block goes to the hook and is then completed, a pending
// one is completed, every segment is reported freed but not given back upstream, and the
// pool starts again from nothing.
TEST(PoolTeardown, AbandonCompletesEveryBlockAndForgetsTheSegments) {
  HostUpstream up(HostUpstream::Fences::manual);  // the pending block's fence never completes
  RecordingObserver obs;
  Pool p(up, {}, &obs);
  PoolBlock small = must_alloc(p, 4096), gone = must_alloc(p, 4096), big = must_alloc(p, 5 * MiB);
  ASSERT_TRUE(p.deallocate(gone.ptr));
  obs.clear();
  struct Seen {
    RecordingObserver* obs;
    std::vector<std::pair<std::uintptr_t, std::size_t>> hooked;  // block, events before it
  } seen{&obs, {}};
  Pool::FreeHook hook = [](void* arg, const PoolBlock& b) noexcept {
    auto* s = static_cast<Seen*>(arg);
    s->hooked.emplace_back(addr(b), s->obs->events().size());
  };
  EXPECT_EQ(p.abandon(hook, &seen), 22 * MiB);
  auto ev = obs.events();
  ASSERT_EQ(seen.hooked.size(), 2u);
  for (auto& [ptr, before] : seen.hooked) {  // each live block: hook, then its completion
    ASSERT_LT(before, ev.size());
    EXPECT_EQ(ev[before].kind, 'C');
    EXPECT_EQ(ev[before].ptr, ptr);
  }
  std::set<std::uintptr_t> hooked{seen.hooked[0].first, seen.hooked[1].first};
  EXPECT_EQ(hooked, (std::set<std::uintptr_t>{addr(small), addr(big)}));
  std::set<std::uintptr_t> completed;
  std::size_t seg_frees = 0;
  for (auto& e : ev) {
    if (e.kind == 'C') completed.insert(e.ptr);
    seg_frees += e.kind == 'F';
  }
  EXPECT_EQ(completed, (std::set<std::uintptr_t>{addr(small), addr(gone), addr(big)}));
  EXPECT_EQ(ev.size(), 5u);
  EXPECT_EQ(seg_frees, 2u);
  EXPECT_TRUE(obs.segments().empty());
  EXPECT_EQ(up.segments_live(), 2u);  // not deallocated: the driver already took them
  PoolStats st = p.stats();
  EXPECT_EQ(st.reserved, 0u);
  EXPECT_EQ(st.allocated, 0u);
  EXPECT_EQ(st.pending, 0u);
  EXPECT_EQ(st.segments, 0u);
  EXPECT_EQ(st.blocks, 0u);
  EXPECT_TRUE(p.check_consistency());
  EXPECT_FALSE(p.deallocate(small.ptr));  // forgotten
  PoolBlock fresh = must_alloc(p, 4096);  // from a new segment
  EXPECT_EQ(up.segments_live(), 3u);
  EXPECT_TRUE(p.deallocate(fresh.ptr));
  EXPECT_TRUE(p.check_consistency());
}

}  // namespace
}  // namespace gpuheap::pool
