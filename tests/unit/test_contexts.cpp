// preload/core/contexts.h (the per-context table) on fake states, and preload/core/fork.h's order.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "preload/core/contexts.h"
#include "preload/core/fork.h"

namespace gpuheap {
namespace preload {
namespace {

struct FakeState {
  CUcontext ctx;
  int device;
  std::atomic<bool> retired{false};
  FakeState(CUcontext c, int d) : ctx(c), device(d) {}
};

using Table = BasicContextTable<FakeState, 4>;

CUcontext ctx_of(std::uintptr_t v) { return reinterpret_cast<CUcontext>(v); }

// find_or_create with a fixed device; counts the states made.
struct Maker {
  int made = 0;
  std::vector<FakeState*> owned;
  FakeState* get(Table& t, CUcontext ctx, int device) {
    return t.find_or_create(
        ctx, [&] { return device; },
        [&](int dev) {
          ++made;
          owned.push_back(new FakeState(ctx, dev));
          return owned.back();
        });
  }
  ~Maker() {
    for (auto* s : owned) delete s;
  }
};

std::vector<FakeState*> live(const Table& t) {
  std::vector<FakeState*> v;
  t.for_each_live([&](FakeState* s) { v.push_back(s); });
  return v;
}
std::vector<FakeState*> all(const Table& t) {
  std::vector<FakeState*> v;
  t.for_each_including_retired([&](FakeState* s) { v.push_back(s); });
  return v;
}

TEST(ContextTable, FindOrCreateMakesOncePerContext) {
  Table t;
  Maker m;
  FakeState* a = m.get(t, ctx_of(1), 0);
  FakeState* b = m.get(t, ctx_of(2), 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(m.get(t, ctx_of(1), 0), a);
  EXPECT_EQ(m.made, 2);
  EXPECT_EQ(t.find(ctx_of(2)), b);
  EXPECT_EQ(t.find(ctx_of(3)), nullptr);
  EXPECT_EQ(b->device, 1);
}

TEST(ContextTable, UnknownDeviceOrFailedMakeGivesNothing) {
  Table t;
  EXPECT_EQ(t.find_or_create(
                ctx_of(1), [] { return -1; },
                [](int) -> FakeState* {
                  ADD_FAILURE();
                  return nullptr;
                }),
            nullptr);
  EXPECT_EQ(t.find_or_create(
                ctx_of(1), [] { return 0; }, [](int) -> FakeState* { return nullptr; }),
            nullptr);
  EXPECT_EQ(t.size(), 0);
}

TEST(ContextTable, RetiredStatesAreSkippedByLiveWalksOnly) {
  Table t;
  Maker m;
  FakeState* a = m.get(t, ctx_of(1), 0);
  FakeState* b = m.get(t, ctx_of(2), 0);
  std::vector<FakeState*> torn;
  EXPECT_EQ(t.retire(ctx_of(1),
                     [&](FakeState* s) {
                       EXPECT_TRUE(s->retired.load());  // retired before the teardown callback runs
                       torn.push_back(s);
                     }),
            1);
  EXPECT_EQ(torn, std::vector<FakeState*>{a});
  EXPECT_EQ(t.find(ctx_of(1)), nullptr);
  EXPECT_EQ(live(t), std::vector<FakeState*>{b});
  EXPECT_EQ((all(t)), (std::vector<FakeState*>{a, b}));
  EXPECT_EQ(t.size(), 2);
  // A retired state of ctx is visited again by a second retire (its pool is empty then).
  EXPECT_EQ(t.retire(ctx_of(1), [](FakeState*) {}), 1);
}

TEST(ContextTable, ReusedHandleRevivesOnlyOnTheSameDevice) {
  Table t;
  Maker m;
  FakeState* a = m.get(t, ctx_of(1), 0);
  t.retire(ctx_of(1), [](FakeState*) {});
  // The driver hands the handle to a new context on device 0: the old state serves it.
  EXPECT_EQ(m.get(t, ctx_of(1), 0), a);
  EXPECT_FALSE(a->retired.load());
  EXPECT_EQ(m.made, 1);
  // On another device the handle names another context: a new state, the old one stays retired.
  t.retire(ctx_of(1), [](FakeState*) {});
  FakeState* c = m.get(t, ctx_of(1), 1);
  EXPECT_NE(c, a);
  EXPECT_TRUE(a->retired.load());
  EXPECT_EQ(t.find(ctx_of(1)), c);
  EXPECT_EQ(t.revive(ctx_of(1), 2), nullptr);
  t.retire(ctx_of(1), [](FakeState*) {});
  EXPECT_EQ(t.revive(ctx_of(1), 0), a);
  EXPECT_EQ(live(t), std::vector<FakeState*>{a});
}

TEST(ContextTable, RecreatingContextsDoesNotFillTheTable) {
  Table t;
  Maker m;
  for (int i = 0; i < 100; ++i) {
    ASSERT_NE(m.get(t, ctx_of(7), 0), nullptr) << i;
    t.retire(ctx_of(7), [](FakeState*) {});
  }
  EXPECT_EQ(m.made, 1);
}

TEST(ContextTable, FullTablePassesThrough) {
  Table t;
  Maker m;
  for (int i = 1; i <= Table::kCapacity; ++i) ASSERT_NE(m.get(t, ctx_of(i), 0), nullptr);
  EXPECT_EQ(m.get(t, ctx_of(99), 0), nullptr);
  EXPECT_EQ(m.made, Table::kCapacity);
}

TEST(ContextTable, WalkStopsWhereTheVisitorSaysSo) {
  Table t;
  Maker m;
  m.get(t, ctx_of(1), 0);
  FakeState* b = m.get(t, ctx_of(2), 3);
  m.get(t, ctx_of(3), 3);
  int visited = 0;
  EXPECT_EQ(t.for_each_live([&](FakeState* s) { return ++visited, s->device == 3; }), b);
  EXPECT_EQ(visited, 2);
  t.retire(ctx_of(2), [](FakeState*) {});
  EXPECT_EQ(t.for_each_including_retired([](FakeState* s) { return s->ctx == ctx_of(2); }), b);
  EXPECT_EQ(t.for_each_live([](FakeState* s) { return s->ctx == ctx_of(2); }), nullptr);
}

TEST(ContextTable, ResetInChildForgetsEverything) {
  Table t;
  Maker m;
  EXPECT_FALSE(t.reset_in_child());
  m.get(t, ctx_of(1), 0);
  EXPECT_TRUE(t.reset_in_child());
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.find(ctx_of(1)), nullptr);
  EXPECT_NE(m.get(t, ctx_of(1), 0), nullptr);  // the rebuilt lock works
  EXPECT_EQ(m.made, 2);
}

TEST(ContextTable, ConcurrentFirstUseMakesOneState) {
  Table t;
  std::atomic<int> made{0};
  FakeState* got[8] = {};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      got[i] = t.find_or_create(
          ctx_of(5), [] { return 0; }, [&](int dev) { return ++made, new FakeState(ctx_of(5), dev); });
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(made.load(), 1);
  for (auto* s : got) EXPECT_EQ(s, got[0]);
  delete got[0];
}

// ---- fork order ----

std::string g_log;
template <char C>
void mark() noexcept {
  g_log += C;
}

TEST(ForkOrder, PrepareInRankOrderParentAndChildInReverse) {
  ForkOrder order;
  g_log.clear();
  // Handed in out of order, as modules start: the rank decides.
  order.set(ForkRank::sink, {mark<'S'>, mark<'s'>, mark<'z'>});
  order.set(ForkRank::runtime, {nullptr, nullptr, mark<'c'>});
  order.set(ForkRank::recorder, {mark<'R'>, mark<'r'>, mark<'x'>});
  order.set(ForkRank::stacks, {mark<'T'>, mark<'t'>, mark<'y'>});
  order.run_prepare();
  EXPECT_EQ(g_log, "RTS");
  g_log.clear();
  order.run_parent();
  EXPECT_EQ(g_log, "str");
  g_log.clear();
  order.run_child();
  EXPECT_EQ(g_log, "zyxc");
  // A rank set again is replaced, not added.
  order.set(ForkRank::sink, {});
  g_log.clear();
  order.run_prepare();
  EXPECT_EQ(g_log, "RT");
}

// A rank handed in after the fork's prepare ran (a module starting while another thread
// forks) must not get its parent or child handler: an unlock without the lock.
TEST(ForkOrder, ParentAndChildRunOnlyWhatPrepareTook) {
  ForkOrder order;
  order.set(ForkRank::recorder, {mark<'R'>, mark<'r'>, mark<'x'>});
  g_log.clear();
  order.run_prepare();
  order.set(ForkRank::sink, {mark<'S'>, mark<'s'>, mark<'z'>});
  order.run_parent();
  EXPECT_EQ(g_log, "Rr");
  g_log.clear();
  order.run_child();
  EXPECT_EQ(g_log, "x");
  // The next fork takes the sink too.
  g_log.clear();
  order.run_prepare();
  order.run_parent();
  EXPECT_EQ(g_log, "RSsr");
}

}  // namespace
}  // namespace preload
}  // namespace gpuheap
