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

// A training step allocates from a few hundred call paths, each repeated every step: 2^7 = 128
// distinct stacks of the same depth, taken in turn (bit k of `path` picks one of two callees
// at level k), so a per-thread stack cache smaller than the set of paths misses every time.
template <int N>
__attribute__((noinline)) void fork_a(std::size_t bytes, unsigned path, benchmark::State& st);
template <int N>
__attribute__((noinline)) void fork_b(std::size_t bytes, unsigned path, benchmark::State& st);
template <int N>
void fork(std::size_t bytes, unsigned path, benchmark::State& st) {
  if constexpr (N == 0) {
    deep<19>(bytes, st);
  } else {
    if (path & 1) fork_a<N - 1>(bytes, path >> 1, st);
    else fork_b<N - 1>(bytes, path >> 1, st);
  }
}
template <int N>
void fork_a(std::size_t bytes, unsigned path, benchmark::State& st) {
  fork<N>(bytes, path, st);
  benchmark::DoNotOptimize(path + 1);  // bodies that differ: identical ones may be folded into one
}
template <int N>
void fork_b(std::size_t bytes, unsigned path, benchmark::State& st) {
  fork<N>(bytes, path, st);
  benchmark::DoNotOptimize(path + 2);
}

void BM_alloc_free_pair_paths(benchmark::State& st) {
  cudaFree(nullptr);
  const auto paths = static_cast<unsigned>(st.range(0));
  unsigned i = 0;
  for (auto _ : st) fork<7>(4096, i++ % paths, st);
  st.SetItemsProcessed(st.iterations());
}

void BM_alloc_free_pair(benchmark::State& st) {
  cudaFree(nullptr);
  const auto bytes = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) deep<26>(bytes, st);
  st.SetItemsProcessed(st.iterations());
}

}  // namespace

BENCHMARK(BM_alloc_free_pair)->Arg(4096)->Arg(1 << 20)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_alloc_free_pair_paths)->Arg(1)->Arg(16)->Arg(128)->Threads(1)->UseRealTime();
BENCHMARK_MAIN();
