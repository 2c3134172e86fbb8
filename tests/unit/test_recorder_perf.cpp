// Hot-path costs, printed for the record; the bounds are loose (shared 2-core machines)
// but catch order-of-magnitude regressions such as a syscall per record.
#include <thread>

#include "test_recorder_util.h"

using namespace rec_test;
#ifdef GPUHEAP_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace d = gpuheap::preload;

namespace {

double ns_since(std::chrono::steady_clock::time_point t0, double n) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}

// Recurses to `depth` frames, then captures `reps` times from the same site.
__attribute__((noinline)) double capture_cost_at_depth(int depth, int reps, std::uint32_t* id) {
  if (depth > 0) {
    double r = capture_cost_at_depth(depth - 1, reps, id);
    asm volatile("" ::: "memory");
    return r;
  }
  *id = d::capture_stack(0);  // first capture: interning + libunwind cache warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    std::uint32_t x = d::capture_stack(0);
    asm volatile("" : : "r"(x) : "memory");
  }
  return ns_since(t0, reps);
}

}  // namespace

TEST(RecorderPerf, RecordSingleThread) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kN = 1'000'000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) d::record(alloc_rec(i));
  double ns = ns_since(t0, kN);
  d::recorder_stop(f::EndReason::stopped);
  std::printf("[          ] record(): %.1f ns/record, 1 thread\n", ns);
  EXPECT_EQ(read_trace(d::recorder_path()).count(f::RecordType::alloc), std::size_t{kN});
  if (!kSanitized) EXPECT_LT(ns, 2000.0);
}

TEST(RecorderPerf, RecordSixteenThreads) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kThreads = 16, kN = 100'000;
  std::vector<std::thread> ts;
  std::vector<double> per(kThreads);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t, &per] {
      auto s = std::chrono::steady_clock::now();
      for (int i = 0; i < kN; ++i) d::record(alloc_rec((std::uint64_t(t) << 32) | i));
      per[t] = ns_since(s, kN);
    });
  for (auto& th : ts) th.join();
  double wall = ns_since(t0, double(kThreads) * kN);
  d::recorder_stop(f::EndReason::stopped);
  double avg = 0;
  for (double x : per) avg += x / kThreads;
  std::printf(
      "[          ] record(): 16 threads on %u cores: %.1f ns wall per record (all threads), "
      "%.1f ns per call as seen by a thread\n",
      std::thread::hardware_concurrency(), wall, avg);
  EXPECT_EQ(read_trace(d::recorder_path()).count(f::RecordType::alloc), std::size_t{kThreads} * kN);
  if (!kSanitized) EXPECT_LT(wall, 5000.0);
}

TEST(RecorderPerf, CaptureStackThirtyFrames) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  std::uint32_t id = 0;
  double ns = capture_cost_at_depth(26, 200'000, &id);  // + test/gtest frames above
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  int depth = 0;
  for (auto& r : t.records)
    if (r.type == f::RecordType::stack && r.stack.id == id) depth = r.stack.depth;  // warm-up's
  std::printf("[          ] capture_stack + intern: %.1f ns for %d frames\n", ns, depth);
  EXPECT_GE(depth, 30);
  EXPECT_EQ(t.count(f::RecordType::stack), 2u);  // the warm-up call site and the loop's
  if (!kSanitized) EXPECT_LT(ns, 15000.0);
}
