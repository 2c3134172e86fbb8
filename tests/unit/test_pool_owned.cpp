// The pool's single-owner entry points (allocate_owned / deallocate_owned, what `gpuheap
// replay` drives): the same block choices, fences and observer calls as allocate /
// deallocate, without the pool's address map.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "pool/pool.h"
#include "tests/unit/pool_test_util.h"
#include "tests/unit/pool_upstreams.h"

namespace gpuheap::pool {
namespace {

using test::RecordingObserver;
using test_util::KiB;
using test_util::MiB;

// Segments at made-up ascending addresses (the pool never touches block memory), so two
// pools on two of these see the same addresses; fences complete only when the test says or
// the pool waits; a capacity makes growth fail as a full device does.
class FakeUpstream final : public Upstream {
 public:
  explicit FakeUpstream(std::size_t capacity) : capacity_(capacity) {}
  void* allocate(std::size_t bytes) noexcept override {
    if (used_ + bytes > capacity_) return nullptr;
    std::uintptr_t a = next_;
    next_ += bytes + 64 * KiB;
    used_ += bytes;
    return reinterpret_cast<void*>(a);
  }
  void deallocate(void* /*p*/, std::size_t bytes) noexcept override { used_ -= bytes; }
  Fence fence_record() noexcept override { return ++last_; }
  bool fence_done(Fence f) noexcept override { return f <= done_; }
  void fence_wait(Fence f) noexcept override { done_ = f > done_ ? f : done_; }
  void fence_release(Fence /*f*/) noexcept override { ++released_; }
  std::uint64_t now_ns() noexcept override { return now_; }

  void complete_all() { done_ = last_; }
  void advance(std::uint64_t ns) { now_ += ns; }
  std::size_t used() const { return used_; }
  std::uint64_t released() const { return released_; }

 private:
  std::size_t capacity_, used_ = 0;
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  Fence last_ = 0, done_ = 0;
  std::uint64_t now_ = 1'000'000, released_ = 0;
};

struct Side {
  explicit Side(PoolConfig cfg) : up(300 * MiB), pool(up, cfg, &obs) {}
  FakeUpstream up;
  RecordingObserver obs;
  Pool pool;
};

void same_choices(PoolConfig cfg, unsigned seed) {
  Side locked(cfg), owned(cfg);
  std::mt19937 rng(seed);
  struct LiveBlock {
    void* ptr;
    void* handle;
  };
  std::vector<LiveBlock> live;
  int allocs = 0, ooms = 0;
  for (int i = 0; i < 6000; ++i) {
    unsigned op = rng() % 100;
    if (op < 52) {
      std::size_t n = rng() % 8 == 0 ? 1 + rng() % (30 * MiB) : 1 + rng() % (96 * KiB);
      PoolBlock a;
      OwnedBlock b;
      PoolStatus sa = locked.pool.allocate(n, &a, 7);
      PoolStatus sb = owned.pool.allocate_owned(n, &b, 7);
      ASSERT_EQ(sa, sb) << "op " << i << " size " << n;
      if (sa != PoolStatus::ok) {
        ++ooms;
        continue;
      }
      ++allocs;
      ASSERT_EQ(a.ptr, b.ptr) << "op " << i;
      ASSERT_EQ(a.size, b.size);
      ASSERT_NE(b.handle, nullptr);
      auto start = reinterpret_cast<std::uintptr_t>(b.ptr);
      ASSERT_TRUE(b.segment <= start && owned.obs.segments().count(b.segment)) << "segment base";
      ASSERT_LT(start - b.segment, owned.obs.segments().at(b.segment));
      live.push_back({b.ptr, b.handle});
    } else if (op < 94 && !live.empty()) {
      std::size_t k = rng() % live.size();
      LiveBlock l = live[k];
      live[k] = live.back();
      live.pop_back();
      // The owned pool's address map does not hold its blocks: deallocate(ptr) refuses.
      if (op % 7 == 0) ASSERT_FALSE(owned.pool.deallocate(l.ptr));
      std::size_t sa = 0;
      ASSERT_TRUE(locked.pool.deallocate(l.ptr, &sa));
      ASSERT_EQ(owned.pool.deallocate_owned(l.handle), sa) << "op " << i;
      ASSERT_EQ(owned.pool.deallocate_owned(l.handle), 0u) << "a freed handle is refused";
    } else if (op < 97) {
      locked.up.complete_all(), owned.up.complete_all();
    } else if (op < 99) {
      locked.up.advance(cfg.seal_interval_ns), owned.up.advance(cfg.seal_interval_ns);
    } else {
      ASSERT_EQ(locked.pool.empty_cache(), owned.pool.empty_cache());
    }
    ASSERT_TRUE(owned.pool.check_consistency()) << "op " << i;
  }
  // Enough of every path to mean something: growth failures, retries, reuse.
  EXPECT_GT(allocs, 1000);
  EXPECT_GT(ooms, 0);
  PoolStats sa = locked.pool.stats(), sb = owned.pool.stats();
  EXPECT_GT(sb.retries, 0u);
  EXPECT_EQ(sa.reserved, sb.reserved);
  EXPECT_EQ(sa.allocated, sb.allocated);
  EXPECT_EQ(sa.pending, sb.pending);
  EXPECT_EQ(sa.largest_free, sb.largest_free);
  EXPECT_EQ(sa.segments, sb.segments);
  EXPECT_EQ(sa.blocks, sb.blocks);
  EXPECT_EQ(sa.blocks, live.size());
  EXPECT_EQ(sa.retries, sb.retries);
  EXPECT_EQ(sa.ooms, sb.ooms);
  EXPECT_EQ(locked.up.released(), owned.up.released());
  EXPECT_EQ(locked.up.used(), owned.up.used());
  auto ea = locked.obs.events(), eb = owned.obs.events();
  ASSERT_EQ(ea.size(), eb.size());
  for (std::size_t i = 0; i < ea.size(); ++i) {
    ASSERT_EQ(ea[i].kind, eb[i].kind) << "observer event " << i;
    ASSERT_EQ(ea[i].ptr, eb[i].ptr) << "observer event " << i;
    ASSERT_EQ(ea[i].size, eb[i].size) << "observer event " << i;
  }
  // The lookups that walk segments see the owned blocks.
  std::size_t seen = 0;
  owned.pool.for_each_live([](void* arg, const PoolBlock&) noexcept { ++*static_cast<std::size_t*>(arg); }, &seen);
  EXPECT_EQ(seen, live.size());
  for (const LiveBlock& l : live) {
    PoolBlock f;
    ASSERT_TRUE(owned.pool.find(l.ptr, &f));
    EXPECT_EQ(f.ptr, l.ptr);
    EXPECT_EQ(f.tag, 7u);
    EXPECT_TRUE(owned.pool.contains(l.ptr));
  }
  for (const LiveBlock& l : live) ASSERT_GT(owned.pool.deallocate_owned(l.handle), 0u);
  EXPECT_TRUE(owned.pool.check_consistency());
  EXPECT_EQ(owned.pool.stats().blocks, 0u);
}

TEST(PoolOwned, SameChoicesAsLockedCallsDefaultConfig) { same_choices({}, 11); }

TEST(PoolOwned, SameChoicesAsLockedCallsEveryFreeSealed) {
  PoolConfig cfg;
  cfg.seal_interval_ns = 0;  // the replay's setting: the clock is never read
  same_choices(cfg, 12);
}

TEST(PoolOwned, SameChoicesAsLockedCallsOversizeAndOddRounding) {
  PoolConfig cfg;
  cfg.max_split_size = 16 * MiB;
  cfg.round = 1000;  // not a power of two: the division path of the rounding
  same_choices(cfg, 13);
}

}  // namespace
}  // namespace gpuheap::pool
