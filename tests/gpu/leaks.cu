// Plain CUDA C++ allocation test: every cudaMalloc is counted here and two buffers are leaked on
// purpose at the lines marked LEAK-SITE, so a trace can be checked for the allocation count and
// for leak reports naming those source lines. Built twice by scripts: nvcc's default (static
// cudart: allocations reach gpuheap through its driver hooks) and -cudart shared (runtime hooks).
#include <cuda_runtime.h>
#include <cstdio>

static int g_allocs = 0;

__global__ void fill(float* p, size_t n, float v) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = v;
}

__attribute__((noinline)) static float* make_weights(size_t n) {
  float* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) return nullptr;  // LEAK-SITE
  ++g_allocs;
  return p;
}

__attribute__((noinline)) static float* make_scratch(size_t n) {
  float* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) return nullptr;
  ++g_allocs;
  return p;
}

int main() {
  float* w1 = make_weights(1 << 20);
  float* w2 = make_weights(3 << 18);
  for (int i = 0; i < 100; ++i) {
    size_t n = size_t(1000 + 977 * i);
    float* s = make_scratch(n);
    if (!s) return 1;
    fill<<<unsigned((n + 255) / 256), 256>>>(s, n, float(i));
    cudaFree(s);
  }
  fill<<<4096, 256>>>(w1, 1 << 20, 1.f);
  fill<<<3072, 256>>>(w2, 3 << 18, 2.f);
  cudaError_t rc = cudaDeviceSynchronize();
  std::printf("{\"allocs\": %d, \"leaked\": 2, \"sync\": \"%s\"}\n", g_allocs, cudaGetErrorName(rc));
  return rc == cudaSuccess ? 0 : 1;  // w1, w2 leaked on purpose
}
