// The per-thread stack cache (preload/record/stackcache.h): a stack it serves is exactly the
// one a full libunwind walk finds. Interning gives one id per distinct ip array, so equal ids
// mean equal frames.
#include <pthread.h>

#include <set>
#include <thread>
#include <vector>

#include "preload/record/stackcache.h"
#include "preload/record/stackstats.h"
#include "test_recorder_util.h"

using namespace rec_test;
namespace d = gpuheap::preload;

namespace {

#ifdef __SANITIZE_THREAD__
constexpr bool kThreadStacks = false;  // as in test_recorder.cpp: threads that unwound cannot exit
#else
constexpr bool kThreadStacks = true;
#endif
// Hit counts hold for the builds users run. Under ASan/TSan the instrumented frames change the
// stack words the cache checks (ASan's fake stacks), so it misses, safely: the stacks must
// still equal a full walk's, and that is checked in every build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCountsHits = false;
#else
constexpr bool kCountsHits = true;
#endif

__attribute__((noinline)) std::uint32_t site() {
  std::uint32_t id = d::capture_stack(0);
  asm volatile("" ::: "memory");
  return id;
}
// Two callers with the same frame: called from one frame they reach the capture with the same
// stack and frame pointers (the cache's key); only return addresses further down differ.
__attribute__((noinline)) std::uint32_t via_a() {
  std::uint32_t id = site();
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) std::uint32_t via_b() {
  std::uint32_t id = site();
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) std::uint32_t nest(int n, bool a) {
  std::uint32_t id = n <= 0 ? (a ? via_a() : via_b()) : nest(n - 1, a);
  asm volatile("" ::: "memory");
  return id;
}
// Path k: one of several call chains, the same ones reached from different call sites.
__attribute__((noinline)) std::uint32_t pick(int k) {
  std::uint32_t id = 0;
  switch (k % 4) {
    case 0: id = nest(k / 4 % 3, true); break;
    case 1: id = nest(k / 4 % 3, false); break;
    case 2: id = k & 8 ? via_a() : via_b(); break;
    default: id = k & 8 ? via_b() : via_a(); break;
  }
  asm volatile("" ::: "memory");
  return id;
}

// Call chains of one depth that differ only further down, all reaching site() from the same
// frame: stacks sharing a start, as PyTorch's do (one call site of its allocator, a few
// depths). The two links differ (their asm), so that no compiler folds them into one.
template <int N>
std::uint32_t chain(unsigned path);
template <int N>
__attribute__((noinline)) std::uint32_t chain_a(unsigned path) {
  std::uint32_t id = chain<N>(path);
  asm volatile("# link a" ::: "memory");
  return id;
}
template <int N>
__attribute__((noinline)) std::uint32_t chain_b(unsigned path) {
  std::uint32_t id = chain<N>(path);
  asm volatile("# link b" ::: "memory");
  return id;
}
template <int N>
std::uint32_t chain(unsigned path) {
  if constexpr (N == 0) return via_a();
  else return path & 1 ? chain_a<N - 1>(path >> 1) : chain_b<N - 1>(path >> 1);
}

constexpr int kPaths = 24;

// For each path, in rounds: the walked id (cache off) then the same call with the cache on,
// three times each, from one call site. Returns the mismatches.
int compare_paths(int rounds) {
  int bad = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < kPaths; ++k) {
      std::uint32_t ids[2][3];
      volatile int n = 6;  // one call site: not unrolled into several
      for (int i = 0; i < n; ++i) {
        d::stackcache_enable(i >= 3);
        ids[i / 3][i % 3] = pick(k);
      }
      for (int pass = 0; pass < 2; ++pass)
        for (std::uint32_t id : ids[pass]) {
          bad += id == 0 || id != ids[0][0];
          EXPECT_EQ(id, ids[0][0]) << "path " << k << ", round " << round << (pass ? ", cached" : ", walked");
        }
    }
  }
  d::stackcache_enable(true);
  return bad;
}

}  // namespace

TEST(StackCache, ServesTheStackAFullWalkFinds) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  const std::uint64_t hits = d::stackcache_hits();
  EXPECT_EQ(compare_paths(6), 0);
  // Not vacuous: most of the cached captures were served by the cache.
  if (kCountsHits) EXPECT_GT(d::stackcache_hits() - hits, std::uint64_t{kPaths} * 6);
  d::recorder_stop(f::EndReason::stopped);
}

TEST(StackCache, ThreadsEachKeepTheirOwn) {
  if (!kThreadStacks) GTEST_SKIP() << "TSan: threads that unwound cannot exit";
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  // Each thread's first capture of a path is walked (its cache is empty); the later ones, served
  // by its own cache while the others fill theirs, must give the same id.
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  std::atomic<std::uint64_t> hits{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      std::uint32_t first[kPaths];
      volatile int n = 21 * kPaths;  // one call site
      for (int i = 0; i < n; ++i) {
        std::uint32_t id = pick(i % kPaths);
        if (i < kPaths) first[i] = id;
        bad += id != first[i % kPaths] || id == 0;
      }
      hits += d::stackcache_hits();
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  if (kCountsHits) EXPECT_GT(hits.load(), 4u * kPaths * 10);
  d::recorder_stop(f::EndReason::stopped);
}

// A new trace file forgets every id: a cached stack is written again into the new file
// before an event can use its id.
TEST(StackCache, NewFileWritesCachedStacksAgain) {
  TempDir dir;
  use_dir(dir, "a.%p.trace");
  ASSERT_TRUE(start_recorder());
  std::uint64_t hits = 0;
  std::uint32_t id = 0;
  TempDir dir2;
  volatile int n = 5;  // one call site: four captures in the first file, one in the second
  for (int i = 0; i < n; ++i) {
    if (i == 4) {
      d::recorder_stop(f::EndReason::stopped);
      use_dir(dir2, "b.%p.trace");
      ASSERT_TRUE(start_recorder());
      hits = d::stackcache_hits();
    }
    id = pick(3);
  }
  if (kCountsHits) EXPECT_GT(d::stackcache_hits(), hits) << "served by the cache";
  d::record(alloc_rec(1, id));
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  ASSERT_EQ(t.header, f::HeaderStatus::ok);
  bool defined = false;
  for (auto& r : t.records) defined |= r.type == f::RecordType::stack && r.stack.id == id;
  EXPECT_TRUE(defined) << "stack " << id << " used in the new file without its record";
}

// Eight stacks at one start, taken in turn: each is served as a full walk finds it, and (in the
// builds users run) all eight stay cached: the cache keeps many ways a start.
TEST(StackCache, StacksAtOneStartAllStay) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr unsigned kChains = 8;
  constexpr int kRounds = 21;  // the first walked (cache off), the others compared with it
  std::uint32_t walked[kChains] = {};
  std::uint64_t hits = 0;
  int bad = 0;
  volatile unsigned n = kChains;  // one call site for all: the stacks differ by the chain only
  for (int r = 0; r < kRounds; ++r) {
    d::stackcache_enable(r > 0);
    if (r == 1) hits = d::stackcache_hits();
    for (unsigned p = 0; p < n; ++p) {
      const std::uint32_t id = chain<3>(p);
      if (r == 0) walked[p] = id;
      else bad += id != walked[p];
    }
  }
  EXPECT_EQ(std::set<std::uint32_t>(walked, walked + kChains).size(), kChains);
  EXPECT_EQ(bad, 0);
  // Filled at a key's second miss: within the first rounds every chain has its way.
  if (kCountsHits) EXPECT_GE(d::stackcache_hits() - hits, std::uint64_t{kChains} * (kRounds - 5));
  d::recorder_stop(f::EndReason::stopped);
}

// The counters are per thread: 255 threads get a slot of their own, written inline, and the
// threads after them share one, added to atomically. Every count must be in the sum, from the
// threads with slots and from those past them, all running at once.
TEST(StackStats, ThreadsPastTheSlotsAreAllCounted) {
  constexpr int kThreads = 320, kBatch = 40, kCounts = 20000;
  constexpr int kCaptures = static_cast<int>(d::StackCounter::captures);
  constexpr int kFrames = static_cast<int>(d::StackCounter::native_frames);
  std::uint64_t before[static_cast<int>(d::StackCounter::count)], after[static_cast<int>(d::StackCounter::count)];
  d::stackstats_read(before);
  for (int b = 0; b < kThreads / kBatch; ++b) {
    std::vector<std::thread> ts;
    ts.reserve(kBatch);
    for (int t = 0; t < kBatch; ++t)
      ts.emplace_back([] {
        for (int i = 0; i < kCounts; ++i) {
          d::stackstats_add(d::StackCounter::captures);
          d::stackstats_add(d::StackCounter::native_frames, 3);
        }
      });
    for (auto& t : ts) t.join();
  }
  d::stackstats_read(after);
  EXPECT_EQ(after[kCaptures] - before[kCaptures], std::uint64_t{kThreads} * kCounts);
  EXPECT_EQ(after[kFrames] - before[kFrames], std::uint64_t{kThreads} * kCounts * 3);
}

#if defined(__x86_64__)
// uint32_t gh_test_call_with_rbp(uint32_t (*fn)(), uint64_t value): calls fn with rbp set to
// value, as code built without frame pointers does when it keeps data of its own in rbp across
// a call. rbp is saved and restored with its CFI; the CFA stays rsp-based.
asm(R"(
    .text
    .globl gh_test_call_with_rbp
    .type gh_test_call_with_rbp, @function
gh_test_call_with_rbp:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov %rsi, %rbp
    call *%rdi
    pop %rbp
    .cfi_restore %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size gh_test_call_with_rbp, .-gh_test_call_with_rbp
)");
extern "C" std::uint32_t gh_test_call_with_rbp(std::uint32_t (*fn)(), std::uint64_t value);

namespace {
// The capture reached with the caller's data still in rbp: no frame pointer of its own, so the
// key's rbp0 is the data (unless the library's frames below save rbp, then a slot holds it).
__attribute__((noinline, optimize("omit-frame-pointer"))) std::uint32_t site_keeping_rbp() {
  std::uint32_t id = d::capture_stack(0);
  asm volatile("" ::: "memory");
  return id;
}
std::uint64_t stale_count() {
  std::uint64_t v[static_cast<int>(d::StackCounter::count)];
  d::stackstats_read(v);
  return v[static_cast<int>(d::StackCounter::cache_stale)];
}
// Calls fn through the caller that keeps `value` in rbp, from one call site, once walked (cache
// off) and three times with the cache on; the ids must all be the walked one. Returns it.
std::uint32_t walked_then_cached(std::uint32_t (*fn)(), std::uint64_t value, int* bad) {
  std::uint32_t ids[4];
  volatile int n = 4;
  for (int i = 0; i < n; ++i) {
    d::stackcache_enable(i > 0);
    ids[i] = gh_test_call_with_rbp(fn, value);
  }
  d::stackcache_enable(true);
  for (std::uint32_t id : ids) *bad += id == 0 || id != ids[0];
  return ids[0];
}
}  // namespace

// PyTorch's libraries are built without frame pointers and keep heap pointers in rbp across
// calls: a saved copy of one (or the key's rbp0) differs on every call while the frames repeat.
// Such values are far from the stack and cannot be a frame's CFA base: the cache serves the
// stack anyway. Values near the stack still decide (they might be a frame pointer).
TEST(StackCache, DataInRbpDoesNotStopHits) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  std::uint32_t (*const fns[2])() = {site, site_keeping_rbp};
  constexpr int kFar = 40, kNear = 8;
  volatile char local[kNear * 32];
  std::uint64_t values[kFar + kNear];
  for (int i = 0; i < kFar; ++i)  // a different "heap pointer" on every call
    values[i] = 0x100000000ull * static_cast<std::uint64_t>(i + 1) + 0x5a0;
  // Near the stack: possibly a frame pointer, so every value is its own key or check; the
  // stacks must still be the walked ones.
  for (int i = 0; i < kNear; ++i) values[kFar + i] = reinterpret_cast<std::uint64_t>(&local[i * 32]);
  for (auto* fn : fns) {
    int bad = 0;
    std::set<std::uint32_t> ids;
    const std::uint64_t hits = d::stackcache_hits();
    std::uint64_t far_hits = 0;
    std::uint64_t stale[2] = {};
    for (int i = 0; i < kFar + kNear; ++i) {  // one call site: one stack
      ids.insert(walked_then_cached(fn, values[i], &bad));
      if (i == kFar - 1) far_hits = d::stackcache_hits() - hits, stale[0] = stale_count();
    }
    stale[1] = stale_count();
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(ids.size(), 1u);
    if (kCountsHits) EXPECT_GE(far_hits, std::uint64_t{3} * (kFar - 2));
    // The far values' entry never checked the word: near values use it too (no rule read rbp).
    if (kCountsHits) EXPECT_EQ(stale[1] - stale[0], 0u);
  }
  d::recorder_stop(f::EndReason::stopped);
}

// Near values only, on a thread of their own (its own cache): the entry checks the saved copy,
// each new value misses on it, and gpuheap_stack_stats counts those misses as cache_stale.
TEST(StackCache, NearRbpValuesCountAsStale) {
  if (!kThreadStacks) GTEST_SKIP() << "TSan: threads that unwound cannot exit";
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kNear = 8;
  int bad = 0;
  std::uint64_t stale = 0;
  std::set<std::uint32_t> ids;
  std::thread t([&] {
    volatile char local[kNear * 32];
    const std::uint64_t before = stale_count();
    for (int i = 0; i < kNear; ++i)
      ids.insert(walked_then_cached(site, reinterpret_cast<std::uint64_t>(&local[i * 32]), &bad));
    stale = stale_count() - before;
  });
  t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(ids.size(), 1u);
  if (kCountsHits) EXPECT_GE(stale, std::uint64_t{kNear - 1});
  d::recorder_stop(f::EndReason::stopped);
}
#endif
