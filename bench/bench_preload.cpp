// cudaMalloc+cudaFree pairs through whatever CUDA the process loads: run it under
// `gpuheap run --simulate` (or LD_PRELOAD=build/libgpuheap.so) to measure the preload's cost,
// with GPUHEAP_POOL / GPUHEAP_STACKS varied by scripts/bench-preload.sh. The pair is issued
// from the bottom of a ~30-frame call chain so stack unwinding costs what it would in a
// framework (PyTorch's allocation stacks are ~36 frames).
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdlib>

namespace {

template <int N>
__attribute__((noinline)) void deep(std::size_t bytes, benchmark::State& st) {
  if constexpr (N == 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaFree(p) != cudaSuccess) st.SkipWithError("CUDA call failed");
    benchmark::DoNotOptimize(p);
  } else {
    deep<N - 1>(bytes, st);
    benchmark::ClobberMemory();  // keeps the frames from being turned into a loop
  }
}

void BM_alloc_free_pair(benchmark::State& st) {
  cudaFree(nullptr);
  const auto bytes = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) deep<26>(bytes, st);
  st.SetItemsProcessed(st.iterations());
}

}  // namespace

BENCHMARK(BM_alloc_free_pair)->Arg(4096)->Arg(1 << 20)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK_MAIN();
