// Out of memory on the real card: allocate 8 GiB chunks, give two back (the pool now caches
// them), then keep allocating 12 GiB chunks (too large for those cached blocks) until cudaMalloc
// fails. Under gpuheap the pool must release its cache and retry before failing, and the program
// must receive cudaErrorMemoryAllocation.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

__attribute__((noinline)) static cudaError_t grab_chunk(void** p, size_t n) {
  return cudaMalloc(p, n);  // OOM-SITE
}

int main() {
  const size_t gib = size_t(1) << 30;
  std::vector<void*> held;
  cudaError_t rc = cudaSuccess;
  for (int i = 0; i < 64; ++i) {
    void* p = nullptr;
    rc = grab_chunk(&p, (i < 4 ? 8 : 12) * gib);  // OOM-CALL; later asks do not fit cached 8 GiB blocks
    if (rc != cudaSuccess) break;
    held.push_back(p);
    if (i == 3) {  // free two: cached by a pool, reusable only after a release + retry for larger asks
      cudaFree(held[0]);
      cudaFree(held[1]);
      held.erase(held.begin(), held.begin() + 2);
    }
  }
  cudaError_t last = cudaGetLastError();  // a failed cudaMalloc is not sticky
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  std::
      printf("{\"error\": \"%s\", \"held_chunks\": %zu, \"last_error_after\": \"%s\", \"free\": %zu, \"total\": %zu}\n",
             cudaGetErrorName(rc), held.size(), cudaGetErrorName(cudaGetLastError()), free_b, total_b);
  (void)last;
  for (void* p : held) cudaFree(p);
  return rc == cudaErrorMemoryAllocation ? 0 : 1;
}
