// A long run for the rolling window (`gpuheap run --aggregate`, test_window.cpp): a clear peak,
// a leak and an allocation that fails (out of memory) early, then many steps of short-lived
// allocations from a few sites.
//   prog_window STEPS [hang]   with `hang`: print "ready" (flushed) after the steps and sleep
//                              until killed, the kept blocks still live.
// Exits 10 when a CUDA call fails.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// One call site each: the stacks (and so the sites) differ.
__attribute__((noinline)) void* big(std::size_t mib) {
  void* p = nullptr;
  return cudaMalloc(&p, mib << 20) == cudaSuccess ? p : nullptr;
}
__attribute__((noinline)) void* leaked() {
  void* p = nullptr;
  return cudaMalloc(&p, 3u << 20) == cudaSuccess ? p : nullptr;
}
__attribute__((noinline)) void* step_a(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
}
__attribute__((noinline)) void* step_b(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const long steps = std::strtol(argv[1], nullptr, 10);
  const bool hang = argc > 2 && std::strcmp(argv[2], "hang") == 0;
  void* peak[12];
  for (int i = 0; i < 12; ++i)
    if (!(peak[i] = big(static_cast<std::size_t>(i) + 1))) return 10;
  if (!leaked()) return 10;
  void* huge = nullptr;  // more than any device has: an oom record
  if (cudaMalloc(&huge, std::size_t{1} << 50) == cudaSuccess) return 10;
  for (int i = 2; i < 12; ++i)  // two stay live until the end: in the peak and at the end
    if (cudaFree(peak[i]) != cudaSuccess) return 10;
  for (long s = 0; s < steps; ++s) {
    void* a = step_a(4096u * (1 + s % 7));
    void* b = step_b(512u * (1 + s % 5));
    if (!a || !b || cudaFree(a) != cudaSuccess || cudaFree(b) != cudaSuccess) return 10;
  }
  if (hang) {
    std::printf("ready\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  return cudaFree(peak[0]) == cudaSuccess && cudaFree(peak[1]) == cudaSuccess ? 0 : 10;
}
