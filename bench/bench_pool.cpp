// Pool hot path: one allocate + deallocate pair on the host upstream (fences complete at
// once, real clock), as the preload's cudaMalloc/cudaFree would drive it. The multi-threaded
// variants share one Pool, as the preload shares one Pool per device.
#include <benchmark/benchmark.h>

#include "pool/pool.h"
#include "tests/unit/pool_upstreams.h"

namespace {

using gpuheap::pool::Pool;
using gpuheap::pool::PoolBlock;
using gpuheap::pool::PoolStatus;

Pool* shared_pool() {
  static gpuheap::test::HostUpstream upstream;
  static Pool pool(upstream);  // thread-safe static init; lives for the whole run
  return &pool;
}

void BM_AllocFreePair(benchmark::State& state) {
  Pool* g_pool = shared_pool();
  const auto bytes = static_cast<std::size_t>(state.range(0));
  // Keep a few blocks live so the pool is not trivially a single free block.
  PoolBlock keep[8];
  bool ok = true;
  for (auto& k : keep) ok &= g_pool->allocate(bytes, &k) == PoolStatus::ok;
  for (auto _ : state) {
    PoolBlock b;
    if (g_pool->allocate(bytes, &b) != PoolStatus::ok || !g_pool->deallocate(b.ptr)) ok = false;
    benchmark::DoNotOptimize(b.ptr);
  }
  for (auto& k : keep) g_pool->deallocate(k.ptr);
  state.SetItemsProcessed(state.iterations());
  if (!ok) state.SkipWithError("pool allocation failed");
  if (state.thread_index() == 0) {
    state.counters["segments"] = static_cast<double>(g_pool->stats().segments);
  }
}

}  // namespace

BENCHMARK(BM_AllocFreePair)->Arg(4 << 10)->Arg(64 << 10)->Threads(1)->UseRealTime();
BENCHMARK(BM_AllocFreePair)->Arg(4 << 10)->Arg(64 << 10)->Threads(16)->UseRealTime();

BENCHMARK_MAIN();
