// N threads x M cudaMalloc/cudaFree pairs of varied sizes, some held across iterations.
//   prog_threads THREADS ITERS    (prints the number of successful pairs)
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 16;
  long iters = argc > 2 ? std::atol(argv[2]) : 100000;
  std::atomic<long> failures{0};
  cudaFree(nullptr);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      static const std::size_t sizes[] = {256, 4096, 65536, 700000, 3u << 20};
      void* held[4] = {};
      unsigned x = 2654435761u * static_cast<unsigned>(t + 1);
      for (long i = 0; i < iters; ++i) {
        x = x * 1664525u + 1013904223u;
        void* p = nullptr;
        if (cudaMalloc(&p, sizes[(x >> 8) % 5]) != cudaSuccess) {
          failures++;
          continue;
        }
        // Keep some blocks alive a while so frees and allocations interleave across threads.
        void*& slot = held[(x >> 16) & 3];
        if (slot && cudaFree(slot) != cudaSuccess) failures++;
        slot = p;
      }
      for (void* p : held)
        if (p && cudaFree(p) != cudaSuccess) failures++;
    });
  }
  for (auto& th : pool) th.join();
  std::printf("%ld\n", threads * iters - failures.load());
  return failures.load() == 0 ? 0 : 1;
}
