// GPUHEAP_LIMIT, cudaMemGetInfo inside the cap, OOM records and reports, cache control.
#include <gtest/gtest.h>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using gpuheap::format::AllocKind;
using gpuheap::format::EmptyCacheReason;
using namespace gpuheap::test;

namespace {
constexpr std::uint64_t MiB = 1u << 20;
}

TEST(Limits, CapEnforcedForPooledAndPassThroughWithExactMemInfo) {
  ProgRun r = run("prog_limit", {"cap"}, {"GPUHEAP_LIMIT=64MiB", "SIMCUDA_TOTAL_MEMORY=1G"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("gpuheap: CUDA out of memory. Tried to allocate 10.00 MiB (cudaMalloc) on device 0"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("cap 64.00 MiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("per-process cap GPUHEAP_LIMIT"), std::string::npos) << r.err;
  // The six live 10 MiB blocks come from one call site in the program.
  EXPECT_NE(r.err.find("top live allocation sites on device 0:\ngpuheap:     #1 60.00 MiB in 6 allocations"),
            std::string::npos)
      << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.ooms.size(), 2u);
  EXPECT_EQ(t.ooms[0].requested, 10 * MiB);
  EXPECT_EQ(t.ooms[0].limit, 64 * MiB);
  EXPECT_EQ(t.ooms[0].kind, AllocKind::device_pooled);
  EXPECT_EQ(t.ooms[0].reserved, 60 * MiB);
  EXPECT_EQ(t.ooms[1].kind, AllocKind::managed);
  EXPECT_GE(t.retries.size(), 1u);  // the pool retried after releasing its cache
  std::size_t api = 0, retry = 0;
  for (auto& e : t.empty_caches) {
    api += e.reason == EmptyCacheReason::api && e.released == 40 * MiB;
    retry += e.reason == EmptyCacheReason::oom_retry;
  }
  EXPECT_EQ(api, 1u);
  EXPECT_GE(retry, 1u);
}

TEST(Limits, FractionAndPerDevice) {
  EXPECT_EQ(run("prog_limit", {"fraction"}, {"GPUHEAP_LIMIT=0.25", "SIMCUDA_TOTAL_MEMORY=256M"}).status, 0);
  ProgRun r = run("prog_limit", {"perdevice"}, {"GPUHEAP_LIMIT=0:32MiB", "SIMCUDA_DEVICE_COUNT=2"});
  EXPECT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  ASSERT_EQ(t.count_allocs(AllocKind::device_pooled), 1u);
  EXPECT_EQ(t.allocs[0].device, 1);
  ASSERT_EQ(t.frees.size(), 1u);
  EXPECT_EQ(t.frees[0].device, 1);  // looked up by pointer, not by the current device
}

TEST(Limits, ReleaseThresholdTrimsTheCache) {
  ProgRun r = run("prog_limit", {"threshold"}, {"GPUHEAP_RELEASE_THRESHOLD=1"});
  ASSERT_EQ(r.status, 0) << r.err;
  TraceFile t = load_trace(r.traces.at(0));
  std::size_t n = 0;
  for (auto& e : t.empty_caches) n += e.reason == EmptyCacheReason::threshold;
  EXPECT_GE(n, 1u);
  EXPECT_GE(t.segment_frees.size(), 1u);
}

TEST(Limits, InvalidSpecWarnsAndDoesNotCap) {
  ProgRun r = run("prog_limit", {"uncapped"}, {"GPUHEAP_LIMIT=lots", "SIMCUDA_TOTAL_MEMORY=256M"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.err.find("GPUHEAP_LIMIT is not valid"), std::string::npos);
}
