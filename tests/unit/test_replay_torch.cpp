// `gpuheap replay --policy torch` (analyzer/replay/replay_torch.cpp): the PyTorch caching-allocator
// model against hand-computed cases (size classes, segment sizes, splitting, oversize blocks,
// per-stream pools, release-and-retry), then through replay_trace and the CLI.
#include <gtest/gtest.h>

#include <string>

#include "analyzer/base/error.h"
#include "analyzer/replay/replay.h"
#include "analyzer/replay/replay_torch.h"
#include "tests/unit/test_analyzer_util.h"

using namespace gpuheap;
using gpuheap::test::TraceBuilder;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// A driver with a cap that counts what it holds; addresses are 2 MiB apart at least.
class CapUpstream final : public pool::Upstream {
 public:
  explicit CapUpstream(std::uint64_t cap = 0) : cap_(cap) {}
  void* allocate(std::size_t n) noexcept override {
    if (cap_ && held + n > cap_) return nullptr;
    held += n, ++mallocs;
    std::uint64_t a = next_;
    next_ += (n + (2 * MiB) - 1) / (2 * MiB) * (2 * MiB);
    return reinterpret_cast<void*>(a);
  }
  void deallocate(void* /*p*/, std::size_t n) noexcept override { held -= n, ++frees; }
  Fence fence_record() noexcept override { return 0; }
  bool fence_done(Fence /*f*/) noexcept override { return true; }
  void fence_wait(Fence /*f*/) noexcept override {}
  void fence_release(Fence /*f*/) noexcept override {}
  std::uint64_t now_ns() noexcept override { return 0; }
  std::uint64_t held = 0;
  int mallocs = 0, frees = 0;

 private:
  std::uint64_t cap_, next_ = std::uint64_t{1} << 40;
};

struct Got {
  std::uint64_t ptr = 0, size = 0;
};
Got take(TorchAllocator& t, std::uint64_t n, std::uint64_t stream = 0) {
  Got g;
  EXPECT_TRUE(t.allocate(n, stream, &g.ptr, &g.size)) << n;
  return g;
}
TorchConfig split_at(std::uint64_t max_split) {
  TorchConfig c;
  c.max_split_size = max_split;
  return c;
}
}  // namespace

TEST(ReplayTorch, SizeClasses) {
  CapUpstream up;
  TorchAllocator t(up, {}, nullptr);
  EXPECT_EQ(t.round_size(1), 512u);
  EXPECT_EQ(t.round_size(1200), 1536u);
  EXPECT_EQ(t.round_size(9000), 9216u);
  TorchConfig c;
  c.roundup_power2_divisions = 4;  // [8192, 16384) in steps of 2048
  TorchAllocator p2(up, c, nullptr);
  EXPECT_EQ(p2.round_size(9000), 10240u);
  EXPECT_EQ(p2.round_size(1200), 1536u);  // at most 512 x 4: plain 512 B rounding
  EXPECT_EQ(p2.round_size(8192), 8192u);
  EXPECT_EQ(TorchAllocator::allocation_size(MiB), 2 * MiB);
  EXPECT_EQ(TorchAllocator::allocation_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(TorchAllocator::allocation_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(TorchAllocator::allocation_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(TorchAllocator::allocation_size(11 * MiB + 512), 12 * MiB);
}

TEST(ReplayTorch, SmallPoolSplitsAndMerges) {
  CapUpstream up;
  TorchAllocator t(up, {}, nullptr);
  Got a = take(t, 1000), b = take(t, 1000);
  EXPECT_EQ(up.held, 2 * MiB);  // one 2 MiB small segment
  EXPECT_EQ(a.size, 1024u);
  EXPECT_EQ(b.ptr, a.ptr + 1024);  // the low part of the free remainder
  EXPECT_EQ(t.largest_free(), 2 * MiB - 2048);
  EXPECT_EQ(t.deallocate(a.ptr), 1024u);
  t.empty_cache();  // b still lives in the segment: nothing goes back
  EXPECT_EQ(up.held, 2 * MiB);
  EXPECT_EQ(t.deallocate(b.ptr), 1024u);
  EXPECT_EQ(t.largest_free(), 2 * MiB);  // merged with both neighbours
  t.empty_cache();
  EXPECT_EQ(up.held, 0u);
  EXPECT_EQ(t.largest_free(), 0u);
  EXPECT_EQ(t.deallocate(b.ptr), 0u);  // no longer a block
}

TEST(ReplayTorch, LargePoolSplitOnlyAboveOneMiB) {
  CapUpstream up;
  TorchAllocator t(up, {}, nullptr);
  Got a = take(t, 5 * MiB);  // 20 MiB segment, 15 MiB remain (> 1 MiB: split)
  EXPECT_EQ(up.held, 20 * MiB);
  EXPECT_EQ(a.size, 5 * MiB);
  Got b = take(t, 14 * MiB + 512 * 1024);  // best fit: the 15 MiB rest; 0.5 MiB left: not split
  EXPECT_EQ(up.held, 20 * MiB);
  EXPECT_EQ(b.ptr, a.ptr + 5 * MiB);
  EXPECT_EQ(b.size, 15 * MiB);
  Got c = take(t, 30 * MiB + 1);  // own segment rounded to 32 MiB; the ~2 MiB rest is split off
  EXPECT_EQ(up.held, 52 * MiB);
  EXPECT_EQ(c.size, 30 * MiB + 512);
  t.deallocate(c.ptr);  // merges with its rest again
  EXPECT_EQ(t.largest_free(), 32 * MiB);
  Got d = take(t, 12 * MiB);  // takes the cached 32 MiB block and splits it (20 MiB rest)
  EXPECT_EQ(d.ptr, c.ptr);
  EXPECT_EQ(d.size, 12 * MiB);
  EXPECT_EQ(up.held, 52 * MiB);
}

TEST(ReplayTorch, OversizeBlocksFollowMaxSplitSize) {
  CapUpstream up;
  TorchAllocator t(up, split_at(32 * MiB), nullptr);
  Got big = take(t, 40 * MiB);
  t.deallocate(big.ptr);
  Got small = take(t, 5 * MiB);  // < max_split never takes an oversize block: new 20 MiB
  EXPECT_NE(small.ptr, big.ptr);
  EXPECT_EQ(up.held, 60 * MiB);
  Got over = take(t, 36 * MiB);  // oversize, 40 < 36 + 20: taken whole, not split
  EXPECT_EQ(over.ptr, big.ptr);
  EXPECT_EQ(over.size, 40 * MiB);
  t.deallocate(over.ptr);
  Got huge = take(t, 100 * MiB);
  t.deallocate(huge.ptr);
  Got mid = take(t, 34 * MiB);  // the 40 MiB block fits best (100 >= 34 + 20 would not be taken)
  EXPECT_EQ(mid.ptr, big.ptr);
  t.deallocate(mid.ptr);
  Got mid2 = take(t, 41 * MiB);  // only the 100 MiB block is big enough, and it wastes too much
  EXPECT_NE(mid2.ptr, huge.ptr);
  EXPECT_EQ(mid2.size, 42 * MiB);
  EXPECT_EQ(up.held, (40 + 20 + 100 + 42) * MiB);
}

TEST(ReplayTorch, PoolsArePerStream) {
  CapUpstream up;
  TorchAllocator t(up, {}, nullptr);
  Got a = take(t, 5 * MiB, 1);
  t.deallocate(a.ptr);
  Got b = take(t, 5 * MiB, 2);  // stream 1's cached segment is not stream 2's
  EXPECT_EQ(up.held, 40 * MiB);
  Got c = take(t, 5 * MiB, 1);
  EXPECT_EQ(c.ptr, a.ptr);
  EXPECT_NE(b.ptr, a.ptr);
}

TEST(ReplayTorch, OutOfMemoryReleasesCachedSegmentsAndRetries) {
  CapUpstream up(24 * MiB);
  TorchAllocator t(up, {}, nullptr);
  Got a = take(t, 12 * MiB);
  t.deallocate(a.ptr);
  Got b = take(t, 14 * MiB);  // 12 + 14 > 24: the cached 12 MiB segment is freed, then retry
  EXPECT_EQ(b.size, 14 * MiB);
  EXPECT_EQ(up.held, 14 * MiB);
  EXPECT_EQ(t.retries(), 1u);
  std::uint64_t p = 0, n = 0;
  EXPECT_FALSE(t.allocate(12 * MiB, 0, &p, &n));  // 14 live + 12 > 24 even after releasing
  EXPECT_EQ(t.retries(), 2u);
}

TEST(ReplayTorch, OutOfMemoryFreesOversizeBlocksFirst) {
  CapUpstream up(100 * MiB);
  TorchAllocator t(up, split_at(32 * MiB), nullptr);
  Got a = take(t, 40 * MiB), b = take(t, 40 * MiB), s = take(t, 5 * MiB);
  t.deallocate(a.ptr), t.deallocate(b.ptr), t.deallocate(s.ptr);
  Got c = take(t, 60 * MiB);  // both oversize blocks go (80 >= 60), no full retry
  EXPECT_EQ(c.size, 60 * MiB);
  EXPECT_EQ(t.retries(), 0u);
  EXPECT_EQ(up.held, 80 * MiB);  // 60 + the cached 20 MiB segment of s
  EXPECT_EQ(up.frees, 2);
}

TEST(ReplayTorch, PolicyParses) {
  EXPECT_EQ(parse_policy("torch").kind, ReplayPolicy::Kind::torch);
  ReplayPolicy p = parse_policy("torch:max_split_size=64MiB,roundup_power2_divisions=4,expandable_segments=false");
  EXPECT_EQ(p.torch.max_split_size, 64 * MiB);
  EXPECT_EQ(p.torch.roundup_power2_divisions, 4u);
  EXPECT_EQ(parse_policy("torch:max_split_size_mb:128").torch.max_split_size, 128 * MiB);
  EXPECT_THROW(parse_policy("torch:max_split_size=20MiB"), UsageError);
  EXPECT_THROW(parse_policy("torch:expandable_segments=true"), UsageError);
  EXPECT_THROW(parse_policy("torch:roundup_power2_divisions=3"), UsageError);
  EXPECT_THROW(parse_policy("torch:garbage_collection_threshold=0.5"), UsageError);
  EXPECT_THROW(parse_policy("torchy"), UsageError);
}

// Through replay_trace: per-stream pools, immediate reuse on free (stream-ordered, no wait for
// free_completed), and the report's figures.
TEST(ReplayTorch, ReplaysATrace) {
  constexpr std::uint64_t kA = 0x7f0000000000, kB = 0x7f0010000000, kC = 0x7f0020000000;
  TraceBuilder b;
  b.alloc(kA, 5 * MiB, 5 * MiB, 0, format::AllocKind::device_passthrough, 0, 1, 0, 7);
  b.free(kA, format::AllocKind::device_passthrough);
  b.alloc(kB, 5 * MiB, 5 * MiB, 0, format::AllocKind::device_passthrough, 0, 1, 0, 7);  // reuses kA's
  b.alloc(kC, 1000, 1000, 0, format::AllocKind::device_passthrough, 0, 1, 0, 8);        // small, stream 8
  b.end();
  ReplayOptions o;
  o.policy = parse_policy("torch");
  ReplayResult r = replay_trace(b.write("replay_torch_trace.gh"), o);
  ASSERT_EQ(r.devices.size(), 1u);
  const ReplayDevice& d = r.devices[0];
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(22 * MiB));
  EXPECT_EQ(d.allocated.peak, static_cast<std::int64_t>(5 * MiB + 1024));
  EXPECT_EQ(d.requested.peak, static_cast<std::int64_t>(5 * MiB + 1000));
  EXPECT_EQ(d.segments_at_peak, 2u);
  EXPECT_EQ(d.non_releasable_at_peak, 22 * MiB - 5 * MiB - 1024);
  EXPECT_EQ(d.largest_free_at_peak, 15 * MiB);
  o.limit = 21 * MiB;  // the small segment no longer fits
  ReplayResult oom = replay_trace(b.write("replay_torch_trace.gh"), o);
  EXPECT_TRUE(oom.oom.hit);
  EXPECT_EQ(oom.oom.requested, 1000u);
  EXPECT_EQ(oom.devices.at(0).retries, 1u);
}

// A NO_CACHING trace also holds cudaMallocs that torch's allocator never makes (cuBLAS's
// workspaces from cublasCreate): the model serves only those whose first frame outside
// gpuheap and the CUDA runtime is in libc10_cuda, by the trace's module ranges; the others go
// straight to the driver, outside the reserved figure but inside the limit.
namespace {
TraceBuilder library_trace(bool with_c10) {
  constexpr std::uint64_t kA = 0x7f0000000000, kW1 = 0x7f0010000000, kW2 = 0x7f0020000000, kC = 0x7f0030000000,
                          kD = 0x7f0040000000;
  TraceBuilder b;
  b.module(0x1000, 0x2000, "/opt/gpuheap/lib/libgpuheap.so");
  b.module(0x3000, 0x4000, "/venv/nvidia/cu13/lib/libcudart.so.13");
  if (with_c10) b.module(0x10000, 0x20000, "/venv/torch/lib/libc10_cuda.so");
  b.module(0x30000, 0x40000, "/venv/nvidia/cu13/lib/libcublas.so.13");
  b.module(0x50000, 0x60000, "/venv/torch/lib/libtorch_cpu.so");
  b.stack(1, {0x1100, 0x10100, 0x50100});           // the caching allocator's cudaMalloc
  b.stack(2, {0x1100, 0x30100, 0x30200, 0x50100});  // cuBLAS's own, called from torch
  b.stack(3, {0x1100, 0x3100, 0x10100});            // through the runtime, from c10
  b.stack(4, {0x1100, 0x99000});                    // in no recorded module: cannot tell
  b.alloc(kA, 5 * MiB, 5 * MiB, 1);
  b.alloc(kW1, 32 * MiB, 32 * MiB, 2);
  b.alloc(kW2, 1000, 1024, 2);
  b.alloc(kC, 1000, 1024, 3);
  b.alloc(kD, 16 * MiB, 16 * MiB, 4);  // more than A's free 15 MiB: a segment of its own
  b.free(kW2);
  b.completed(kW2);
  b.end();
  return b;
}
}  // namespace

TEST(ReplayTorch, LibraryAllocationsBypassTheModel) {
  ReplayOptions o;
  o.policy = parse_policy("torch");
  ReplayResult r = replay_trace(library_trace(true).write("torch_bypass.gh"), o);
  ASSERT_EQ(r.devices.size(), 1u);
  const ReplayDevice& d = r.devices[0];
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>((20 + 2 + 16) * MiB));  // A's, C's and D's segments
  EXPECT_EQ(d.requested.peak, static_cast<std::int64_t>(21 * MiB + 1000));
  EXPECT_EQ(d.bypass_allocations, 2u);
  EXPECT_EQ(d.bypass_bytes, 34 * MiB);  // 32 MiB, and 1000 B in a 2 MiB driver granule
  EXPECT_EQ(d.bypass_peak, 34 * MiB);
  EXPECT_EQ(d.peak_held, 72 * MiB);
  EXPECT_NE(replay_text(r).find("not served by torch's allocator"), std::string::npos);
  EXPECT_EQ(replay_json(r)["devices"][0]["bypass_bytes"], 34 * MiB);
  // They still count toward the limit: 20 + 34 + 2 held, D's 16 MiB does not fit in 60.
  o.limit = 60 * MiB;
  ReplayResult oom = replay_trace(library_trace(true).write("torch_bypass.gh"), o);
  ASSERT_TRUE(oom.oom.hit);
  EXPECT_EQ(oom.oom.requested, 16 * MiB);
  // The gpuheap policy serves everything, as the recorded pool did.
  ReplayResult pool = replay_trace(library_trace(true).write("torch_bypass.gh"), ReplayOptions{});
  EXPECT_EQ(pool.devices.at(0).bypass_allocations, 0u);
  EXPECT_EQ(pool.devices.at(0).reserved.peak, static_cast<std::int64_t>((20 + 32 + 2 + 16) * MiB));
}

// A trace that never loaded libc10_cuda is no PyTorch job: the model serves every cudaMalloc.
TEST(ReplayTorch, WithoutLibc10CudaEveryAllocationIsServed) {
  ReplayOptions o;
  o.policy = parse_policy("torch");
  ReplayResult r = replay_trace(library_trace(false).write("torch_nobypass.gh"), o);
  const ReplayDevice& d = r.devices.at(0);
  EXPECT_EQ(d.bypass_allocations, 0u);
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>((20 + 32 + 2 + 16) * MiB));  // W2 shares C's small segment
}
