// Stream safety on hardware. Each iteration: a kernel on stream A waits ~spin_us, then reads
// buffer X (checksum into `sums`) and writes pattern A into it; right after launching it, the host
// calls cudaFree(X) (legal: cudaFree waits for earlier work) and allocates a buffer Y of the same
// size, which a kernel on stream B fills with pattern B at once. Afterwards Y must hold pattern B
// and A's checksum must be X's original one. A pool that hands X's block out as Y before A's
// kernel is done corrupts both; gpuheap's pool must never do so, and GPUHEAP_UNSAFE_REUSE=1
// (test-only: reuse without fences) must make this program see corruption.
//   stream_safety [iterations] [spin_us]  -> one JSON line; exit 0 when no corruption
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void stream_a(unsigned* x, size_t n, unsigned expect, long long spin_cycles, unsigned long long* bad) {
  long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    if (x[i] != expect) atomicAdd(bad, 1ull);  // someone else wrote X while A still used it
    x[i] = 0xAAAAAAAAu;
  }
}
__global__ void fill(unsigned* p, size_t n, unsigned v) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void count_not(const unsigned* p, size_t n, unsigned v, unsigned long long* bad) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n && p[i] != v) atomicAdd(bad, 1ull);
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 300;
  int spin_us = argc > 2 ? std::atoi(argv[2]) : 200;
  int clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0) != cudaSuccess || clock_khz <= 0)
    clock_khz = 1980000;  // H100/H200 boost clock: only the spin length depends on it
  long long spin = (long long)clock_khz * spin_us / 1000;
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  unsigned long long *bad_a, *bad_y;
  cudaMalloc(&bad_a, sizeof *bad_a);
  cudaMalloc(&bad_y, sizeof *bad_y);
  cudaMemset(bad_a, 0, sizeof *bad_a);
  cudaMemset(bad_y, 0, sizeof *bad_y);
  std::vector<unsigned*> ys;
  long same_address = 0;
  for (int it = 0; it < iters; ++it) {
    size_t n = size_t(1 << 16) + size_t(it % 7) * 4096;  // 256 KiB..: small-pool and large sizes mixed
    if (it % 3 == 0) n *= 8;
    unsigned *x = nullptr, *y = nullptr;
    if (cudaMalloc(&x, n * 4) != cudaSuccess) return 2;
    unsigned pat = 0x1000u + it;
    fill<<<unsigned((n + 255) / 256), 256, 0, a>>>(x, n, pat);
    stream_a<<<unsigned((n + 255) / 256), 256, 0, a>>>(x, n, pat, spin, bad_a);
    cudaFree(x);
    if (cudaMalloc(&y, n * 4) != cudaSuccess) return 2;
    if (y == x) ++same_address;
    unsigned patb = 0xB0000000u + it;
    fill<<<unsigned((n + 255) / 256), 256, 0, b>>>(y, n, patb);
    cudaStreamSynchronize(b);
    cudaStreamSynchronize(a);
    count_not<<<unsigned((n + 255) / 256), 256, 0, b>>>(y, n, patb, bad_y);
    cudaStreamSynchronize(b);
    cudaFree(y);
  }
  unsigned long long ha = 0, hy = 0;
  cudaError_t rc = cudaDeviceSynchronize();
  cudaMemcpy(&ha, bad_a, sizeof ha, cudaMemcpyDeviceToHost);
  cudaMemcpy(&hy, bad_y, sizeof hy, cudaMemcpyDeviceToHost);
  std::printf(
      "{\"iterations\": %d, \"spin_us\": %d, \"same_address\": %ld, \"corrupt_reads_a\": %llu, "
      "\"corrupt_words_y\": %llu, \"sync\": \"%s\"}\n",
      iters, spin_us, same_address, ha, hy, cudaGetErrorName(rc));
  return (ha || hy || rc != cudaSuccess) ? 1 : 0;
}
